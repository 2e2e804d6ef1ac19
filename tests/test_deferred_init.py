"""A model built on the meta device and initialised shard by shard has the values of the model built whole.

On one process for every model family, and on real gloo processes for a
2 x 2 (dp_shard x tp) mesh and an uneven dp_shard of 3: each rank draws only
its shards' values, and the assembled parameters equal ``build_model``'s.
"""

from __future__ import annotations

import os
import socket
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.tensor import DTensor

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer import deferred_init
from cantata.trainer.deferred_init import DeferredInitError, InitRecorder, allocate, materialize
from cantata.trainer.model import build_meta_model, build_model
from cantata.trainer.parallel import Parallelism, build_sharded
from cantata.trainer.process_exit import exit_without_finalizing

SMALL_CHUNK = 48  # elements generated at once: chunk edges fall inside the shards


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "qwen3-tiny"])
@pytest.mark.parametrize("chunk", [SMALL_CHUNK, deferred_init.CHUNK_ELEMENTS])
def test_a_meta_built_model_gets_exactly_the_values_of_the_model_built_whole(name, chunk, monkeypatch):
    monkeypatch.setattr(deferred_init, "CHUNK_ELEMENTS", chunk)
    whole = build_model(name, seed=11)
    after_whole = torch.rand(4)  # the global generator ends where the whole build leaves it
    model, plan = build_meta_model(name)
    assert all(p.is_meta for p in model.parameters())
    allocate(model)
    materialize(model, plan, seed=11)
    assert torch.equal(torch.rand(4), after_whole)
    expected = whole.state_dict()
    assert model.state_dict().keys() == expected.keys()
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[key]), key
    other = build_model(name, seed=12).state_dict()
    assert any(not torch.equal(other[k], t) for k, t in expected.items())  # the seed matters


def test_tied_weights_stay_one_tensor_once_allocated():
    model, plan = build_meta_model("qwen3-tiny")
    allocate(model)
    materialize(model, plan, seed=1)
    assert model.lm_head.weight is model.embed_tokens.weight


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 4))
        with torch.no_grad():
            self.weight.normal_()
            self.weight.mul_(2)  # depends on the values: a replay of writes cannot reproduce it


class _Generated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 4))
        with torch.no_grad():
            self.weight.normal_(generator=torch.Generator())


class _Unset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 4))


@pytest.mark.parametrize(
    ("module", "message"),
    [(_Scaled, "changes a tensor"), (_Generated, "generator of its own"), (_Unset, "no initial values")],
)
def test_an_initialisation_that_cannot_be_replayed_is_refused(module, message):
    with pytest.raises(DeferredInitError, match=message):
        with torch.device("meta"), InitRecorder() as recorder:
            built = module()
        recorder.plan(built)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(rank: int, world: int, port: int, shape: tuple[int, int, int], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    deferred_init.CHUNK_ELEMENTS = SMALL_CHUNK
    model = build_sharded("qwen3-tiny", 9, Parallelism(*shape).mesh(), MixedPrecision.FP32, checkpointing=False)
    local = sum(cast(DTensor, p).to_local().numel() for p in model.parameters())
    full = {name: cast(DTensor, p).full_tensor() for name, p in model.named_parameters()}
    locals_: list = [None] * world
    dist.all_gather_object(locals_, local)
    if rank == 0:
        torch.save({"full": full, "local": locals_}, out)
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


@pytest.mark.integration  # real gloo processes
@pytest.mark.parametrize("shape", [(1, 2, 2), (1, 3, 1)], ids=["2x2-tp", "uneven-3"])
def test_each_rank_initialises_its_shards_and_together_they_are_the_whole_model(shape, tmp_path):
    world = shape[0] * shape[1] * shape[2]
    out = tmp_path / "full.pt"
    mp.spawn(_ranks, args=(world, _free_port(), shape, str(out)), nprocs=world)
    result = torch.load(out)
    whole = build_model("qwen3-tiny", seed=9)
    expected = dict(whole.named_parameters())
    assert result["full"].keys() == expected.keys()
    for name, tensor in result["full"].items():
        assert torch.equal(tensor, expected[name].detach()), name
    total = sum(p.numel() for p in whole.parameters())
    if shape[2] == 1:  # without tensor parallelism (which replicates the norms) each value lives on one rank
        assert sum(result["local"]) == total
    assert max(result["local"]) < total / 2
