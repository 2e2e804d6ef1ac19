"""Muon on a FSDP2 + tensor-parallel mesh, as a job's trainer builds it: a run stopped at its checkpoint and resumed.

Four gloo processes train qwen3-tiny on a 2 x 2 (dp_shard x tp) mesh with the
job's Muon settings, stop halfway, seal what the trainer checkpoints for a
mesh job (DCP, every rank its own shards), and resume on the same mesh and on a 4 x 1 one: parameters and
Canzona's momentum match the uninterrupted run to 1e-5 (on 4 x 1 the momentum
comes from the 2 x 2 run's DTensors, resharded).
"""

from __future__ import annotations

import os
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.decoder import Decoder
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer, spec_settings
from cantata.trainer.parallel import Parallelism, data_rank, parallelize
from cantata.trainer.process_exit import exit_without_finalizing
from tests.test_parallel import MODEL, STEPS, _batches, _free_port, _keys, _parse, _registry, _train


def _whole(model, optimizer) -> tuple[dict, dict]:
    """The model's and Canzona's momentum's whole tensors on the CPU (collective; rank 0 keeps them)."""
    model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    momentum = {name: t.full_tensor().cpu() for name, t in optimizer.muon.state_dict()["momentum"].items()}
    return model_state, {"muon": {"momentum": momentum}}


MUON_FIELDS = dict(optimizer="muon", canzona_alpha=0.5, canzona_bucket_elements=20_000, muon_momentum=0.9)


def _muon_ranks(rank: int, world: int, port: int, out: str, store: str, keys: str) -> None:
    """A 2 x 2 muon run of 2 * STEPS steps, and the same run stopped after STEPS, sealed through the trainer's
    checkpoint registry (DCP, every rank its own shards) and resumed on the same mesh and on a 4 x 1 one."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    settings = spec_settings(_parse(model=MODEL, workers=4, dp_shard=2, tp=2, **MUON_FIELDS))
    batches = _batches() + _batches()[::-1]

    def run(shape: tuple[int, int, int], part: slice, resume: bool = False):
        mesh = Parallelism(*shape).mesh()
        model = cast(
            Decoder, build_model(MODEL, seed=3 if not resume else 7)
        )  # a resumed run's weights come from the checkpoint
        parallelize(model, mesh, MixedPrecision.FP32, checkpointing=False)
        optimizer = build_optimizer(
            model, "muon", lr=2e-2, grad_clip=1.0, mesh=mesh, tp_dim="tp", weight_decay=0.1, **settings
        )
        registry = _registry(store, keys, model, optimizer)
        if resume:
            registry.restore(STEPS)
        index, count = data_rank(mesh)
        _train(model, optimizer, batches[part], lambda b: b.chunk(count)[index])
        return _whole(model, optimizer), optimizer, registry

    uninterrupted, optimizer, _ = run((1, 2, 2), slice(None))
    metrics = optimizer.window_metrics()
    halfway, _, registry = run((1, 2, 2), slice(STEPS))
    registry.save(STEPS)  # Canzona's momentum goes in as DTensors placed like the 2 x 2 parameters
    same_mesh, _, _ = run((1, 2, 2), slice(STEPS, None), resume=True)
    other_mesh, _, _ = run((1, 4, 1), slice(STEPS, None), resume=True)
    if rank == 0:
        torch.save(
            {
                "runs": {"uninterrupted": uninterrupted, "same mesh": same_mesh, "4x1 mesh": other_mesh},
                "momentum": halfway[1]["muon"]["momentum"],
                "metrics": metrics,
                "settings": (optimizer.muon.plan.name, optimizer.muon.config.momentum, optimizer.muon.world_size),
            },
            out,
        )
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


@pytest.mark.integration  # four gloo processes
def test_a_mesh_muon_run_resumed_from_its_checkpoint_matches_the_uninterrupted_run(tmp_path):
    out, store = str(tmp_path / "muon.pt"), f"file://{tmp_path / 'store'}"
    mp.start_processes(_muon_ranks, args=(4, _free_port(), out, store, _keys(tmp_path)), nprocs=4, start_method="spawn")
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
    assert metrics["optim_owned_matrices"] in range(1, len(muon_names))  # some matrices, not all
    assert metrics["optim_ns_flops_imbalance"] >= 1.0 and metrics["optim_sent_bytes"] > 0
