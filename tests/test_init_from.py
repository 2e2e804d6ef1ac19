"""Initial weights from a tenant's store (``init_from: s3://SOURCE@bucket/prefix``, ``az://...``).

A real server over TLS, real workers, a real moto S3 and Azurite: the job
starts from the uploaded weights (its first loss shows them), refuses a
source that is not the tenant's at submit, and fails naming the tensor that
does not fit. The Azure store is read at the trainer level through the same
loader the workers use, a Hugging Face folder's config.json checked there too.
"""

from __future__ import annotations

import json
import math
import uuid

import pytest
import torch
from safetensors.torch import save, save_file

from cantata.sdk import InvalidJob, NotFound
from cantata.sdk.job import Job
from cantata.storage import open_store
from cantata.storage.s3 import S3Store
from cantata.trainer.data import SourceCredentials
from cantata.trainer.data.errors import DataError, DatasetAccessError
from cantata.trainer.hf import HFConfigError, hf_config
from cantata.trainer.model import build_model
from cantata.trainer.weights import WeightsError, load_weights, local_weights, open_weights
from tests.services import AZURITE_ACCOUNT, AZURITE_KEY, azurite_connection_string

MOTO_ACCESS_KEY = "AKIACANTATAINITFROM"
MOTO_SECRET = "moto-init-secret-that-must-never-be-shown"
TINY = dict(model="gpt-tiny", steps=2, eval_every=2, checkpoint_every=2, batch_size=2, seq_len=32, eval_batches=2)
SCALE = 100.0  # the uploaded head's logits are this much larger than a fresh model's: the first loss shows it


def _hf_objects(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """``state`` as two Hugging Face style safetensors objects (``model.``-prefixed names)."""
    names = sorted(state)
    halves = (names[: len(names) // 2], names[len(names) // 2 :])
    return {
        f"model-{i:05d}-of-00002.safetensors": save({f"model.{n}": state[n].clone().contiguous() for n in part})
        for i, part in enumerate(halves)
    }


def _s3_weights(tenant, moto_service, source: str, objects: dict[str, bytes]) -> str:
    """Upload ``objects`` (and a config.json the loader ignores) to a fresh bucket; register ``source`` for it."""
    bucket = f"weights-{uuid.uuid4().hex[:12]}"
    store = open_store(
        f"s3://{bucket}/base",
        endpoint_url=moto_service.endpoint,
        region_name="us-east-1",
        aws_access_key_id=MOTO_ACCESS_KEY,
        aws_secret_access_key=MOTO_SECRET,
    )
    assert isinstance(store, S3Store)
    store.client.create_bucket(Bucket=bucket)
    for key, data in {**objects, "config.json": b"{}"}.items():
        store.put(key, data)
    tenant.register_data_source(
        source,
        kind="s3",
        endpoint=moto_service.endpoint,
        credentials={"access_key_id": MOTO_ACCESS_KEY, "secret_access_key": MOTO_SECRET},
    )
    return f"s3://{source}@{bucket}/base"


def test_a_job_starts_from_weights_in_s3_and_fails_naming_a_tensor_that_does_not_fit(platform, tenant, moto_service):
    state = build_model("gpt-tiny", seed=7).state_dict()
    loud = {name: t * SCALE if name in ("lm_head.weight", "tok_emb.weight") else t for name, t in state.items()}
    good = _s3_weights(tenant, moto_service, "hub", _hf_objects(loud))
    wrong = dict(state, **{"blocks.1.attn.proj.weight": torch.zeros(64, 65)})
    bad = _s3_weights(tenant, moto_service, "hub-bad", _hf_objects(wrong))

    started = tenant.submit(Job(name="from-s3", init_from=good, **TINY))
    refused = tenant.submit(Job(name="wrong-shape", init_from=bad, **TINY))
    status = started.wait()
    assert status.state == "SUCCEEDED", status.reason
    messages = [event.message for event in started.events()]
    bucket = good.partition("@")[2].partition("/")[0]
    assert f"initial weights from s3://{bucket}/base/ (2 files)" in messages
    first = next(event.loss for event in started.events() if event.kind == "PROGRESS")
    assert first > 4 * math.log(256), first  # a fresh gpt-tiny starts near ln(256); the uploaded head is 100x louder

    status = refused.wait()
    assert status.state == "FAILED"
    assert "WeightsError" in status.reason and "model-00000-of-00002.safetensors" in status.reason
    assert "'blocks.1.attn.proj.weight' has shape (64, 65), the model's is (64, 64)" in status.reason

    released = [e for e in tenant.audit_events(action="data_source_released") if e.details.get("job") == started.id]
    assert [(e.resource, e.details["for"]) for e in released] == [("hub", ["init_from"])]
    seen = "\n".join(messages) + "\n".join(line for _, line in started.logs()) + platform.server_log()
    assert MOTO_SECRET not in seen and MOTO_ACCESS_KEY not in seen


def test_init_from_a_store_must_name_a_data_source_of_the_tenant(platform, tenant):
    with pytest.raises(InvalidJob, match=r"init_from: 's3://bucket/weights' names no data source"):
        tenant.submit(Job(name="ambient", init_from="s3://bucket/weights", **TINY))
    with pytest.raises(NotFound, match="init_from: data source 'nowhere' not found"):
        tenant.submit(Job(name="unknown", init_from="az://nowhere@container/weights", **TINY))
    tenant.register_data_source("secret-hub", kind="s3", credentials={"access_key_id": "a", "secret_access_key": "b"})
    with platform.enroll("globex") as other:
        with pytest.raises(NotFound, match="init_from: data source 'secret-hub' not found"):
            other.submit(Job(name="probe", init_from="s3://secret-hub@bucket/weights", **TINY))
        assert other.list() == []


def test_weights_load_from_azurite_object_by_object_through_the_files_loader(tmp_path, azurite_service):
    container = f"weights-{uuid.uuid4().hex[:12]}"
    connection = azurite_connection_string(azurite_service.endpoint)
    store = open_store(f"az://{container}/llama", connection_string=connection)
    store.container.create_container()
    source = build_model("llama-tiny", seed=5).state_dict()
    for key, data in _hf_objects(source).items():
        store.put(key, data)
    store.put("nested/extra.safetensors", save({"model.unknown": torch.zeros(1)}))  # not directly under
    credentials = SourceCredentials("vault", "az", "", {"connection_string": connection})

    objects = open_weights(f"az://vault@{container}/llama", credentials=credentials)
    assert objects.keys == ("model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors")
    target = build_model("llama-tiny", seed=1)
    assert load_weights(target, objects) == 2
    for name, tensor in source.items():
        assert torch.equal(target.state_dict()[name], tensor), name

    one = open_weights(f"az://vault@{container}/llama/model-00001-of-00002.safetensors", credentials=credentials)
    assert one.keys == ("model-00001-of-00002.safetensors",)
    with pytest.raises(WeightsError, match=rf"{container}/llama/: no tensor for embed_tokens\.weight"):
        load_weights(build_model("llama-tiny", seed=1), one)

    save_file({"model.not.a.weight": torch.zeros(2)}, str(tmp_path / "odd.safetensors"))  # a local file, same checks
    with pytest.raises(WeightsError, match=r"odd\.safetensors: tensor 'not\.a\.weight' is not in the model"):
        load_weights(build_model("llama-tiny", seed=1), local_weights(tmp_path / "odd.safetensors"))
    store.put("broken/model.safetensors", b"not safetensors at all")
    broken = open_weights(f"az://vault@{container}/llama/broken", credentials=credentials)
    with pytest.raises(WeightsError, match=r"broken/model\.safetensors: not a safetensors file"):
        load_weights(build_model("llama-tiny", seed=1), broken)

    config = hf_config(target.cfg, "float32", {})  # a Hugging Face folder in the store: its config.json is checked
    folder = open_store(f"az://{container}/hf", connection_string=connection)
    for key, data in {**_hf_objects(source), "config.json": json.dumps(config).encode()}.items():
        folder.put(key, data)
    assert load_weights(build_model("llama-tiny", seed=1), open_weights(f"az://vault@{container}/hf", credentials=credentials)) == 2  # fmt: skip
    folder.put("config.json", json.dumps({**config, "num_hidden_layers": 3}).encode())
    with pytest.raises(HFConfigError, match=rf"az://{container}/hf/config\.json: num_hidden_layers is 3, the job's model has 2"):  # fmt: skip
        load_weights(build_model("llama-tiny", seed=1), open_weights(f"az://vault@{container}/hf", credentials=credentials))  # fmt: skip

    with pytest.raises(WeightsError, match=r"no \.safetensors object under"):
        open_weights(f"az://vault@{container}/empty", credentials=credentials)
    with pytest.raises(DataError, match="names data source 'vault', whose credentials were not given"):
        open_weights(f"az://vault@{container}/llama", credentials=None)
    wrong = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY[:-8] + "AAAAAAA="}
    with pytest.raises(DatasetAccessError, match=f"listing az://{container}/llama/: the store refused the credentials"):
        open_weights(
            f"az://vault@{container}/llama",
            credentials=SourceCredentials("vault", "az", azurite_service.endpoint, wrong),
        )
