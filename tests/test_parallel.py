"""FSDP2 + tensor parallelism on CPU gloo processes: the same training as one process, checkpoints across meshes.

The equivalence runs four real processes on a 2 x 2 (dp_shard x tp) mesh of
qwen3-tiny and compares them with one process over the same global batches;
the platform test trains such a job with Muon through the SDK to SUCCEEDED.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import MixedPrecision
from cantata.sdk.job import Job
from cantata.security.keys import JobKeys, LocalKeyring, MasterKey
from cantata.security.sealed_checkpoint import IntegrityError, MissingShardError, object_key, read_shard_bytes
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec, resumed_spec
from cantata.storage import open_store
from cantata.trainer.checkpoint import JobCheckpoints, Scope, TrainingState
from cantata.trainer.decoder import Decoder
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.parallel import MeshState, Parallelism, data_rank, parallelize
from cantata.trainer.process_exit import exit_without_finalizing
from cantata.trainer.sealed_dcp import ShardedFormatError, consolidate, decode_metadata
from cantata.trainer.weights import WeightsError, load_weights, local_weights
from tests.services import azurite_connection_string

STEPS = 3
MODEL = "qwen3-tiny"


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 512, (4, 17), generator=generator) for _ in range(STEPS)]


def _train(model, optimizer, batches, part=lambda b: b) -> list[torch.Tensor]:
    losses = []
    for batch in batches:
        batch = part(batch)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def _checkpoints(store: str, keys: str) -> JobCheckpoints:
    return JobCheckpoints(store, "tenant", "job", JobKeys.from_json(keys), keep_last=2)


def _registry(store: str, keys: str, model, optimizer) -> TrainingState:
    state = TrainingState(
        _checkpoints(store, keys), rank=dist.get_rank(), process=dist.get_rank(), group=dist.group.WORLD, commits=True
    )
    state.register("train", Scope.SHARDED, MeshState(model, optimizer))
    return state


def _ranks(rank: int, world: int, port: int, out: str, weights: str, store: str, keys: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = Parallelism(1, 2, 2).mesh()
    model = cast(Decoder, build_model(MODEL, seed=3))
    parallelize(model, mesh, MixedPrecision.FP32, checkpointing=True)
    load_weights(model, local_weights(Path(weights)))  # the reference's initial weights, each rank keeping its shard
    optimizer = build_optimizer(model, "adamw", lr=1e-2, grad_clip=1.0)
    index, count = data_rank(mesh)
    losses = torch.stack(_train(model, optimizer, _batches(), lambda b: b.chunk(count)[index]))
    dist.all_reduce(losses)  # the mean over the data-parallel ranks (tensor-parallel peers agree)
    _registry(store, keys, model, optimizer).save(STEPS)  # every rank seals its own shards
    other = Parallelism(1, 4, 1).mesh()  # the checkpoint loads on another mesh
    reloaded = cast(Decoder, build_model(MODEL, seed=2))
    parallelize(reloaded, other, MixedPrecision.FP32, checkpointing=False)
    reopt = build_optimizer(reloaded, "adamw", lr=1e-3, grad_clip=1.0)
    _registry(store, keys, reloaded, reopt).restore(STEPS)
    probe = _batches()[0]
    with torch.no_grad():
        probe_loss = reloaded(probe[:, :-1], probe[:, 1:])[1]
    if rank == 0:
        torch.save({"losses": losses / world, "steps": reopt.steps, "lr": reopt.lr, "probe": probe_loss}, out)
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def _fewer_ranks(rank: int, world: int, port: int, out: str, store: str, keys: str) -> None:
    """The four ranks' checkpoint, loaded on two (dp_shard 2), trains on: its full state is what was saved."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = cast(Decoder, build_model(MODEL, seed=4))
    parallelize(model, Parallelism(1, 2, 1).mesh(), MixedPrecision.FP32, checkpointing=False)
    optimizer = build_optimizer(model, "adamw", lr=1e-3, grad_clip=1.0)
    _registry(store, keys, model, optimizer).restore(STEPS)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    steps, lr = optimizer.steps, optimizer.lr
    _train(model, optimizer, _batches()[:1], lambda b: b.chunk(2)[rank])  # the restored moments step on
    # a mesh checkpoint as written before sharded checkpoints: full tensors in "model" and "optim", sealed by rank 0
    full_options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    old: dict[str, dict] = {
        "model": get_model_state_dict(model, options=full_options),
        "optim": {
            "adamw": get_optimizer_state_dict(model, optimizer.adamw, options=full_options),
            "step": optimizer.steps,
            "lr": optimizer.lr,
        },
    }
    checkpoints = _checkpoints(store, keys)
    checkpoints.begin(STEPS + 1, rank, dist.group.WORLD)
    checkpoints.commit(STEPS + 1, rank, old if rank == 0 else {}, dist.group.WORLD, [])
    again = cast(Decoder, build_model(MODEL, seed=5))
    parallelize(again, Parallelism(1, 2, 1).mesh(), MixedPrecision.FP32, checkpointing=False)
    reopt = build_optimizer(again, "adamw", lr=1e-3, grad_clip=1.0)
    _registry(store, keys, again, reopt).restore(STEPS + 1)  # the new registry still reads it
    legacy = get_model_state_dict(again, options=full_options)
    if rank == 0:
        torch.save(
            {
                "state": full,
                "steps": steps,
                "lr": lr,
                "old": old["model"],
                "legacy": legacy,
                "legacy_steps": reopt.steps,
            },
            out,
        )
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def _save_hf_style(model: torch.nn.Module, directory: Path) -> Path:
    """``model``'s weights as Hugging Face lays them out: two files, ``model.``-prefixed, no tied head."""
    directory.mkdir()
    state = {name: t.clone() for name, t in model.state_dict().items() if name != "lm_head.weight"}
    names = sorted(state)
    for index, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        save_file({f"model.{n}": state[n] for n in part}, str(directory / f"model-{index:05d}.safetensors"))
    return directory


def test_initial_weights_load_file_by_file_and_refuse_what_does_not_fit(tmp_path):
    source = build_model("llama-tiny", seed=5)
    directory = tmp_path / "w"
    directory.mkdir()
    state = {name: t.clone() for name, t in source.state_dict().items()}
    save_file({f"model.{n}": t for n, t in state.items() if n != "lm_head.weight"}, str(directory / "a.safetensors"))
    save_file({"lm_head.weight": state["lm_head.weight"]}, str(directory / "b.safetensors"))  # untied: its own
    target = build_model("llama-tiny", seed=1)
    assert load_weights(target, local_weights(directory)) == 2
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    with pytest.raises(WeightsError, match=r"no tensor for lm_head\.weight"):
        load_weights(build_model("llama-tiny", seed=1), local_weights(directory / "a.safetensors"))
    with pytest.raises(WeightsError, match="has shape"):
        load_weights(build_model("qwen3-tiny", seed=1), local_weights(directory / "a.safetensors"))
    with pytest.raises(WeightsError, match=r"no \.safetensors file"):
        local_weights(tmp_path / "missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sealed(store: str, keys: str):
    """Read a ``train.*`` object of the checkpoint at ``STEPS`` as the worker does: verified against the manifest."""
    checkpoints = _checkpoints(store, keys)
    info = checkpoints.manifest(STEPS)
    listed = {shard.name: shard for shard in info.shards}
    return info, lambda name: read_shard_bytes(
        open_store(store), tenant="tenant", job_id="job", step=STEPS, shard=listed[name], keys=JobKeys.from_json(keys)
    )


@pytest.mark.integration  # four gloo processes, then two
def test_a_2x2_mesh_trains_like_one_process_and_its_sharded_checkpoint_loads_on_4x1_and_on_2_ranks(tmp_path):
    reference = build_model(MODEL, seed=1)
    weights = _save_hf_style(reference, tmp_path / "weights")
    ref_losses = _train(reference, build_optimizer(reference, "adamw", lr=1e-2, grad_clip=1.0), _batches())
    ring = LocalKeyring(tmp_path / "keyring", MasterKey(bytes(range(32))))
    ring.ensure_tenant("tenant")
    keys, store = ring.job_keys("tenant", "job").to_json(), f"file://{tmp_path / 'store'}"
    out = str(tmp_path / "ranks.pt")
    mp.start_processes(_ranks, args=(4, _free_port(), out, str(weights), store, keys), nprocs=4, start_method="spawn")
    result = torch.load(out)
    torch.testing.assert_close(result["losses"], torch.stack(ref_losses), rtol=1e-5, atol=1e-6)
    assert (result["steps"], result["lr"]) == (STEPS, 1e-2)  # the optimizer's progress came back too
    probe = _batches()[0]
    with torch.no_grad():
        torch.testing.assert_close(result["probe"], reference(probe[:, :-1], probe[:, 1:])[1], rtol=1e-4, atol=1e-5)

    info, read = _sealed(store, keys)  # one sealed object per rank, the metadata, the manifest last
    assert sorted(shard.name for shard in info.shards) == ["train.0", "train.1", "train.2", "train.3", "train.metadata"]
    consolidated = consolidate(read, "train", "model.")
    expected = reference.state_dict()
    assert set(consolidated) == set(expected)
    for name, tensor in expected.items():  # AdamW's first steps amplify float noise in near-zero gradients
        assert consolidated[name].shape == tensor.shape, name
        torch.testing.assert_close(consolidated[name], tensor, rtol=0, atol=2e-3, msg=name)

    out = str(tmp_path / "two.pt")
    mp.start_processes(_fewer_ranks, args=(2, _free_port(), out, store, keys), nprocs=2, start_method="spawn")
    two = torch.load(out)
    assert (two["steps"], two["lr"]) == (STEPS, 1e-2)
    for name, tensor in consolidated.items():
        assert torch.equal(two["state"][name], tensor), name
    assert two["legacy_steps"] == STEPS + 1  # an older full-tensor mesh checkpoint loads into the sharded registry
    for name, tensor in two["old"].items():
        assert torch.equal(two["legacy"][name], tensor), name


def _keys(tmp_path: Path) -> str:
    ring = LocalKeyring(tmp_path / "keyring", MasterKey(bytes(range(32))))
    ring.ensure_tenant("tenant")
    return ring.job_keys("tenant", "job").to_json()


def _seal_then_tamper(store: str, keys: str) -> None:
    """DCP in one process seals into ``store``; a flipped byte or a lost rank's object is then a typed error."""
    model = build_model("llama-tiny", seed=1)
    state = {"model": model.state_dict(), "progress": {"step": 7}}
    checkpoints = _checkpoints(store, keys)
    checkpoints.begin(STEPS, 0, None)
    written = checkpoints.save_sharded(STEPS, "train", state, None)  # one process: DCP without a group
    checkpoints.commit(STEPS, 0, {}, None, written)
    _, read = _sealed(store, keys)
    assert all(torch.equal(t, model.state_dict()[n]) for n, t in consolidate(read, "train", "model.").items())
    target = {"model": build_model("llama-tiny", seed=2).state_dict(), "progress": {"step": 0}}
    checkpoints.load_sharded(STEPS, checkpoints.manifest(STEPS), "train", target, None)
    assert target["progress"] == {"step": 7} and torch.equal(target["model"]["lm_head.weight"], model.lm_head.weight)

    blobs, key = open_store(store), object_key("tenant", "job", STEPS, "train.0")
    sealed = bytearray(blobs.get_bytes(key))
    sealed[len(sealed) // 2] ^= 1
    with blobs.writer(key) as upload:
        upload.write(bytes(sealed))
    with pytest.raises(IntegrityError):
        consolidate(read, "train", "model.")
    with pytest.raises(IntegrityError):
        checkpoints.load_sharded(STEPS, checkpoints.manifest(STEPS), "train", target, None)
    blobs.delete(key)
    with pytest.raises(MissingShardError):
        checkpoints.load_sharded(STEPS, checkpoints.manifest(STEPS), "train", target, None)


def test_a_tampered_or_missing_shard_object_is_refused_before_use(tmp_path):
    _seal_then_tamper(f"file://{tmp_path / 'store'}", _keys(tmp_path))


def test_sharded_objects_seal_into_s3_and_azure_alike(tmp_path, moto_service, azurite_service, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_service.endpoint)
    for name, value in (
        ("ACCESS_KEY_ID", "testing"),
        ("SECRET_ACCESS_KEY", "testing"),
        ("DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(f"AWS_{name}", value)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(azurite_service.endpoint))
    bucket, container = f"dcp-{uuid.uuid4().hex[:12]}", f"dcp-{uuid.uuid4().hex[:12]}"
    open_store(f"s3://{bucket}/jobs").client.create_bucket(Bucket=bucket)
    open_store(f"az://{container}/jobs").container.create_container()
    keys = _keys(tmp_path)
    for store in (f"s3://{bucket}/jobs", f"az://{container}/jobs"):
        _seal_then_tamper(store, keys)


def test_sharded_metadata_is_json_and_a_malformed_one_is_a_typed_error():
    good = {
        "format": 1,
        "entries": {"model.w": {"dtype": "float32", "size": [2], "chunks": [[[0], [2]]]}},
        "extents": [["model.w", [0], "train.0", 0, 8]],
        "paths": {"model.w": ["model", "w"]},
    }
    metadata = decode_metadata(json.dumps(good).encode())
    assert metadata.state_dict_metadata["model.w"].size == torch.Size([2]) and metadata.planner_data == {
        "model.w": ("model", "w")
    }
    for broken, words in [
        ({**good, "format": 2}, "format 2"),
        ({**good, "entries": {"model.w": {**good["entries"]["model.w"], "dtype": "Tensor"}}}, "not a dtype"),
        ({**good, "extents": [["model.w", [0], "train.0", 0]]}, "malformed"),
        (dict(list(good.items())[:2]), "malformed"),
    ]:
        with pytest.raises(ShardedFormatError, match=words):
            decode_metadata(json.dumps(broken).encode())
    reads = {"train.metadata": json.dumps(good).encode(), "train.0": bytes(4)}  # an extent past its object's end
    with pytest.raises(ShardedFormatError, match="outside its object"):
        consolidate(reads.__getitem__, "train", "model.")


OPTIMIZER_METRICS = (
    "optim_step_s",
    "optim_compute_s",
    "optim_compute_imbalance",
    "optim_sent_bytes",
    "optim_ns_flops_imbalance",
    "optim_owned_matrices",
    "optim_updated_matrices",
)


def _parse(**fields) -> common_pb2.JobSpec:
    return parse_job_spec(common_pb2.JobSpec(name="x", steps=10, **fields), default_store="file:///tmp/c", roots=[])


def test_submit_checks_the_mesh():
    spec = _parse(model=MODEL, workers=4, dp_shard=2, tp=2)
    assert (spec.algorithm, spec.dp_replicate, spec.mixed_precision) == ("allreduce", 1, "fp32")
    muon = _parse(model=MODEL, workers=4, dp_shard=2, tp=2, optimizer="muon")  # Canzona on DTensor
    assert (muon.optimizer, muon.canzona_cost_unit, muon.muon_ns_steps) == ("muon", "flops", 5)
    groups = _parse(model=MODEL, workers=2, ranks_per_worker=2, dp_shard=2, algorithm="gasloc")
    assert (groups.workers, groups.ranks_per_worker, groups.dp_shard, groups.tp) == (2, 2, 2, 0)
    assert _parse(model=MODEL, workers=2, ranks_per_worker=2, algorithm="diloco").dp_shard == 1  # replicated groups
    refusals = [
        (dict(model=MODEL, workers=2, dp_shard=2, tp=2), "workers", "needs workers = 4"),
        (dict(model="gpt-tiny", workers=2, dp_shard=2), "model", "not sharded"),
        (dict(model=MODEL, workers=4, tp=4), "tp", "divide qwen3-tiny's 2 key/value heads"),
        (dict(model=MODEL, workers=2, dp_shard=2, algorithm="gasloc"), "dp_shard", "must equal ranks_per_worker"),
        (
            dict(model=MODEL, workers=2, ranks_per_worker=2, tp=2, algorithm="gasloc"),
            "tp",
            "only for single or allreduce",
        ),
        (dict(model="gpt-tiny", workers=2, ranks_per_worker=2, dp_shard=2, algorithm="diloco"), "model", "not sharded"),
        (
            dict(model=MODEL, workers=2, ranks_per_worker=2, dp_shard=2, algorithm="gasloc", optimizer="muon"),
            "optimizer",
            "not supported yet",
        ),
        (dict(model=MODEL, init_from="file:///etc/weights"), "init_from", "outside the allowed roots"),
    ]
    for fields, field, words in refusals:
        with pytest.raises(InvalidField, match=words) as caught:
            _parse(**fields)
        assert caught.value.field == field


def test_a_resume_moves_only_a_mesh_job_and_only_to_a_mesh_that_fits():
    mesh = _parse(model=MODEL, workers=4, dp_shard=2, tp=2)
    moved = resumed_spec(mesh, {"workers": 2, "dp_shard": 2, "tp": 1, "steps": 20})
    assert (moved.workers, moved.dp_shard, moved.tp, moved.steps, moved.model) == (2, 2, 1, 20, MODEL)
    assert (mesh.workers, mesh.tp, mesh.steps) == (4, 2, 10)  # the job's own spec is left as it was
    plain = _parse(model=MODEL, workers=2)
    refusals = [
        (mesh, {"workers": 2}, "workers", "needs workers = 4"),
        (mesh, {"tp": 4, "dp_shard": 1}, "tp", "key/value heads"),
        (mesh, {"steps": 5}, "steps", "at least 10"),
        (mesh, {"dp_shard": -1}, "dp_shard", "positive"),
        (plain, {"workers": 4}, "workers", "only a mesh job"),
        (mesh, {"workers": 1, "dp_shard": 1, "tp": 1}, "workers", "only on a mesh"),
    ]
    for spec, changes, field, words in refusals:
        with pytest.raises(InvalidField, match=words) as caught:
            resumed_spec(spec, changes)
        assert caught.value.field == field


def test_a_qwen3_tiny_job_on_a_2x2_mesh_trains_through_the_platform(tenant):
    """With Muon (Canzona on DTensor), whose per-window statistics reach the tenant as metrics."""
    job = Job(
        optimizer="muon",
        name="mesh",
        model=MODEL,
        workers=4,
        dp_shard=2,
        tp=2,
        activation_checkpointing=True,
        steps=12,
        eval_every=12,
        checkpoint_every=6,
        batch_size=4,
        seq_len=32,
        eval_batches=2,
        grad_clip=1.0,
    )
    handle = tenant.submit(job)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    losses = [event.loss for event in handle.events() if event.kind == "PROGRESS"]
    assert losses[-1] < losses[0]
    assert [event.step for event in handle.events() if event.kind == "CHECKPOINT"] == [6, 12]
    rows = tenant.metrics(handle.id)
    steps = [r.step for r in rows if r.name == "loss"]
    by_name = {name: [r for r in rows if r.name == name] for name in OPTIMIZER_METRICS}
    for name, points in by_name.items():
        assert [r.step for r in points] == steps, name  # one per report window
    muon_matrices = 7 * 2  # q, k, v, o, gate, up, down in each of qwen3-tiny's two layers
    assert all(r.value == muon_matrices for r in by_name["optim_updated_matrices"])
    assert all(1 <= r.value < muon_matrices for r in by_name["optim_owned_matrices"])  # spread over 4 ranks
    assert all(r.value >= 1 for r in by_name["optim_ns_flops_imbalance"] + by_name["optim_compute_imbalance"])
    assert all(r.value > 0 for r in by_name["optim_step_s"] + by_name["optim_compute_s"] + by_name["optim_sent_bytes"])
