"""Issue 19 done: a tenant's own tokenizer and data, qwen3-tiny on a 2 x 2 mesh, resumed on another, consolidated.

Everything runs for real: the tokenizer is a byte-level BPE trained here with
``tokenizers``' own trainer (nothing is downloaded), the data is prepared with
``cantata data prepare --tokenizer``, the job trains through the SDK on a
real server over TLS with four gloo worker processes, its checkpoints are
sharded by every rank and sealed, and the download is consolidated on the
client into one ``safetensors`` file, and into a Hugging Face folder that
transformers loads with the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.sealed_checkpoint import SHARDED_PART, read_manifest, read_shard_bytes
from cantata.storage import open_store
from cantata.trainer.data import TextTokenizer
from cantata.trainer.model import build_model
from cantata.trainer.sealed_dcp import consolidate
from testkit.platform import cli, readable

OPTIMIZER = "muon"  # Canzona on DTensor over the 2 x 2 mesh, resumed on 4 x 1
MODEL = "qwen3-tiny"
SMALL = dict(batch_size=4, seq_len=32, eval_batches=1, grad_clip=1.0)


@pytest.fixture(scope="module")
def tokenizer_and_data(platform, tmp_path_factory) -> tuple[Path, str]:
    """The tenant's BPE tokenizer (trained here) and its data prepared with it, in the tenant's folder."""
    text = tmp_path_factory.mktemp("text")
    written = 0
    for index, path in enumerate(sorted(Path(json.__file__).parent.parent.glob("*.py"))):
        body = path.read_text(errors="ignore")
        (text / f"{index:04d}.txt").write_text(body)
        written += len(body)
        if written > 60_000:
            break
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((p.read_text() for p in sorted(text.iterdir())), trainer=trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    out = platform.tenant_dir("acme", "datasets") / "own"
    cli("data", "prepare", str(text), "--out", str(out), "--tokenizer", str(path), "--shard-tokens", "4000", "--json")
    return path, readable(out).as_uri()


def test_a_tenant_trains_its_model_on_a_mesh_resumes_it_on_another_and_downloads_it_consolidated(
    platform, tenant, tokenizer_and_data, tmp_path
):
    tokenizer_file, dataset = tokenizer_and_data
    record = TextTokenizer.from_file(tokenizer_file).record
    job = Job(
        name="own-model",
        model=MODEL,
        optimizer=OPTIMIZER,
        dataset=dataset,
        tokenizer=record.name,
        tokenizer_vocab=record.vocab_size,
        workers=4,
        dp_shard=2,
        tp=2,
        steps=4,
        eval_every=4,
        checkpoint_every=4,
        **SMALL,
    )
    handle = tenant.submit(job)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    with pytest.raises(errors.InvalidArgument, match="consolidate"):  # a sharded checkpoint is not one state dict
        tenant.download_checkpoint(handle.id, None, tmp_path / "model.pt")
    with pytest.raises(errors.Conflict, match="more steps"):  # it finished: resuming needs more steps
        handle.resume(dp_shard=4, tp=1)
    with pytest.raises(errors.InvalidArgument, match="key/value heads"):  # the new mesh is checked as at submit
        handle.resume(tp=4, dp_shard=1, steps=8)

    resumed = handle.resume(workers=4, dp_shard=4, tp=1, steps=8)
    status = resumed.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(resumed.events())
    assert any("resumed from checkpoint at step 4" in event.message for event in events)
    assert [event.step for event in events if event.kind == "CHECKPOINT"] == [4, 8]
    assert tenant.get(handle.id).step == 8

    out = tmp_path / "model"  # the CLI, as a tenant runs it: no step is the latest
    cli("checkpoints", "download", handle.id, "--consolidate", "--out", str(out), "--profile", "acme", env=platform.env)
    assert json.loads((out / "config.json").read_text())["step"] == 8
    weights = load_file(str(out / "model.safetensors"))  # plain safetensors: no Cantata needed
    shapes = {name: tensor.shape for name, tensor in build_model(MODEL, seed=0).state_dict().items()}
    assert {name: tensor.shape for name, tensor in weights.items()} == shapes

    keys = platform.paths.open_keyring().job_keys("acme", handle.id)  # the last checkpoint, read from its store
    store = open_store(platform.paths.checkpoints.resolve().as_uri())
    where = dict(tenant="acme", job_id=handle.id, step=8, keys=keys)
    listed = {shard.name: shard for shard in read_manifest(store, **where).shards}
    assert sorted(listed) == [f"{SHARDED_PART}.{rank}" for rank in range(4)] + [f"{SHARDED_PART}.metadata"]
    stored = consolidate(lambda name: read_shard_bytes(store, shard=listed[name], **where), SHARDED_PART, "model.")
    assert set(stored) == set(weights)
    for name, tensor in stored.items():
        assert torch.equal(weights[name], tensor), name

    hf = tmp_path / "hf"  # the same shards joined into a folder transformers loads
    cli("checkpoints", "download", handle.id, "--format", "hf", "--consolidate", "--out", str(hf), "--profile", "acme", env=platform.env)  # fmt: skip
    exported = AutoModelForCausalLM.from_pretrained(hf).eval()
    ours = build_model(MODEL, seed=0).eval()
    ours.load_state_dict(weights)
    idx = torch.randint(0, record.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(idx).logits, ours(idx)[0], rtol=0, atol=1e-5)
