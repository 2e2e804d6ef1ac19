"""Training tokens per second of llama-tiny under DDP, FSDP2 and FSDP2+TP on gloo CPU processes.

For 2 and 4 ranks, one set of processes (one thread each) trains the same
model three ways, side by side and interleaved (``harness.interleave``):
torch's ``DistributedDataParallel`` over a replicated model; FSDP2 on a
``dp_shard = D`` mesh; and FSDP2 with tensor parallelism on a
``dp_shard = D/2, tp = 2`` mesh (the trainer's own ``parallelize``). Each
variant takes the same global batch, split over its data-parallel ranks, and
the same AdamW (``torch.optim.AdamW``). A trial is ``--steps`` steps between
barriers; tokens/s is the global batch's tokens over the median trial.

This measures CPU processes sharing 2 cores: communication and Python
overhead dominate a model this small, so the ratios say what the sharding
costs here, not what it gains on GPUs (``benchmarks/gpu_mfu.py`` is for that).

    .venv/bin/python benchmarks/bench_throughput.py            # 5 trials of 4 steps
    .venv/bin/python benchmarks/bench_throughput.py --quick    # 1 trial of 2 steps

Writes ``benchmarks/results/bench_throughput.json`` and ``.png`` (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import harness
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.model import build_model
from cantata.trainer.parallel import Parallelism, data_rank, parallelize
from cantata.trainer.process_exit import exit_without_finalizing

MODEL = "llama-tiny"
GLOBAL_BATCH, SEQ = 16, 256
RANKS = (2, 4)
VARIANTS = ("DDP", "FSDP2", "FSDP2+TP")


def _setup(variant: str, world: int):
    """The model, its optimizer and this rank's (index, count) among the data-parallel ranks."""
    model = build_model(MODEL, seed=0)
    if variant == "DDP":
        wrapped = DistributedDataParallel(model)
        return wrapped, torch.optim.AdamW(model.parameters(), lr=1e-3), (dist.get_rank(), world)
    mesh = Parallelism(1, world, 1).mesh() if variant == "FSDP2" else Parallelism(1, world // 2, 2).mesh()
    parallelize(model, mesh, MixedPrecision.FP32, checkpointing=False)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), data_rank(mesh)


def _worker(rank: int, world: int, init_file: str, out_file: str, steps: int, trials: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    setups = {variant: _setup(variant, world) for variant in VARIANTS}
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 512, (GLOBAL_BATCH, SEQ + 1), generator=generator) for _ in range(steps)]
    losses: dict[str, float] = {}

    def case(variant: str):
        model, optimizer, (index, count) = setups[variant]

        def trial(_: int) -> float:
            dist.barrier()
            start = time.perf_counter()
            for batch in batches:
                part = batch.chunk(count)[index]
                _, loss = model(part[:, :-1], part[:, 1:])
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            dist.barrier()
            losses[variant] = loss.item()
            return time.perf_counter() - start

        return trial

    samples = harness.interleave({v: case(v) for v in VARIANTS}, trials, warmup=1)
    if rank == 0:
        Path(out_file).write_text(json.dumps({"samples": samples, "losses": losses}))
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def run(world: int, steps: int, trials: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out_file = Path(scratch) / "result.json"
        mp.spawn(_worker, args=(world, str(Path(scratch) / "init"), str(out_file), steps, trials), nprocs=world)
        result = json.loads(out_file.read_text())
    tokens = GLOBAL_BATCH * SEQ * steps
    seconds = harness.medians(result["samples"])
    rates = {v: tokens / seconds[v] for v in VARIANTS}
    return {
        "D": world,
        "meshes": {
            "DDP": f"{world} replicas",
            "FSDP2": f"dp_shard={world}",
            "FSDP2+TP": f"dp_shard={world // 2}, tp=2",
        },
        "trial_seconds": result["samples"],
        "tokens_per_s": rates,
        "over_ddp": {v: rates[v] / rates["DDP"] for v in VARIANTS},
        "last_loss": result["losses"],
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(VARIANTS)
    for k, variant in enumerate(VARIANTS):
        axis.bar(
            [i + k * width for i in range(len(rows))], [r["tokens_per_s"][variant] for r in rows], width, label=variant
        )
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [f"{r['D']} ranks" for r in rows])
    axis.set_ylabel("training tokens/s")
    axis.set_title(f"{MODEL} on gloo CPU processes (2 shared cores)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 trial of 2 steps")
    parser.add_argument("--steps", type=int, help="steps per trial (default 4; --quick: 2)")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    steps = args.steps or (2 if args.quick else 4)
    trials = 1 if args.quick else 5
    rows = [run(world, steps, trials) for world in RANKS]
    report = {
        "model": MODEL,
        "global_batch": [GLOBAL_BATCH, SEQ],
        "steps_per_trial": steps,
        "trials": trials,
        "quick": args.quick,
        "backend": "gloo, CPU, one thread per process, fp32, AdamW",
        "rows": rows,
    }
    out = harness.output_dir(args.out, args.quick)
    print(f"wrote {harness.write_results('throughput', report, out)}")
    plot(rows, harness.result_file(out, "throughput", ".png"))
    for r in rows:
        cells = ", ".join(f"{v} {r['tokens_per_s'][v]:.0f} tok/s ({r['over_ddp'][v]:.2f}x)" for v in VARIANTS)
        print(f"{r['D']} ranks: {cells}")


if __name__ == "__main__":
    main()
