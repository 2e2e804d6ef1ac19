"""Asynchronous against synchronous checkpoints: how long a save stalls the training loop.

One process trains a stack of linear layers with AdamW on the CPU and saves
its ``TrainingState`` (model, optimizer, data position; every object sealed)
into a local store every ``--every`` steps, both ways in one run, interleaved:

- ``sync``: ``TrainingState.save``, sealing and uploading on the training thread;
- ``async``: ``AsyncSaver.start``: the state is copied to host memory on the
  training thread and sealed and uploaded on a background thread, committed at
  the next save or the end.

Reported per mode: the median stall of a save (the save call on the training
thread), the median step time between saves (an upload in the background
competes for the CPU) and the wall time of the whole run, saves and the last
commit included; the ratio sync/async of the stall.

    .venv/bin/python benchmarks/bench_async_checkpoint.py            # ~64 MiB of parameters
    .venv/bin/python benchmarks/bench_async_checkpoint.py --quick    # ~8 MiB

Writes benchmarks/results/bench_async_checkpoint.json (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import harness  # noqa: E402
import torch  # noqa: E402

from cantata.security.keys import JobKey, JobKeys  # noqa: E402
from cantata.storage import open_store  # noqa: E402
from cantata.trainer.async_checkpoint import AsyncSaver  # noqa: E402
from cantata.trainer.checkpoint import JobCheckpoints, Scope, TrainingState  # noqa: E402

SIZES = {"full": (1024, 16), "quick": (512, 8)}  # width, layers: width * width * 4 bytes * layers of parameters


class Position:
    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


def run(mode: str, trial: int, width: int, layers: int, steps: int, every: int, root: Path) -> dict:
    """Train ``steps`` steps saving every ``every``; the stall of each save and the time of each other step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    position = Position()
    job = f"{mode}-{trial}"
    keys = JobKeys("bench", job, {1: JobKey("bench", job, 1, os.urandom(32))})
    state = TrainingState(
        JobCheckpoints(open_store(f"file://{root}"), "bench", job, keys, keep_last=2),
        rank=0,
        process=0,
        group=None,
        commits=True,
    )
    state.register("model", Scope.LEAD, model)
    state.register("optim", Scope.RANK, optimizer)
    state.register("data", Scope.PROCESS, position)
    saver = AsyncSaver(state, all_done=lambda done: done) if mode == "async" else None
    batch = torch.randn(64, width)
    stalls, step_times = [], []
    began = time.perf_counter()
    for step in range(1, steps + 1):
        tick = time.perf_counter()
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        position.batches += 1
        step_times.append(time.perf_counter() - tick)
        if step % every == 0:
            tick = time.perf_counter()
            if saver is None:
                state.save(step)
            else:
                saver.start(step)
            stalls.append(time.perf_counter() - tick)
        elif saver is not None:
            saver.poll()
    if saver is not None:
        saver.finish()
    return {"stalls_s": stalls, "step_s": harness.median(step_times), "wall_s": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    harness.add_output_argument(parser)
    args = parser.parse_args()
    width, layers = SIZES["quick" if args.quick else "full"]
    torch.set_num_threads(1)  # the upload thread gets the other core, as a worker's would
    with tempfile.TemporaryDirectory() as root:
        samples = harness.interleave(
            {
                mode: (lambda trial, mode=mode: run(mode, trial, width, layers, args.steps, args.every, Path(root)))
                for mode in ("sync", "async")
            },
            args.trials,
            warmup=1,
        )
    modes = {
        mode: {
            "stall_s": harness.median(stall for run in runs for stall in run["stalls_s"]),
            "step_s": harness.median(run["step_s"] for run in runs),
            "wall_s": harness.median(run["wall_s"] for run in runs),
            "runs": runs,
        }
        for mode, runs in samples.items()
    }
    report = {
        "quick": args.quick,
        "parameters_mib": width * (width + 1) * layers * 4 / 2**20,
        "steps": args.steps,
        "every": args.every,
        "trials": args.trials,
        "store": "local",
        "modes": modes,
        "stall_ratio_sync_over_async": modes["sync"]["stall_s"] / modes["async"]["stall_s"],
    }
    for mode, numbers in modes.items():
        print(
            f"{mode:>5}: stall {numbers['stall_s']:.3f} s, step {numbers['step_s']:.3f} s, run {numbers['wall_s']:.2f} s"
        )
    print(f"stall ratio sync/async: {report['stall_ratio_sync_over_async']:.1f}x")
    out = harness.output_dir(args.out, args.quick)
    print(f"wrote {harness.write_results('async_checkpoint', report, out)}")


if __name__ == "__main__":
    main()
