"""FSDP2 + tensor parallelism on CPU gloo processes: the same training as one process, checkpoints across meshes.

The equivalence runs four real processes on a 2 x 2 (dp_shard x tp) mesh of
qwen3-tiny and compares them with one process over the same global batches;
the platform test trains such a job through the SDK to SUCCEEDED.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import MixedPrecision
from cantata.sdk.job import Job
from cantata.server.jobspec import InvalidField, parse_job_spec
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.parallel import FullState, Parallelism, data_rank, parallelize

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


def _ranks(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = Parallelism(1, 2, 2).mesh()
    model = build_model(MODEL, seed=1)
    parallelize(model, mesh, MixedPrecision.FP32, checkpointing=True)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_2x2_mesh_trains_like_one_process_and_its_checkpoint_loads_on_a_4x1_mesh(tmp_path):
    reference = build_model(MODEL, seed=1)
    ref_losses = _train(reference, build_optimizer(reference, "adamw", lr=1e-2, grad_clip=1.0), _batches())
    out = str(tmp_path / "ranks.pt")
    mp.start_processes(_ranks, args=(4, _free_port(), out), nprocs=4, start_method="spawn")
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


def _parse(**fields) -> common_pb2.JobSpec:
    return parse_job_spec(common_pb2.JobSpec(name="x", steps=10, **fields), default_store="file:///tmp/c", roots=[])


def test_submit_checks_the_mesh():
    spec = _parse(model=MODEL, workers=4, dp_shard=2, tp=2)
    assert (spec.algorithm, spec.dp_replicate, spec.mixed_precision) == ("allreduce", 1, "fp32")
    refusals = [
        (dict(model=MODEL, workers=2, dp_shard=2, tp=2), "workers", "needs workers = 4"),
        (dict(model="gpt-tiny", workers=2, dp_shard=2), "model", "not sharded"),
        (dict(model=MODEL, workers=4, tp=4), "tp", "divide qwen3-tiny's 2 key/value heads"),
        (dict(model=MODEL, workers=2, dp_shard=2, optimizer="muon"), "optimizer", "Canzona on DTensor"),
        (dict(model=MODEL, workers=2, dp_shard=2, algorithm="gasloc"), "dp_shard", "only for single or allreduce"),
    ]
    for fields, field, words in refusals:
        with pytest.raises(InvalidField, match=words) as caught:
            _parse(**fields)
        assert caught.value.field == field


def test_a_qwen3_tiny_job_on_a_2x2_mesh_trains_through_the_platform(tenant):
    job = Job(
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
