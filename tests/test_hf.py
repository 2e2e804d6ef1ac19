"""Hugging Face in and out: a transformers Llama or Qwen3 folder starts a job, the job exports one back.

The Hugging Face models are made here with transformers' own config classes
and random weights (nothing is downloaded), with dimensions written out as a
user's config.json would state them, which must be those of Cantata's
``llama-tiny`` and ``qwen3-tiny``. Every parameter is drawn at random, the
norms off one too, so a tensor mapped to the wrong module shows in the logits.
Through the platform (a real server over TLS, real workers) each folder is
a job's ``init_from``; the job trains, ``cantata checkpoints download
--format hf`` writes a folder that transformers loads, and its logits are
those of the downloaded state dict in Cantata's decoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen3Config

from cantata.proto.vocabulary import BYTE_GPTS, Model
from cantata.sdk.client import checkpoint_config
from cantata.sdk.job import Job
from cantata.trainer.decoder import Decoder
from cantata.trainer.export import write_hf
from cantata.trainer.hf import HFConfigError, check_config, hf_config
from cantata.trainer.model import MODELS, build_model
from cantata.trainer.weights import load_weights, local_weights
from testkit.platform import cli, readable

# What a user's config.json says (transformers' own names), for Cantata's two tiny decoders.
HF_CONFIGS = {
    "qwen3-tiny": lambda: Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "llama-tiny": lambda: LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rope_theta=500_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
}
SHARDED = {"llama-tiny": "200KB", "qwen3-tiny": None}  # the Llama one is saved as shards with an index
SMALL = dict(steps=3, eval_every=3, checkpoint_every=3, batch_size=2, seq_len=32, eval_batches=1, lr=1e-3)


def random_hf_model(name: str, seed: int) -> PreTrainedModel:
    """A transformers model of ``HF_CONFIGS[name]``: matrices ~ N(0, 0.1²), norms ~ 1 + N(0, 0.2²)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(HF_CONFIGS[name]())
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn_like(parameter)
            parameter.copy_(1 + 0.2 * noise if parameter.ndim == 1 else 0.1 * noise)
    return model.eval()


def save_folder(model: PreTrainedModel, folder: Path, name: str) -> Path:
    shard = SHARDED[name]
    options: dict[str, Any] = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **options)
    return folder


def shard_count(folder: Path) -> int:
    """How many safetensors files a saved folder's index names (1 without an index)."""
    index = folder / "model.safetensors.index.json"
    return len(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else 1


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(seed))


def logits_of(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, "logits") else out[0]


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_a_transformers_folder_loads_into_the_decoder_with_its_logits(name, tmp_path):
    hf_model = random_hf_model(name, seed=3)
    folder = save_folder(hf_model, tmp_path / name, name)
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(files) == shard_count(folder) and (len(files) > 1) == bool(SHARDED[name]), files
    save_file({"unknown.weight": torch.zeros(1)}, str(folder / "consolidated.safetensors"))  # not in the index
    ours = build_model(name, seed=1).eval()
    if SHARDED[name]:
        assert load_weights(ours, local_weights(folder)) == len(files)
    else:  # a folder without an index reads every safetensors file in it, the stray one too
        (folder / "consolidated.safetensors").unlink()
        assert load_weights(ours, local_weights(folder)) == 1
    idx = tokens(0)
    torch.testing.assert_close(logits_of(ours, idx), logits_of(hf_model, idx), rtol=0, atol=1e-5)
    with torch.no_grad():  # Meta's interleaved rotary layout instead of the rotate-half one: far off
        for layer in ours.layers:
            q = layer.self_attn.q_proj.weight
            halves = q.view(-1, 2, layer.self_attn.head_dim // 2, q.shape[1])
            q.copy_(halves.transpose(1, 2).reshape(q.shape))
    assert (logits_of(ours, idx) - logits_of(hf_model, idx)).abs().max() > 0.01


def test_a_bfloat16_folder_loads_as_transformers_loads_it_in_float32(tmp_path):
    folder = tmp_path / "bf16"  # as the published checkpoints are stored
    random_hf_model("qwen3-tiny", seed=4).to(torch.bfloat16).save_pretrained(folder)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = build_model("qwen3-tiny", seed=1).eval()
    load_weights(ours, local_weights(folder))
    assert ours.embed_tokens.weight.dtype == torch.float32
    torch.testing.assert_close(logits_of(ours, tokens(2)), logits_of(theirs, tokens(2)), rtol=0, atol=1e-5)


def _with_config(folder: Path, change: dict) -> Path:
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("qwen3-tiny", {"hidden_size": 128}, "hidden_size is 128, the job's model has 64 (dim)"),
        ("qwen3-tiny", {"num_key_value_heads": 4}, "num_key_value_heads is 4, the job's model has 2 (n_kv_heads)"),
        ("qwen3-tiny", {"head_dim": None}, "head_dim is 128, the job's model has 32 (head_dim)"),  # Qwen3's default
        ("qwen3-tiny", {"tie_word_embeddings": False}, "tie_word_embeddings is False, the job's model has True"),
        ("qwen3-tiny", {"rms_norm_eps": 1e-5}, "rms_norm_eps is 1e-05, the job's model has 1e-06 (norm_eps)"),
        ("qwen3-tiny", {"rope_parameters": {"rope_theta": 10000.0}}, "rope_theta is 10000.0, the job's model has"),
        ("qwen3-tiny", {"model_type": "mistral"}, "model_type is 'mistral', the job's model is 'qwen3'"),
        ("qwen3-tiny", {"use_sliding_window": True}, "use_sliding_window is True; Cantata's decoder computes only"),
        ("qwen3-tiny", {"vocab_size": None}, "config.json: no vocab_size"),
        ("qwen3-tiny", {"hidden_size": "64"}, "hidden_size is '64', not a positive whole number"),
        ("llama-tiny", {"hidden_act": "gelu"}, "hidden_act is 'gelu'; Cantata's decoder computes only 'silu'"),
        ("llama-tiny", {"attention_bias": True}, "attention_bias is True; Cantata's decoder computes only False"),
        (
            "llama-tiny",
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}},
            "rope_type is 'llama3'; Cantata's decoder computes only 'default'",
        ),
    ],
)
def test_a_config_json_of_another_model_is_refused_naming_the_field(name, change, message, tmp_path):
    folder = _with_config(save_folder(random_hf_model(name, seed=2), tmp_path / name, name), change)
    with pytest.raises(HFConfigError, match=f"^init_from {folder}/config.json: ") as raised:
        load_weights(build_model(name, seed=1), local_weights(folder))
    assert message in str(raised.value)


def test_a_folder_of_another_family_or_a_broken_index_is_refused(tmp_path):
    qwen = save_folder(random_hf_model("qwen3-tiny", seed=2), tmp_path / "qwen", "qwen3-tiny")
    with pytest.raises(HFConfigError, match="model_type is 'qwen3', the job's model is 'llama'"):
        load_weights(build_model("llama-tiny", seed=1), local_weights(qwen))
    with pytest.raises(HFConfigError, match="model_type is 'qwen3', the job's model is a byte GPT"):
        load_weights(build_model("gpt-tiny", seed=1), local_weights(qwen))
    llama = save_folder(random_hf_model("llama-tiny", seed=2), tmp_path / "llama", "llama-tiny")
    first = sorted(llama.glob("model-*.safetensors"))[0]
    first.unlink()
    with pytest.raises(HFConfigError, match=rf"model\.safetensors\.index\.json names '{first.name}', which is not"):
        load_weights(build_model("llama-tiny", seed=1), local_weights(llama))
    (llama / "config.json").write_text("{not json")
    with pytest.raises(HFConfigError, match=r"config\.json: not JSON"):
        load_weights(build_model("llama-tiny", seed=1), local_weights(llama))


# The transformers-4 layout the published repositories' config.json files have (rope_theta at the top).
PUBLISHED_LAYOUT = {
    Model.QWEN3_0_6B: {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "torch_dtype": "bfloat16",
    },
    Model.LLAMA3_8B: {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    },
}


@pytest.mark.parametrize("model", [m for m in Model if m not in BYTE_GPTS])
def test_every_decoder_exports_a_config_transformers_builds_with_the_same_parameters(model):
    cfg = MODELS[model]
    config = hf_config(cfg, "float32", {"model": str(model)})
    check_config(config, cfg, "exported")
    theirs = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(theirs)
        ours = Decoder(cfg)
    assert type(hf_model).__name__ == config["architectures"][0]
    shapes = {n.removeprefix("model."): tuple(p.shape) for n, p in hf_model.state_dict().items()}
    assert shapes == {n: tuple(p.shape) for n, p in ours.state_dict().items()}
    if model in PUBLISHED_LAYOUT:
        check_config(PUBLISHED_LAYOUT[model], cfg, "published")
        scaled = {**PUBLISHED_LAYOUT[model], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
        with pytest.raises(HFConfigError, match="published: rope_type is 'llama3'"):
            check_config(scaled, cfg, "published")


@pytest.fixture(scope="module")
def folders(platform, tmp_path_factory) -> dict[str, tuple[PreTrainedModel, Path]]:
    """Each tiny transformers model and its folder under the tenant's allowed root."""
    made = {}
    for name in HF_CONFIGS:
        model = random_hf_model(name, seed=11)
        made[name] = (model, readable(save_folder(model, platform.tenant_dir("acme", "hf", name), name)))
    return made


@pytest.fixture(scope="module")
def jobs(tenant, folders):
    """One job per folder, and a Llama job given the Qwen3 folder, submitted together and finished."""
    handles = {
        name: tenant.submit(Job(name=f"from-hf-{name}", model=name, init_from=folder.as_uri(), **SMALL))
        for name, (_, folder) in folders.items()
    }
    handles["wrong"] = tenant.submit(
        Job(name="wrong-family", model="llama-tiny", init_from=folders["qwen3-tiny"][1].as_uri(), **SMALL)
    )
    return {name: (handle, handle.wait()) for name, handle in handles.items()}


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_a_transformers_folder_trains_through_the_platform_and_exports_back(
    platform, tenant, folders, jobs, name, tmp_path
):
    hf_model, folder = folders[name]
    handle, status = jobs[name]
    assert status.state == "SUCCEEDED", status.reason
    assert f"initial weights from {folder}/ ({shard_count(folder)} files)" in [e.message for e in handle.events()]

    env = platform.env
    out = tmp_path / "hf"
    cli("checkpoints", "download", handle.id, "--format", "hf", "--out", str(out), "--profile", "acme", env=env)
    cli("checkpoints", "download", handle.id, "--out", str(tmp_path / "state.pt"), "--profile", "acme", env=env)
    config = json.loads((out / "config.json").read_text())
    assert config["cantata"] == {"architecture": "cantata-decoder", "model": name, "job_id": handle.id, "step": 3}
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(exported) is type(hf_model)
    trained = build_model(name, seed=1).eval()
    trained.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    idx = tokens(1)
    torch.testing.assert_close(logits_of(exported, idx), logits_of(trained, idx), rtol=0, atol=1e-5)

    before, after = hf_model.state_dict(), exported.state_dict()
    moved = max((after[n] - before[n]).abs().max().item() for n in before)
    assert 0 < moved < 0.05, moved  # trained from the folder's weights: changed by three small steps only

    again = build_model(name, seed=2).eval()  # the export is itself a folder init_from takes
    load_weights(again, local_weights(out))
    torch.testing.assert_close(logits_of(again, idx), logits_of(trained, idx), rtol=0, atol=0)


def test_a_job_given_a_folder_of_another_family_fails_naming_the_field(jobs, folders):
    _, status = jobs["wrong"]
    assert status.state == "FAILED"
    assert "HFConfigError" in status.reason
    assert f"{folders['qwen3-tiny'][1]}/config.json: model_type is 'qwen3', the job's model is 'llama'" in status.reason


def test_a_byte_gpt_is_refused_as_a_hugging_face_folder(tmp_path):
    state = tmp_path / "state.pt"
    torch.save(build_model("gpt-tiny", seed=1).state_dict(), state)
    with pytest.raises(ValueError, match="format hf: gpt-tiny is a byte GPT"):
        write_hf(state, tmp_path / "out", checkpoint_config("gpt-tiny", job_id="j", step=1))
    assert not (tmp_path / "out").exists()
