"""Memory per rank of a job's worker processes at dp_shard = 1, 2, 4: at start (Trainer construction) and training.

Each run spawns D real processes (gloo on the CPU, one thread each) that do
what a job's workers do: a ``WorkerConfig`` of an allreduce job spec with
``dp_shard = D``, its strategy (process group and mesh), then
``Trainer(cfg, ...)``, the very construction a worker runs; then a few
optimizer steps of the job's AdamW on synthetic batches. Every rank reports
its peak RSS (VmHWM) after construction (the init peak), then, with the peak
reset (``/proc/self/clear_refs``), over the steps (the step peak), both above
its RSS before construction (the interpreter, torch, the process group), and
the bytes of its local parameters and AdamW state. Each peak is compared with
its shard of the training state, ``16 B x N / D`` (fp32 weights, gradients,
two moments).

Side by side, ``old`` runs the path jobs took before: the whole fp32 model
built on every rank (``build_model``), then sharded with ``parallelize``; it
is kept here only, patched into the Trainer for its run. At D = 1 there is no
mesh and both paths build the whole model, which is the shard.

    .venv/bin/python benchmarks/bench_memory.py            # qwen3-0.6b, 2 steps of 1 x 32 tokens
    .venv/bin/python benchmarks/bench_memory.py --quick    # qwen3-tiny, 1 step

Writes ``benchmarks/results/bench_memory.json`` (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import threading
from pathlib import Path

import harness
import torch
import torch.multiprocessing as mp

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.trainer import loop
from cantata.trainer.config import WorkerConfig
from cantata.trainer.model import build_model
from cantata.trainer.parallel import parallelize
from cantata.trainer.process_exit import exit_without_finalizing
from cantata.trainer.shards import local_block

RANKS = (1, 2, 4)
BATCH, SEQ = 1, 32
BYTES_PER_PARAMETER = 16  # fp32 weights, gradients, AdamW's two moments


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the present RSS


def _old_build_sharded(name, seed, mesh, precision, checkpointing):
    """The path before meta-device construction: the whole model on every rank, then sharded."""
    model = build_model(name, seed)
    parallelize(model, mesh, precision, checkpointing)
    return model


def worker_config(model: str, world: int, rank: int, port: int, store: Path) -> WorkerConfig:
    """What the launcher would write for rank ``rank`` of an allreduce job of ``model`` over ``dp_shard = world``."""
    spec = common_pb2.JobSpec(
        name="bench-memory",
        model=model,
        algorithm="allreduce",
        workers=world,
        dp_shard=world,
        steps=10,
        batch_size=BATCH,
        seq_len=SEQ,
        checkpoint_store=store.as_uri(),
    )
    jobfields.fill_defaults(spec)
    return WorkerConfig(
        job_id="bench",
        tenant="bench",
        worker=rank,
        workers=world,
        attempt=0,
        server="",
        ca=store,
        cert=store,
        key=store,
        rendezvous=f"tcp://127.0.0.1:{port}",
        threads=1,
        spec=spec,
        checkpoint_keys=None,  # type: ignore[arg-type]  # nothing is sealed here
        dataset_access=None,  # type: ignore[arg-type]  # the batches are synthetic
    )


def _local_bytes(tensors) -> int:
    return sum(local_block(t)[0].numel() * t.element_size() for t in tensors)


def _worker(rank: int, world: int, port: int, model: str, path: str, steps: int, scratch: str) -> None:
    if path == "old":
        loop.build_sharded = _old_build_sharded  # type: ignore[attr-defined]
    cfg = worker_config(model, world, rank, port, Path(scratch))
    torch.set_num_threads(cfg.threads)
    strategy = loop.AllReduce(cfg)
    before = _status_kib("VmRSS")
    _reset_peak()
    trainer = loop.Trainer(cfg, None, threading.Event(), strategy)  # type: ignore[arg-type]  # no server to report to
    init_peak = _status_kib("VmHWM")
    _reset_peak()
    vocab = trainer.model.cfg.vocab_size
    generator = torch.Generator().manual_seed(rank)
    trainer.optimizer.set_lr(cfg.spec.lr)
    for _ in range(steps):
        batch = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=generator)
        _, loss = trainer.model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
    step_peak = _status_kib("VmHWM")
    state = [v for s in trainer.optimizer.adamw.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    report = {
        "rank": rank,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "param_bytes": _local_bytes(trainer.model.parameters()),
        "optimizer_bytes": _local_bytes(state),
        "rss_before_bytes": before * 1024,
        "init_peak_bytes": (init_peak - before) * 1024,
        "step_peak_bytes": (step_peak - before) * 1024,
        "loss": loss.item(),
    }
    Path(scratch, f"rank{rank}.json").write_text(json.dumps(report))
    strategy.close()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(model: str, world: int, path: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(_worker, args=(world, _free_port(), model, path, steps, scratch), nprocs=world)
        ranks = [json.loads(Path(scratch, f"rank{r}.json").read_text()) for r in range(world)]
    state = BYTES_PER_PARAMETER * ranks[0]["parameters"] / world  # this rank's shard of the training state
    init, step = max(r["init_peak_bytes"] for r in ranks), max(r["step_peak_bytes"] for r in ranks)
    return {
        "D": world,
        "path": path,
        "shard_state_bytes": state,
        "init_peak_bytes": init,
        "step_peak_bytes": step,
        "init_over_shard_state": init / state,
        "step_over_shard_state": step / state,
        "ranks": ranks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="qwen3-tiny and 1 step")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    model, steps = ("qwen3-tiny", 1) if args.quick else ("qwen3-0.6b", 2)
    rows = [run(model, 1, "new", steps)]  # one rank: no mesh, the whole model is its shard
    for world in RANKS[1:]:
        rows += [run(model, world, "new", steps), run(model, world, "old", steps)]
    report = {
        "model": model,
        "parameters": rows[0]["ranks"][0]["parameters"],
        "batch": [BATCH, SEQ],
        "steps": steps,
        "quick": args.quick,
        "backend": "gloo, CPU, one thread per process, FSDP2 (fully_shard per layer and root), fp32, AdamW",
        "measure": "peak RSS (VmHWM) above the RSS before Trainer construction, largest rank",
        "target": "init peak <= 1.3 x the rank's shard of the training state (16 B x N / D)",
        "rows": rows,
    }
    out = harness.output_dir(args.out, args.quick)
    print(f"wrote {harness.write_results('memory', report, out)}")
    for r in rows:
        print(
            f"D={r['D']} {r['path']}: shard state {r['shard_state_bytes'] / 2**30:.2f} GiB, "
            f"init peak {r['init_peak_bytes'] / 2**30:.2f} GiB ({r['init_over_shard_state']:.2f}x), "
            f"step peak {r['step_peak_bytes'] / 2**30:.2f} GiB ({r['step_over_shard_state']:.2f}x)"
        )


if __name__ == "__main__":
    main()
