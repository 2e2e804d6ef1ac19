"""Muon on a FSDP2 + tensor-parallel mesh, as a job's trainer builds it: a run stopped at its checkpoint and resumed.

Four gloo processes train qwen3-tiny on a 2 x 2 (dp_shard x tp) mesh with the
job's Muon settings, stop halfway, save what the trainer checkpoints for a
mesh job, and resume on the same mesh and on a 4 x 1 one: parameters and
Canzona's momentum match the uninterrupted run to 1e-5 (on 4 x 1 the momentum
comes from the 2 x 2 run's DTensors, resharded).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer, spec_settings
from cantata.trainer.parallel import FullState, Parallelism, data_rank, parallelize
from tests.test_parallel import MODEL, STEPS, _batches, _free_port, _parse, _train


def checkpointed(model, optimizer) -> tuple:
    """What a mesh job's trainer registers as its checkpoint's model and optimizer parts (trainer/loop.py)."""
    return FullState(model, optimizer, "model"), FullState(model, optimizer, "optim")


MUON_FIELDS = dict(optimizer="muon", canzona_alpha=0.5, canzona_bucket_elements=20_000, muon_momentum=0.9)


def _muon_ranks(rank: int, world: int, port: int, out: str) -> None:
    """A 2 x 2 muon run of 2 * STEPS steps, and the same run stopped after STEPS, saved and resumed (on the
    same mesh and on a 4 x 1 one) from what ``FullState`` checkpoints, built as a job's trainer builds them."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    settings = spec_settings(_parse(model=MODEL, workers=4, dp_shard=2, tp=2, **MUON_FIELDS))
    batches = _batches() + _batches()[::-1]

    def run(shape: tuple[int, int, int], part: slice, state: list | None = None, sharded: dict | None = None):
        mesh = Parallelism(*shape).mesh()
        model = build_model(MODEL, seed=3)
        parallelize(model, mesh, MixedPrecision.FP32, checkpointing=False)
        optimizer = build_optimizer(
            model, "muon", lr=2e-2, grad_clip=1.0, mesh=mesh, tp_dim="tp", weight_decay=0.1, **settings
        )
        parts = checkpointed(model, optimizer)
        if state is not None:  # a copy: loading turns a full state's tensors into this mesh's DTensors in place
            for holder, saved in zip(parts, copy.deepcopy(state), strict=True):
                holder.load_state_dict(saved)
        if sharded is not None:  # Canzona's momentum as DTensors of another mesh (ShardedMuon.state_dict)
            optimizer.muon.load_state_dict(sharded)
        index, count = data_rank(mesh)
        _train(model, optimizer, batches[part], lambda b: b.chunk(count)[index])
        return [holder.state_dict() for holder in parts], optimizer

    uninterrupted, optimizer = run((1, 2, 2), slice(None))
    metrics = optimizer.window_metrics()
    halfway, stopped = run((1, 2, 2), slice(STEPS))
    sharded = stopped.muon.state_dict()  # every rank's pieces, placed like the 2 x 2 parameters
    dist.broadcast_object_list(halfway, src=0)  # what every rank reads from the checkpoint
    same_mesh, _ = run((1, 2, 2), slice(STEPS, None), halfway)
    without_momentum = copy.deepcopy(halfway)
    for tensor in without_momentum[1]["muon"]["momentum"].values():
        tensor.zero_()  # so the 4 x 1 run has Canzona's momentum only from the DTensors
    other_mesh, _ = run((1, 4, 1), slice(STEPS, None), without_momentum, sharded)
    if rank == 0:
        momentum = halfway[1]["muon"]["momentum"]
        torch.save(
            {
                "runs": {"uninterrupted": uninterrupted, "same mesh": same_mesh, "4x1 mesh": other_mesh},
                "momentum": momentum,
                "metrics": metrics,
                "settings": (optimizer.muon.plan.name, optimizer.muon.config.momentum, optimizer.muon.world_size),
            },
            out,
        )
    dist.destroy_process_group()


@pytest.mark.integration  # four gloo processes
def test_a_mesh_muon_run_resumed_from_its_checkpoint_matches_the_uninterrupted_run(tmp_path):
    out = str(tmp_path / "muon.pt")
    mp.start_processes(_muon_ranks, args=(4, _free_port(), out), nprocs=4, start_method="spawn")
    result = torch.load(out)
    runs = result["runs"]
    expected = runs["uninterrupted"][0]
    initial = build_model(MODEL, seed=3).state_dict()
    assert all(torch.equal(initial[n], t) for n, t in build_model(MODEL, seed=3).state_dict().items())
    assert max((expected[n] - initial[n]).abs().max().item() for n in expected) > 1e-3  # it trained
    for label in ("same mesh", "4x1 mesh"):
        resumed = runs[label][0]
        assert set(resumed) == set(expected)
        for name, tensor in expected.items():
            torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-5, msg=f"{label}: {name}")
        momentum = runs[label][1]["muon"]["momentum"]
        for name, tensor in runs["uninterrupted"][1]["muon"]["momentum"].items():
            torch.testing.assert_close(momentum[name], tensor, rtol=1e-5, atol=1e-5, msg=f"{label}: {name}")
    saved = result["momentum"]  # whole matrices, one per Muon-routed weight, every one moved by training
    muon_names = {n for n, t in initial.items() if t.ndim == 2 and "embed" not in n and "lm_head" not in n}
    assert set(saved) == muon_names and all(saved[n].shape == initial[n].shape for n in saved)
    assert all(saved[n].abs().sum() > 0 for n in saved)
    assert result["settings"] == ("alpha=0.5", 0.9, 4)  # the job's fields, on every rank of the mesh
    metrics = result["metrics"]
    assert metrics["optim_updated_matrices"] == len(muon_names)
    assert 1 <= metrics["optim_owned_matrices"] < len(muon_names)
    assert metrics["optim_ns_flops_imbalance"] >= 1.0 and metrics["optim_sent_bytes"] > 0
