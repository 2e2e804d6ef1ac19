"""Canzona on DTensor: a model sharded with fully_shard and parallelize_module matches single-process Muon.

One spawn per mesh shape (data-parallel shards x tensor-parallel ranks): 1x1,
2x1, 1x2 and 2x2 gloo processes on CPU train the same tiny model (attention-like
and MLP-like matrices, a fused qkv and gate/up, a stack of expert matrices and a
layer that never gets a gradient) on the same data as a single process, and the
final parameters must agree to 1e-5.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar, cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from cantata.trainer.optim import build_optimizer
from cantata.trainer.process_exit import exit_without_finalizing

pytestmark = pytest.mark.integration  # spawns up to 4 worker processes per mesh

STEPS, RESUME_AT, LR = 6, 3, 0.02
VOCAB, CONTEXT, WIDTH, HEADS, KV_HEADS, FFN, EXPERTS = 16, 6, 8, 2, 1, 16, 2
HEAD = WIDTH // HEADS
QKV = (HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD)
MESHES = ((1, 1), (2, 1), (1, 2), (2, 2))
MUON_STEPPED = {
    f"blocks.{b}.{n}" for b in (0, 1) for n in ("qkv.weight", "o.weight", "gate_up.weight", "down.weight", "experts")
}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, sum(QKV), bias=False)
        self.o = nn.Linear(HEADS * HEAD, WIDTH, bias=False)
        self.gate_up = nn.Linear(WIDTH, 2 * FFN, bias=False)
        self.down = nn.Linear(FFN, WIDTH, bias=False)
        self.experts = nn.Parameter(torch.randn(EXPERTS, WIDTH, WIDTH) / WIDTH**0.5)
        self.unused = nn.Linear(WIDTH, WIDTH, bias=False)  # never in the graph: must never be stepped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(QKV, dim=-1)
        q = q.view(batch, length, HEADS, HEAD).transpose(1, 2)
        k, v = (t.view(batch, length, KV_HEADS, HEAD).transpose(1, 2) for t in (k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, HEADS * HEAD))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return x + torch.einsum("blw,ewv->blv", x, self.experts) / EXPERTS


class TinyModel(nn.Module):
    muon_splits: ClassVar[dict[str, tuple[int, ...]]] = {
        "blocks.*.qkv.weight": QKV,
        "blocks.*.gate_up.weight": (FFN, FFN),
    }

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm, self.lm_head = nn.RMSNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def fresh_model() -> TinyModel:
    torch.manual_seed(0)
    return TinyModel()


def loss_on(model: nn.Module, step: int, dp_rank: int) -> torch.Tensor:
    tokens = torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=torch.Generator().manual_seed(1000 * step + dp_rank))
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def sharded_model(mesh) -> TinyModel:
    """Column-parallel qkv and gate/up (outputs gathered), row-parallel o and down; FSDP2 over "dp"."""
    model = fresh_model()
    plan = {
        "qkv": ColwiseParallel(output_layouts=Replicate()),
        "gate_up": ColwiseParallel(output_layouts=Replicate()),
        "o": RowwiseParallel(input_layouts=Replicate()),
        "down": RowwiseParallel(input_layouts=Replicate()),
    }
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def train(model, optimizer, dp_rank: int, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        loss_on(model, step, dp_rank).backward()
        optimizer.step()


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: cast(DTensor, param).full_tensor().detach().clone() for name, param in model.named_parameters()}


def worker(rank: int, dp: int, tp: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=dp * tp)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_local_rank("dp")

    def optimizer_for(model):
        return build_optimizer(model, "muon", lr=LR, mesh=mesh, tp_dim="tp", bucket_elements=300)

    model = sharded_model(mesh)
    optimizer = optimizer_for(model)
    train(model, optimizer, dp_rank, range(STEPS))
    finished = full_params(model)
    stats = optimizer.last_stats
    resumed = sharded_model(mesh)
    first = optimizer_for(resumed)
    train(resumed, first, dp_rank, range(RESUME_AT))
    second = optimizer_for(resumed)
    second.load_state_dict(first.state_dict())  # each rank its own shard, as a checkpoint holds them
    train(resumed, second, dp_rank, range(RESUME_AT, STEPS))
    result = {
        "params": finished,
        "resumed": full_params(resumed),
        "owned": [optimizer.muon.names[i] for i in optimizer.muon.owned],
        "updated": stats.updated_matrices,
        "collective_elements": stats.collective_elements,
        "local_elements": sum(
            cast(DTensor, p).to_local().numel() for n, p in model.named_parameters() if n in MUON_STEPPED
        ),
    }
    torch.save(result, out / f"rank{rank}.pt")
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


@functools.cache
def reference(dp: int) -> dict[str, torch.Tensor]:
    """One process: each step averages the losses of the data-parallel ranks' batches."""
    torch.set_num_threads(1)
    model = fresh_model()
    optimizer = build_optimizer(model, "muon", lr=LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        (sum(loss_on(model, step, r) for r in range(dp)) / dp).backward()
        optimizer.step()
    return {name: param.detach() for name, param in model.named_parameters()}


def relative_error(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    diff = torch.sqrt(sum(((actual[n] - expected[n]).pow(2).sum() for n in expected), torch.zeros(())))
    return (diff / torch.sqrt(sum((expected[n].pow(2).sum() for n in expected), torch.zeros(())))).item()


@pytest.fixture(scope="module", params=MESHES, ids=lambda shape: f"{shape[0]}x{shape[1]}")
def mesh_run(request, tmp_path_factory):
    dp, tp = request.param
    out = tmp_path_factory.mktemp(f"mesh{dp}x{tp}")
    mp.spawn(worker, args=(dp, tp, str(out / "init"), str(out)), nprocs=dp * tp, join=True)
    return dp, tp, [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(dp * tp)]


def test_sharded_canzona_matches_single_process_muon(mesh_run):
    dp, _, ranks = mesh_run
    expected = reference(dp)
    initial = {name: param.detach() for name, param in fresh_model().named_parameters()}
    for result in ranks:
        assert relative_error(result["params"], expected) <= 1e-5
        assert relative_error(result["resumed"], expected) <= 1e-5
    assert relative_error(ranks[0]["params"], initial) > 1e-2
    for name in expected:
        if ".unused." in name:
            assert torch.equal(ranks[0]["params"][name], initial[name]), f"{name} was stepped without a gradient"


def test_every_matrix_has_one_owner_and_collectives_move_no_padding(mesh_run):
    dp, tp, ranks = mesh_run
    owned = [name for result in ranks for name in result["owned"]]
    assert len(owned) == len(set(owned)) == 2 * 6  # the unused layer has an owner too
    assert sum(result["updated"] for result in ranks) == len(MUON_STEPPED)  # but is never updated
    gradient = sum(p.numel() for n, p in fresh_model().named_parameters() if n in MUON_STEPPED)
    if dp * tp > 1:  # one replica of each piece goes to the owner; every rank gets its own pieces back
        assert sum(r["collective_elements"] for r in ranks) == gradient + sum(r["local_elements"] for r in ranks)
