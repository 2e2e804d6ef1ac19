"""FSDP2 + tensor parallelism on CPU gloo processes: the same training as one process, checkpoints across meshes.

The equivalence runs four real processes on a 2 x 2 (dp_shard x tp) mesh of
qwen3-tiny and compares them with one process over the same global batches;
the platform test trains such a job with Muon through the SDK to SUCCEEDED.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import MixedPrecision
from cantata.sdk.job import Job
from cantata.server.jobspec import InvalidField, parse_job_spec
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.parallel import FullState, Parallelism, data_rank, parallelize
from cantata.trainer.weights import WeightsError, load_weights

STEPS = 3
MODEL = "qwen3-tiny"


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 512, (4, 17), generator=generator) for _ in range(STEPS)]


def _train(model, optimizer, batches, part=lambda b: b) -> list[float]:
    losses = []
    for batch in batches:
        batch = part(batch)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def _ranks(rank: int, world: int, port: int, out: str, weights: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = Parallelism(1, 2, 2).mesh()
    model = build_model(MODEL, seed=3)
    parallelize(model, mesh, MixedPrecision.FP32, checkpointing=True)
    load_weights(model, Path(weights))  # the reference's initial weights, each rank keeping its shard
    optimizer = build_optimizer(model, "adamw", lr=1e-2, grad_clip=1.0)
    index, count = data_rank(mesh)
    losses = torch.stack(_train(model, optimizer, _batches(), lambda b: b.chunk(count)[index]))
    dist.all_reduce(losses)  # the mean over the data-parallel ranks (tensor-parallel peers agree)
    state = FullState(model, optimizer, "model").state_dict()
    moments = FullState(model, optimizer, "optim").state_dict()
    saved = [{k: v.clone() for k, v in state.items()}, moments]
    dist.broadcast_object_list(saved, src=0)  # what every rank reads from a checkpoint
    other = Parallelism(1, 4, 1).mesh()  # the checkpoint loads on another mesh
    reloaded = build_model(MODEL, seed=2)
    parallelize(reloaded, other, MixedPrecision.FP32, checkpointing=False)
    reopt = build_optimizer(reloaded, "adamw", lr=1e-2, grad_clip=1.0)
    FullState(reloaded, reopt, "model").load_state_dict(saved[0])
    FullState(reloaded, reopt, "optim").load_state_dict(saved[1])
    probe = _batches()[0]
    with torch.no_grad():
        probe_loss = reloaded(probe[:, :-1], probe[:, 1:])[1]
    if rank == 0:
        torch.save({"losses": losses / world, "state": state, "steps": reopt.steps, "probe": probe_loss}, out)
    dist.destroy_process_group()


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
    assert load_weights(target, directory) == 2
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    with pytest.raises(WeightsError, match=r"no tensor for lm_head\.weight"):
        load_weights(build_model("llama-tiny", seed=1), directory / "a.safetensors")
    with pytest.raises(WeightsError, match="has shape"):
        load_weights(build_model("qwen3-tiny", seed=1), directory / "a.safetensors")
    with pytest.raises(WeightsError, match=r"no \.safetensors file"):
        load_weights(target, tmp_path / "missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration  # four gloo processes
def test_a_2x2_mesh_trains_like_one_process_and_its_checkpoint_loads_on_a_4x1_mesh(tmp_path):
    reference = build_model(MODEL, seed=1)
    weights = _save_hf_style(reference, tmp_path / "weights")
    ref_losses = _train(reference, build_optimizer(reference, "adamw", lr=1e-2, grad_clip=1.0), _batches())
    out = str(tmp_path / "ranks.pt")
    mp.start_processes(_ranks, args=(4, _free_port(), out, str(weights)), nprocs=4, start_method="spawn")
    result = torch.load(out)
    torch.testing.assert_close(result["losses"], torch.stack(ref_losses), rtol=1e-5, atol=1e-6)
    expected = reference.state_dict()
    assert set(result["state"]) == set(expected)
    for name, tensor in expected.items():  # AdamW's first steps amplify float noise in near-zero gradients
        torch.testing.assert_close(result["state"][name], tensor, rtol=0, atol=2e-3, msg=name)
    assert result["steps"] == STEPS
    probe = _batches()[0]
    with torch.no_grad():
        torch.testing.assert_close(result["probe"], reference(probe[:, :-1], probe[:, 1:])[1], rtol=1e-4, atol=1e-5)


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


OPTIMIZER_METRICS = (
    "optim_step_s",
    "optim_compute_s",
    "optim_compute_imbalance",
    "optim_sent_bytes",
    "optim_ns_flops_imbalance",
    "optim_owned_matrices",
    "optim_updated_matrices",
)


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
