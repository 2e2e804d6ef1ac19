"""Memory per rank of one decoder under FSDP2 at dp_shard = 1, 2, 4, on real gloo CPU processes.

Each run spawns D processes (one thread each) that build the decoder on the
meta device, shard it with the trainer's own ``parallelize`` on a
``dp_shard = D`` mesh, materialise and initialise each rank's shards, then
train a few AdamW steps (``build_optimizer(model, "adamw")``). Every rank
reports the bytes of its local shards of the parameters, the gradients and
AdamW's state (exp_avg, exp_avg_sq, step), and its peak RSS (VmHWM, which
includes the interpreter and torch, activations and the layer that FSDP2
all-gathers for compute). The ratio ``bytes(D) · D / bytes(1)`` is 1.0 when a
part scales exactly as 1/D.

    .venv/bin/python benchmarks/bench_memory.py            # the ~27M-parameter decoder below, 3 steps
    .venv/bin/python benchmarks/bench_memory.py --quick    # llama-tiny, 1 step

Writes ``benchmarks/results/bench_memory.json`` and ``.png`` (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import warnings
from pathlib import Path

import harness
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.decoder import Decoder, DecoderConfig
from cantata.trainer.model import MODELS
from cantata.trainer.optim import build_optimizer
from cantata.trainer.parallel import Parallelism, data_rank, parallelize

# Llama-shaped, about 27M parameters: 430 MB of fp32 parameters, gradients and AdamW moments on one rank.
DECODER = DecoderConfig(
    dim=512, n_layers=6, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536, vocab_size=8192,
    block_size=256, rope_theta=10000.0, norm_eps=1e-6, tie_embeddings=False, qk_norm=False,
)  # fmt: skip
BATCH, SEQ = 8, 128
RANKS = (1, 2, 4)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _worker(rank: int, world: int, init_file: str, out_file: str, cfg: DecoderConfig, steps: int) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="DTensor random operators")  # init only: values do not matter here
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = Parallelism(1, world, 1).mesh()
    baseline_kib = _rss_kib("VmRSS")
    with torch.device("meta"):
        model = Decoder(cfg)
    parallelize(model, mesh, MixedPrecision.FP32, checkpointing=False)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters()
    optimizer = build_optimizer(model, "adamw", lr=1e-3)
    index, count = data_rank(mesh)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = torch.randint(0, cfg.vocab_size, (BATCH, SEQ + 1), generator=generator).chunk(count)[index]
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        grads = _local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()
    state = [v for s in optimizer.adamw.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    report = {
        "rank": rank,
        "param_bytes": _local_bytes(model.parameters()),
        "grad_bytes": grads,
        "optimizer_bytes": _local_bytes(state),
        "baseline_rss_bytes": baseline_kib * 1024,
        "peak_rss_bytes": _rss_kib("VmHWM") * 1024,
        "loss": loss.item(),
    }
    gathered: list = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        Path(out_file).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def run(cfg: DecoderConfig, world: int, steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as scratch:
        out_file = Path(scratch) / "ranks.json"
        mp.spawn(_worker, args=(world, str(Path(scratch) / "init"), str(out_file), cfg, steps), nprocs=world)
        return json.loads(out_file.read_text())


PARTS = ("param_bytes", "grad_bytes", "optimizer_bytes", "peak_rss_bytes")


def summarize(runs: dict[int, list[dict]]) -> list[dict]:
    """Per D: the largest rank's bytes of each part, and that over the ideal bytes(1)/D."""
    single = {part: runs[1][0][part] for part in PARTS}
    rows = []
    for world, ranks in runs.items():
        row = {"D": world, "ranks": ranks}
        for part in PARTS:
            largest = max(r[part] for r in ranks)
            row[part] = largest
            row[part.replace("_bytes", "_over_ideal")] = largest * world / single[part]
        states = [r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"] for r in ranks]
        row["state_bytes"] = max(states)
        row["state_over_ideal"] = max(states) * world / sum(single[p] for p in PARTS[:3])
        row["peak_rss_above_baseline_bytes"] = max(r["peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ranks)
        rows.append(row)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    ranks = [r["D"] for r in rows]
    labels = {
        "param_bytes": "parameters",
        "grad_bytes": "gradients",
        "optimizer_bytes": "AdamW state",
        "peak_rss_above_baseline_bytes": "peak RSS above baseline",
    }
    for part, label in labels.items():
        axis.plot(ranks, [r[part] / 2**20 for r in rows], marker="o", label=label)
    ideal = rows[0]["state_bytes"] / 2**20
    axis.plot(ranks, [ideal / d for d in ranks], linestyle="--", color="grey", label="params+grads+state, ideal 1/D")
    axis.set_xscale("log", base=2)
    axis.set_xticks(ranks, [str(d) for d in ranks])
    axis.set_xlabel("dp_shard (ranks)")
    axis.set_ylabel("MiB per rank (largest rank)")
    axis.set_title("FSDP2 memory per rank, gloo CPU processes")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="llama-tiny and 1 step")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    cfg = MODELS["llama-tiny"] if args.quick else DECODER
    assert isinstance(cfg, DecoderConfig)
    steps = 1 if args.quick else 3
    runs = {world: run(cfg, world, steps) for world in RANKS}
    rows = summarize(runs)
    report = {
        "model": "llama-tiny" if args.quick else "Llama-shaped decoder",
        "config": dataclasses.asdict(cfg),
        "parameters": runs[1][0]["param_bytes"] // 4,
        "batch": [BATCH, SEQ],
        "steps": steps,
        "quick": args.quick,
        "backend": "gloo, CPU, one thread per process, FSDP2 (fully_shard per layer and root), fp32",
        "rows": rows,
    }
    out = harness.output_dir(args.out, args.quick)
    print(f"wrote {harness.write_results('memory', report, out)}")
    plot(rows, harness.result_file(out, "memory", ".png"))
    for r in rows:
        print(
            f"D={r['D']}: params {r['param_bytes'] / 2**20:.1f} MiB ({r['param_over_ideal']:.3f}x ideal), "
            f"grads {r['grad_bytes'] / 2**20:.1f} ({r['grad_over_ideal']:.3f}x), "
            f"AdamW {r['optimizer_bytes'] / 2**20:.1f} ({r['optimizer_over_ideal']:.3f}x), "
            f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB ({r['peak_rss_over_ideal']:.2f}x), "
            f"above baseline {r['peak_rss_above_baseline_bytes'] / 2**20:.0f} MiB"
        )


if __name__ == "__main__":
    main()
