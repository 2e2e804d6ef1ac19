"""DP-Canzona and TP-Canzona on real gloo groups match single-process Muon.

One spawn of 4 processes runs every case; the 2-rank cases run in a subgroup
of ranks {0, 1}. Workers write their final parameters to files and the test
process compares them with single-process references.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from cantata.trainer.optim import build_optimizer, merge_optimizer_shards
from cantata.trainer.optim.muon import Muon
from cantata.trainer.optim.tp import ShardedMatrix, TensorParallelMuon, tensor_parallel_matrices
from cantata.trainer.process_exit import exit_without_finalizing

pytestmark = pytest.mark.integration  # spawns 4 worker processes

STEPS = 20
RESUME_AT = 10
LR = 0.02
ALPHAS = (0.0, 0.5, 1.0)
BUCKET_ELEMENTS = 300
VOCAB, CONTEXT, WIDTH = 16, 6, 8
TP_SHAPES = ((16, 8, 0), (8, 16, 1), (24, 8, 0), (8, 8, 1), (32, 8, 0)) * 3
# (pipelined, capacity as a multiple of the largest matrix cost; None: the default, exactly the largest)
TP_CASES = ((True, None), (True, 8.0), (False, None))


class Block(nn.Module):
    """qkv has no bias: a key bias has an analytically zero gradient, and AdamW would turn its
    summation-order rounding noise into full-size steps that differ between runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH, bias=False), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(batch, length, 3, 2, WIDTH // 2).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def fresh_model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT()


def local_loss(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=generator)
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def train_distributed(model, optimizer, group, steps: range) -> None:
    rank = dist.get_rank(group)
    for step in steps:
        optimizer.zero_grad()
        local_loss(model, step, rank).backward()
        optimizer.step()


def tp_full_grad(step: int, index: int) -> torch.Tensor:
    rows, cols, _ = TP_SHAPES[index]
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(50 * step + index))


def tp_initial(index: int) -> torch.Tensor:
    rows, cols, _ = TP_SHAPES[index]
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(7 + index))


def run_tp(group, out: Path, case: str, pipelined: bool, capacity_scale: float | None) -> None:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    matrices = [
        ShardedMatrix(f"m{i}", tp_initial(i).chunk(world, dim=d)[rank].clone(), d, (r, c))
        for i, (r, c, d) in enumerate(TP_SHAPES)
    ]
    optimizer = TensorParallelMuon(matrices, process_group=group)
    if capacity_scale is not None:
        optimizer = TensorParallelMuon(matrices, process_group=group, capacity=optimizer.capacity * capacity_scale)
    for step in range(STEPS):
        for i, m in enumerate(matrices):
            m.shard.grad = tp_full_grad(step, i).chunk(world, dim=m.shard_dim)[rank].clone()
        if pipelined:
            optimizer.step(lr=LR, weight_decay=0.1)
        else:
            optimizer.step_synchronous(lr=LR, weight_decay=0.1)
    torch.save({m.name: m.shard for m in matrices}, out / f"{case}-rank{rank}.pt")
    torch.save(len(optimizer.groups), out / f"{case}-groups-rank{rank}.pt")


def fresh_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDTH, 32, bias=False), nn.GELU(), nn.Linear(32, WIDTH, bias=False),
        nn.Linear(WIDTH, 16, bias=False), nn.GELU(), nn.Linear(16, WIDTH, bias=False),
    )  # fmt: skip


def mlp_loss(mlp: nn.Module, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step)
    inputs, targets = torch.randn(4, WIDTH, generator=generator), torch.randn(4, WIDTH, generator=generator)
    return (mlp(inputs) - targets).pow(2).mean()


def run_tp_dtensor(mesh: DeviceMesh, out: Path, case: str) -> None:
    """A column-/row-parallel MLP built with DTensor's parallel styles, trained with TP-Canzona."""
    styles = {"0": ColwiseParallel(), "2": RowwiseParallel(), "3": ColwiseParallel(), "5": RowwiseParallel()}
    mlp = parallelize_module(fresh_mlp(), mesh, styles)
    optimizer = TensorParallelMuon(tensor_parallel_matrices(mlp), process_group=mesh.get_group())
    for step in range(STEPS):
        for param in mlp.parameters():
            param.grad = None
        mlp_loss(mlp, step).backward()
        optimizer.step(lr=LR, weight_decay=0.1)
    full = {name: cast(DTensor, param).full_tensor() for name, param in mlp.named_parameters()}
    if mesh.get_rank() == 0:
        torch.save(full, out / f"{case}.pt")


def save_params(model: nn.Module, path: Path) -> None:
    torch.save({name: p.detach().clone() for name, p in model.named_parameters()}, path)


def worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    groups = {2: pair, 4: dist.group.WORLD}
    meshes = {size: DeviceMesh("cpu", list(range(size))) for size in groups}
    for world_size, group in groups.items():
        if rank >= world_size:
            continue
        run_tp_dtensor(meshes[world_size], out, f"tp-dtensor-w{world_size}")
        for name, alpha in [("muon", a) for a in ALPHAS] + [("adamw", 1.0)]:
            model = fresh_model()
            optimizer = build_optimizer(
                model, name, lr=LR, process_group=group, alpha=alpha, bucket_elements=BUCKET_ELEMENTS
            )
            train_distributed(model, optimizer, group, range(STEPS))
            save_params(model, out / f"{name}-a{alpha}-w{world_size}-rank{rank}.pt")
        for pipelined, scale in TP_CASES:
            run_tp(group, out, f"tp-{pipelined}-{scale}-w{world_size}", pipelined, scale)
    for before, after in ((2, 4), (4, 2)):
        if rank < before:
            model = fresh_model()
            optimizer = build_optimizer(
                model, "muon", lr=LR, process_group=groups[before], bucket_elements=BUCKET_ELEMENTS
            )
            train_distributed(model, optimizer, groups[before], range(RESUME_AT))
            shard = optimizer.state_dict()
            torch.save(shard, out / f"ckpt-{before}to{after}-rank{rank}.pt")
            if rank == 0:
                save_params(model, out / f"ckpt-{before}to{after}-model.pt")
        dist.barrier()
        if rank < after:
            shards = [torch.load(out / f"ckpt-{before}to{after}-rank{r}.pt", weights_only=True) for r in range(before)]
            model = fresh_model()
            model.load_state_dict(torch.load(out / f"ckpt-{before}to{after}-model.pt", weights_only=True))
            optimizer = build_optimizer(
                model, "muon", lr=LR, process_group=groups[after], bucket_elements=BUCKET_ELEMENTS
            )
            optimizer.load_state_dict(merge_optimizer_shards(shards))
            train_distributed(model, optimizer, groups[after], range(RESUME_AT, STEPS))
            save_params(model, out / f"reshard-{before}to{after}-rank{rank}.pt")
        dist.barrier()
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("canzona")
    mp.spawn(worker, args=(4, str(out / "init"), str(out)), nprocs=4, join=True)
    return out


@functools.cache
def reference_params(name: str, ranks_per_step: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Single process: each step averages the gradients the ranks of that step would compute."""
    torch.set_num_threads(1)
    model = fresh_model()
    optimizer = build_optimizer(model, name, lr=LR)
    for step, ranks in enumerate(ranks_per_step):
        optimizer.zero_grad()
        (sum(local_loss(model, step, r) for r in range(ranks)) / ranks).backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def relative_error(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    diff = torch.sqrt(sum(((actual[n] - expected[n]).pow(2).sum() for n in expected), torch.zeros(())))
    norm = torch.sqrt(sum((expected[n].pow(2).sum() for n in expected), torch.zeros(())))
    return (diff / norm).item()


def assert_ranks_identical(paths: list[Path]) -> dict[str, torch.Tensor]:
    first = torch.load(paths[0], weights_only=True)
    for path in paths[1:]:
        other = torch.load(path, weights_only=True)
        assert all(torch.equal(first[n], other[n]) for n in first), f"{path.name} differs from rank 0"
    return first


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_dp_canzona_matches_single_process_muon(results, world_size, alpha):
    final = assert_ranks_identical([results / f"muon-a{alpha}-w{world_size}-rank{r}.pt" for r in range(world_size)])
    expected = reference_params("muon", (world_size,) * STEPS)
    assert relative_error(final, expected) <= 1e-5
    assert relative_error(final, {n: p.detach() for n, p in fresh_model().named_parameters()}) > 1e-2


@pytest.mark.parametrize("world_size", [2, 4])
def test_data_parallel_adamw_matches_single_process(results, world_size):
    final = assert_ranks_identical([results / f"adamw-a1.0-w{world_size}-rank{r}.pt" for r in range(world_size)])
    assert relative_error(final, reference_params("adamw", (world_size,) * STEPS)) <= 1e-5


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4)])
def test_resharded_checkpoint_resumes_exactly(results, before, after):
    final = assert_ranks_identical([results / f"reshard-{before}to{after}-rank{r}.pt" for r in range(after)])
    expected = reference_params("muon", (before,) * RESUME_AT + (after,) * (STEPS - RESUME_AT))
    assert relative_error(final, expected) <= 1e-5


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("pipelined", "capacity_scale"), TP_CASES)
def test_tp_canzona_matches_single_process_muon(results, world_size, pipelined, capacity_scale):
    case = f"tp-{pipelined}-{capacity_scale}-w{world_size}"
    shards = [torch.load(results / f"{case}-rank{r}.pt", weights_only=True) for r in range(world_size)]
    full = {f"m{i}": torch.cat([s[f"m{i}"] for s in shards], dim=d) for i, (_, _, d) in enumerate(TP_SHAPES)}
    params = [tp_initial(i).requires_grad_() for i in range(len(TP_SHAPES))]
    optimizer = Muon(params, lr=LR, weight_decay=0.1)
    for step in range(STEPS):
        for i, p in enumerate(params):
            p.grad = tp_full_grad(step, i)
        optimizer.step()
    assert relative_error(full, {f"m{i}": p.detach() for i, p in enumerate(params)}) <= 1e-5
    groups = torch.load(results / f"{case}-groups-rank0.pt", weights_only=True)
    assert (groups == 1) if capacity_scale == 8.0 else (groups > 1)


@pytest.mark.parametrize("world_size", [2, 4])
def test_tp_canzona_on_dtensor_parallel_mlp_matches_single_process_muon(results, world_size):
    mlp = fresh_mlp()
    optimizer = Muon(mlp.parameters(), lr=LR, weight_decay=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        mlp_loss(mlp, step).backward()
        optimizer.step()
    expected = {name: param.detach() for name, param in mlp.named_parameters()}
    final = torch.load(results / f"tp-dtensor-w{world_size}.pt", weights_only=True)
    assert relative_error(final, expected) <= 1e-5
    assert relative_error(final, {n: p.detach() for n, p in fresh_mlp().named_parameters()}) > 1e-2
