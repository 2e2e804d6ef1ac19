"""Canzona benchmark: plan quality on Qwen3 shapes, and the distributed Muon step on gloo.

Part 1 (pure computation): NS-FLOPs max/mean, per-rank slice max/mean and
padded collective volume of the start-point plan, layer-wise ping-pong,
alpha in {0, 0.5, 1} and the ideal LPT packing, for Qwen3-0.6B/8B/32B at
D in {4, 8, 32, 64} with 400M-element buckets.

Part 1b (pure computation, real Qwen3 shapes, the job's default 40M-element
buckets): elements the DP step hands to its collectives over the gradient's,
padded reduce-scatter/all-gather (D x the largest slice of each bucket) against
the exact-size reduce/broadcast slices DP-Canzona issues (`owner_slices`); and
the plans of both cost units ("flops", "numel"), each scored in NS-FLOPs and
in elements max/mean.

Part 2 (gloo, one thread per process, Qwen3 shapes scaled down by 8): the
optimizer step of (i) redundant DDP compute, (ii) Moonlight (reduce-scatter,
all-gather of the full gradient, redundant compute), (iii) layer-wise
ping-pong ownership, (iv) alpha-balanced DP-Canzona, and (v) TP with a
synchronous all-gather baseline vs the micro-group pipeline. Compute is
per-rank thread CPU time, so it stays meaningful when processes share cores.

Part 3 (gloo, Qwen3-8B and -32B layer shapes scaled down by 8, `--fsdp-layers`
layers, each matrix an `nn.Linear` sharded by FSDP2's `fully_shard`): the
critical path of Canzona on DTensor (`ShardedMuon`, alpha=1) against redundant
Muon (every rank all-gathers every gradient and computes every matrix) and
Megatron's layer-wise ping-pong ownership run by the same engine.

Part 4 (one process, one full-size layer of Qwen3-8B and -32B): each
distinct matrix's Muon update is timed once with 1 Newton-Schulz iteration
(full-size Newton-Schulz with 5 iterations on every rank of a redundant
baseline takes far longer than this 2-core machine allows); the critical path
of redundant Muon, layer-wise ownership and Canzona (alpha=1, plans balanced
in "flops" and in "numel") at 2 and 4 ranks is the busiest rank's sum of
those times, with each plan's exact collective volume over the gradient.
``--quick`` runs Qwen3-8B only.

    .venv/bin/python benchmarks/bench_canzona.py            # all 36 layers of Qwen3-8B/8
    .venv/bin/python benchmarks/bench_canzona.py --quick    # 4 layers, 1 timed step

Writes ``benchmarks/results/bench_canzona.json`` and ``.png`` (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import harness
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from cantata.trainer.optim.buckets import build_buckets
from cantata.trainer.optim.cost import COST_UNITS, newton_schulz_flops, update_cost
from cantata.trainer.optim.dp import DataParallelMuon, collective_elements
from cantata.trainer.optim.muon import MuonConfig, apply_direction, muon_direction, muon_update_
from cantata.trainer.optim.partition import (
    alpha_balanced_plan,
    alpha_targets_plan,
    ideal_lpt_loads,
    layerwise_pingpong_plan,
    max_over_mean,
    start_point_plan,
)
from cantata.trainer.optim.profiling import StepStats, ring_bytes
from cantata.trainer.optim.qwen3 import qwen3_matrix_shapes
from cantata.trainer.optim.sharded import ShardedMuon, piece_box
from cantata.trainer.optim.tp import ShardedMatrix, TensorParallelMuon
from cantata.trainer.process_exit import exit_without_finalizing

PLAN_BUCKET = 400_000_000
SCALE_DOWN = 8
# Elements scale by SCALE_DOWN**2, so buckets shrink alike to keep the bucket count of the full model.
STEP_BUCKET = PLAN_BUCKET // SCALE_DOWN**2
LR, WEIGHT_DECAY = 0.02, 0.1
COLUMN_PARALLEL = (0, 0, 0, 1, 0, 0, 1)  # shard dim of q, k, v, o, gate, up, down


def plan_quality() -> list[dict]:
    rows = []
    for model in ("0.6B", "8B", "32B"):
        shapes = qwen3_matrix_shapes(model)
        numels = [r * c for r, c in shapes]
        costs = [newton_schulz_flops(s) for s in shapes]
        buckets = build_buckets(numels, PLAN_BUCKET)
        for world in (4, 8, 32, 64):
            plans = {
                "start-point": start_point_plan(buckets, world),
                "layer-wise": layerwise_pingpong_plan(buckets, world),
            }
            for alpha in (0.0, 0.5, 1.0):
                plans[f"alpha={alpha:g}"] = alpha_balanced_plan(buckets, costs, world, alpha)
                plans[f"alpha={alpha:g} (before start-point check)"] = alpha_targets_plan(buckets, costs, world, alpha)
            row = {"model": model, "D": world, "buckets": len(buckets), "plans": {}}
            for name, plan in plans.items():
                row["plans"][name] = {
                    "compute_max_over_mean": max_over_mean(plan.rank_costs(costs)),
                    "slice_max_over_mean": max_over_mean(plan.rank_elements()),
                    "padded_volume_over_total": plan.padded_elements() / sum(numels),
                }
            row["plans"]["ideal LPT"] = {"compute_max_over_mean": max_over_mean(ideal_lpt_loads(costs, world))}
            rows.append(row)
    return rows


JOB_BUCKET = 40_000_000  # the job's default canzona_bucket_elements


def collective_volume() -> list[dict]:
    """Elements one DP step hands to reduce-scatter (or reduce) over the gradient's, padded against exact."""
    rows = []
    for model in ("1.7B", "8B", "32B"):
        shapes = qwen3_matrix_shapes(model)
        numels = [r * c for r, c in shapes]
        costs = [newton_schulz_flops(s) for s in shapes]
        buckets = build_buckets(numels, JOB_BUCKET)
        for world in (8, 16, 32, 64):
            plan = alpha_balanced_plan(buckets, costs, world, 1.0)
            rows.append(
                {
                    "model": model,
                    "D": world,
                    "buckets": len(buckets),
                    "padded_over_gradient": plan.padded_elements() / sum(numels),
                    "exact_over_gradient": collective_elements(plan) / sum(numels),
                }
            )
    return rows


def cost_units() -> list[dict]:
    """Plans balanced in each cost unit, each scored in Newton-Schulz FLOPs and in elements."""
    rows = []
    for model in ("0.6B", "1.7B", "8B", "32B"):
        shapes = qwen3_matrix_shapes(model)
        numels = [r * c for r, c in shapes]
        flops = [update_cost(s, unit="flops") for s in shapes]
        buckets = build_buckets(numels, JOB_BUCKET)
        for world in (8, 64):
            for alpha in (0.5, 1.0):
                row = {"model": model, "D": world, "alpha": alpha, "units": {}}
                for unit in COST_UNITS:
                    plan = alpha_balanced_plan(buckets, [update_cost(s, unit=unit) for s in shapes], world, alpha)
                    row["units"][unit] = {
                        "flops_max_over_mean": max_over_mean(plan.rank_costs(flops)),
                        "elements_max_over_mean": max_over_mean(plan.rank_elements()),
                    }
                row["ideal_lpt_flops"] = max_over_mean(ideal_lpt_loads(flops, world))
                rows.append(row)
    return rows


REAL_NS_STEPS = 1  # Newton-Schulz iterations timed on the full-size matrices (5 take about 5 times as long)


def _matrix_seconds(shapes, config: MuonConfig) -> list[float]:
    """Thread CPU seconds of one Muon update (momentum, Newton-Schulz, scaling) per matrix, timed once per shape."""
    torch.set_num_threads(1)
    timed: dict[tuple[int, int], float] = {}
    generator = torch.Generator().manual_seed(0)
    for shape in shapes:
        key = (min(shape), max(shape))  # Newton-Schulz runs on the wide orientation either way
        if key in timed:
            continue
        grad = torch.randn(shape, generator=generator)
        momentum = torch.zeros(shape)
        start = time.thread_time()
        muon_direction(grad, momentum, config)
        timed[key] = time.thread_time() - start
        del grad, momentum
    return [timed[(min(s), max(s))] for s in shapes]


def real_shapes_step(models: tuple[str, ...], worlds: tuple[int, ...]) -> list[dict]:
    """The optimizer step's critical path on one full-size Qwen3 layer, per plan, from measured per-matrix times.

    Each distinct matrix shape of the layer is updated once in this process
    (``REAL_NS_STEPS`` Newton-Schulz iterations, thread CPU time). A plan's
    critical path is its busiest rank's sum of those times: redundant Muon
    runs every matrix on every rank (the sum of all), layer-wise ownership
    and Canzona (alpha=1, balanced in each cost unit) run each matrix on its
    owner only, with the plans that ``ShardedMuon`` builds from the job's
    40M-element buckets.
    """
    config = MuonConfig(ns_steps=REAL_NS_STEPS)
    rows = []
    for model in models:
        shapes = qwen3_matrix_shapes(model, layers=1)
        numels = [r * c for r, c in shapes]
        seconds = _matrix_seconds(shapes, config)
        flops = [update_cost(s, unit="flops") for s in shapes]
        buckets = build_buckets(numels, JOB_BUCKET)
        total = sum(seconds)
        for world in worlds:
            plans = {"layer-wise ownership": layerwise_pingpong_plan(buckets, world)}
            for unit in COST_UNITS:
                costs = [update_cost(s, unit=unit) for s in shapes]
                plans[f"Canzona α=1, {unit}"] = alpha_balanced_plan(buckets, costs, world, 1.0)
            row = {
                "model": model,
                "D": world,
                "matrix_seconds": seconds,
                "redundant_s": total,
                "ideal_s": total / world,
                "plans": {},
            }
            for name, plan in plans.items():
                critical = max(plan.rank_costs(seconds))
                row["plans"][name] = {
                    "critical_path_s": critical,
                    "speedup_over_redundant": total / critical,
                    "critical_path_over_ideal": critical * world / total,
                    "flops_max_over_mean": max_over_mean(plan.rank_costs(flops)),
                    "elements_max_over_mean": max_over_mean(plan.rank_elements()),
                    "exact_over_gradient": collective_elements(plan) / sum(numels),
                    "padded_over_gradient": plan.padded_elements() / sum(numels),
                }
            rows.append(row)
    return rows


def _grads(shapes, rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1 + rank)
    return [torch.randn(s, generator=generator) for s in shapes]


def _params(shapes) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=generator) * 0.02 for s in shapes]


def _redundant_ddp(params, momenta, config, world) -> StepStats:
    stats = StepStats()
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat.div_(world)
    stats.wire_bytes += 2 * ring_bytes(-(-flat.numel() // world), world, 4)
    offset = 0
    for param, momentum in zip(params, momenta, strict=True):
        grad = flat[offset : offset + param.numel()].view_as(param)
        offset += param.numel()
        with stats.computing():
            muon_update_(param, grad, momentum, lr=LR, weight_decay=WEIGHT_DECAY, config=config)
    return stats


def _moonlight(params, momenta, config, world) -> StepStats:
    stats = StepStats()
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    row = -(-flat.numel() // world)
    padded = torch.nn.functional.pad(flat, (0, row * world - flat.numel()))
    shard = flat.new_empty(row)
    dist.reduce_scatter_single(shard, padded)
    shard.div_(world)
    dist.all_gather_single(padded, shard)
    stats.wire_bytes += 2 * ring_bytes(row, world, 4)
    offset = 0
    for param, momentum in zip(params, momenta, strict=True):
        grad = padded[offset : offset + param.numel()].view_as(param)
        offset += param.numel()
        with stats.computing():
            muon_update_(param, grad, momentum, lr=LR, weight_decay=WEIGHT_DECAY, config=config)
    return stats


def _timed(step, steps: int) -> dict:
    """Run a warm-up step, then `steps` timed steps; summarize over ranks."""
    step()
    compute, wall, wire = 0.0, 0.0, 0
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        stats = step()
        dist.barrier()
        wall += time.perf_counter() - start
        compute += stats.compute_seconds
        wire += stats.wire_bytes
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (compute / steps, wall / steps, wire // steps))
    computes = [g[0] for g in gathered]
    return {
        "compute_max_s": max(computes),
        "compute_mean_s": sum(computes) / len(computes),
        "compute_per_rank_s": computes,
        "wall_s": max(g[1] for g in gathered),
        "wire_bytes_max": max(g[2] for g in gathered),
    }


def _step_worker(rank: int, world: int, init_file: str, out_file: str, layers: int, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    config = MuonConfig()
    shapes = qwen3_matrix_shapes("8B", scale_down=SCALE_DOWN, layers=layers)
    grads = _grads(shapes, rank)
    results = {}

    params = _params(shapes)
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    momenta = [torch.zeros_like(p) for p in params]
    results["(i) redundant (DDP)"] = _timed(functools.partial(_redundant_ddp, params, momenta, config, world), steps)
    results["(ii) Moonlight"] = _timed(functools.partial(_moonlight, params, momenta, config, world), steps)
    del momenta

    numels = [r * c for r, c in shapes]
    costs = [newton_schulz_flops(s) for s in shapes]
    buckets = build_buckets(numels, STEP_BUCKET)
    dp_plans = {
        "(iii) layer-wise ping-pong": layerwise_pingpong_plan(buckets, world),
        "start-point (ZeRO-1 geometry)": start_point_plan(buckets, world),
        "(iv) alpha=1 Canzona": alpha_balanced_plan(buckets, costs, world, 1.0),
        "(iv) alpha=0.5 Canzona": alpha_balanced_plan(buckets, costs, world, 0.5),
    }
    named = [(f"m{i}", p) for i, p in enumerate(params)]
    for label, plan in dp_plans.items():
        engine = DataParallelMuon(named, process_group=dist.group.WORLD, config=config, plan=plan)
        results[label] = _timed(functools.partial(engine.step, lr=LR, weight_decay=WEIGHT_DECAY), steps)
        del engine

    matrices = []
    for i, (shape, grad) in enumerate(zip(shapes, grads, strict=True)):
        dim = COLUMN_PARALLEL[i % len(COLUMN_PARALLEL)]
        shard = params[i].chunk(world, dim=dim)[rank].clone()
        shard.grad = grad.chunk(world, dim=dim)[rank].clone()
        matrices.append(ShardedMatrix(f"m{i}", shard, dim, shape))
    del params, grads
    tp = TensorParallelMuon(matrices, process_group=dist.group.WORLD, config=config)
    results["(v) TP sync all-gather"] = _timed(lambda: tp.step_synchronous(lr=LR, weight_decay=WEIGHT_DECAY), steps)
    tp.replicated_momentum.clear()
    results["(v) TP micro-group pipeline"] = _timed(lambda: tp.step(lr=LR, weight_decay=WEIGHT_DECAY), steps)
    results["(v) TP micro-group pipeline"]["micro_groups"] = len(tp.groups)
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def optimizer_step(world: int, layers: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out_file = Path(scratch) / "result.json"
        mp.spawn(_step_worker, args=(world, str(Path(scratch) / "init"), str(out_file), layers, steps), nprocs=world)
        results = json.loads(out_file.read_text())
    redundant = results["(i) redundant (DDP)"]
    ideal = redundant["compute_mean_s"] / world
    canzona = results["(iv) alpha=1 Canzona"]
    return {
        "D": world,
        "variants": results,
        "ideal_compute_s": ideal,
        "alpha1_critical_path_over_ideal": canzona["compute_max_s"] / ideal,
        "alpha1_compute_max_over_mean": canzona["compute_max_s"] / canzona["compute_mean_s"],
        "alpha1_speedup_over_redundant": redundant["compute_max_s"] / canzona["compute_max_s"],
        "target_speedup": 0.8 * world,
    }


@torch.no_grad()
def _redundant_fsdp(params, momenta, boxes, config) -> StepStats:
    """Every rank all-gathers every gradient, runs every matrix's update and keeps its own piece."""
    stats = StepStats()
    for param, momentum, box in zip(params, momenta, boxes, strict=True):
        full = param.grad.full_tensor()
        stats.collective_elements += param.grad.to_local().numel()
        with stats.computing():
            direction = muon_direction(full, momentum, config)
            apply_direction(param.to_local(), direction[box], lr=LR, weight_decay=WEIGHT_DECAY)
        stats.updated_matrices += 1
    return stats


def _fsdp_worker(rank: int, world: int, init_file: str, out_file: str, model: str, layers: int, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    config = MuonConfig()
    shapes = qwen3_matrix_shapes(model, scale_down=SCALE_DOWN, layers=layers)
    torch.manual_seed(0)
    linears = nn.ModuleList([nn.Linear(cols, rows, bias=False) for rows, cols in shapes])
    for linear in linears:
        fully_shard(linear, mesh=mesh)
    params = [linear.weight for linear in linears]
    boxes = [piece_box(p.shape, (world,), (rank,), p.placements) for p in params]
    for param, grad, box in zip(params, _grads(shapes, 0), boxes, strict=True):
        param.grad = DTensor.from_local(grad[box].contiguous(), mesh, param.placements)
    numels = [r * c for r, c in shapes]
    buckets = build_buckets(numels, STEP_BUCKET)
    named = [(f"m{i}", p) for i, p in enumerate(params)]
    results = {}
    momenta = [torch.zeros(p.shape) for p in params]
    results["redundant Muon"] = _timed(functools.partial(_redundant_fsdp, params, momenta, boxes, config), steps)
    del momenta
    engines = {
        "layer-wise ownership": ShardedMuon(named, mesh=mesh, plan=layerwise_pingpong_plan(buckets, world)),
        "Canzona α=1": ShardedMuon(named, mesh=mesh, bucket_elements=STEP_BUCKET),
    }
    for label, engine in engines.items():
        results[label] = _timed(functools.partial(engine.step, lr=LR, weight_decay=WEIGHT_DECAY), steps)
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def fsdp_step(model: str, world: int, layers: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out_file = Path(scratch) / "result.json"
        args = (world, str(Path(scratch) / "init"), str(out_file), model, layers, steps)
        mp.spawn(_fsdp_worker, args=args, nprocs=world)
        results = json.loads(out_file.read_text())
    redundant, canzona = results["redundant Muon"], results["Canzona α=1"]
    return {
        "model": model,
        "D": world,
        "variants": results,
        "canzona_speedup_over_redundant": redundant["compute_max_s"] / canzona["compute_max_s"],
        "canzona_speedup_over_layerwise": results["layer-wise ownership"]["compute_max_s"] / canzona["compute_max_s"],
        "canzona_critical_path_over_ideal": canzona["compute_max_s"] / (redundant["compute_mean_s"] / world),
    }


def plot(plans: list[dict], steps: list[dict], layers: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = ["start-point", "layer-wise", "alpha=0", "alpha=0.5", "alpha=1", "ideal LPT"]
    labels = [f"{r['model']} D={r['D']}" for r in plans if r["model"] != "0.6B"]
    chosen = [r for r in plans if r["model"] != "0.6B"]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        values = [r["plans"][name]["compute_max_over_mean"] for r in chosen]
        left.bar([i + k * width for i in range(len(chosen))], values, width, label=name)
    left.set_xticks([i + 0.4 for i in range(len(chosen))], labels, rotation=45, ha="right")
    left.set_yscale("log")
    left.set_ylabel("NS-FLOPs max/mean (log)")
    left.set_title("Plan quality, Qwen3, 400M-element buckets")
    left.legend(fontsize=7)
    variants = list(steps[0]["variants"])
    width = 0.8 / len(steps)
    for k, run in enumerate(steps):
        values = [run["variants"][v]["compute_max_s"] for v in variants]
        right.bar([i + k * width for i in range(len(variants))], values, width, label=f"D={run['D']} max compute")
        right.axhline(run["ideal_compute_s"], linestyle="--", color=f"C{k}", label=f"D={run['D']} ideal total/D")
    right.set_xticks([i + 0.4 for i in range(len(variants))], variants, rotation=35, ha="right", fontsize=7)
    right.set_ylabel("critical-path compute per step (s, CPU)")
    right.set_title(f"Optimizer step on gloo, Qwen3-8B/8, {layers} of 36 layers")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 layers and 1 timed step instead of 36 layers and 2")
    parser.add_argument("--layers", type=int, help="override the number of Qwen3-8B/8 layers")
    parser.add_argument("--fsdp-layers", type=int, default=2, help="layers of Qwen3-8B/8 and -32B/8 in part 3")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    layers = args.layers or (4 if args.quick else 36)
    steps = 1 if args.quick else 2
    plans = plan_quality()
    runs = [optimizer_step(world, layers, steps) for world in (2, 4)]
    fsdp = [fsdp_step(model, world, args.fsdp_layers, steps) for model in ("8B", "32B") for world in (2, 4)]
    real = real_shapes_step(("8B",) if args.quick else ("8B", "32B"), (2, 4))
    report = {
        "plan_quality": {"bucket_elements": PLAN_BUCKET, "rows": plans},
        "collective_volume": {"bucket_elements": JOB_BUCKET, "alpha": 1.0, "rows": collective_volume()},
        "cost_units": {"bucket_elements": JOB_BUCKET, "default": "flops", "rows": cost_units()},
        "fsdp_step": {
            "shapes": f"Qwen3 layer shapes scaled down by {SCALE_DOWN}",
            "layers": args.fsdp_layers,
            "timed_steps": steps,
            "bucket_elements": STEP_BUCKET,
            "backend": "gloo, CPU, one thread per process, FSDP2 fully_shard per matrix",
            "compute_clock": "thread CPU time",
            "runs": fsdp,
        },
        "real_shapes_step": {
            "layers": 1,
            "ns_steps": REAL_NS_STEPS,
            "bucket_elements": JOB_BUCKET,
            "compute_clock": "thread CPU time, one thread, each distinct shape timed once in one process",
            "rows": real,
        },
        "optimizer_step": {
            "model": f"Qwen3-8B scaled down by {SCALE_DOWN}",
            "layers": layers,
            "full_model_layers": 36,
            "quick": layers != 36,
            "timed_steps": steps,
            "bucket_elements": STEP_BUCKET,
            "backend": "gloo, CPU, one thread per process",
            "compute_clock": "thread CPU time",
            "runs": runs,
        },
    }
    out = harness.output_dir(args.out, args.quick)
    print(f"wrote {harness.write_results('canzona', report, out)}")
    plot(plans, runs, layers, harness.result_file(out, "canzona", ".png"))
    for r in real:
        cells = ", ".join(
            f"{n} {v['critical_path_s']:.2f}s ({v['speedup_over_redundant']:.2f}x)" for n, v in r["plans"].items()
        )
        print(f"real Qwen3-{r['model']} layer D={r['D']}: redundant {r['redundant_s']:.2f}s, {cells}")
    for run in fsdp:
        print(f"FSDP2 Qwen3-{run['model']}/8 D={run['D']}")
        for name, v in run["variants"].items():
            print(
                f"  {name:24s} compute max {v['compute_max_s']:.3f}s mean {v['compute_mean_s']:.3f}s wall {v['wall_s']:.3f}s"
            )
    for run in runs:
        print(f"D={run['D']}  ideal total/D = {run['ideal_compute_s']:.3f}s")
        for name, v in run["variants"].items():
            print(
                f"  {name:32s} compute max {v['compute_max_s']:.3f}s mean {v['compute_mean_s']:.3f}s "
                f"wall {v['wall_s']:.3f}s wire {v['wire_bytes_max'] / 2**20:.1f} MiB"
            )
        print(
            f"  alpha=1 critical path / ideal = {run['alpha1_critical_path_over_ideal']:.3f}; "
            f"speedup over redundant = {run['alpha1_speedup_over_redundant']:.2f}x "
            f"(target {run['target_speedup']:.1f}x)"
        )


if __name__ == "__main__":
    main()
