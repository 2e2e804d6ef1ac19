"""Does a D = 2 Trainer construction of qwen3-0.6b ever end in SIGABRT? Counted over repeated runs.

A SIGABRT ("terminate called without an active exception": a ``std::thread``
destroyed while still joinable) was once seen at the start of a dp_shard = 2
job. Each run here starts two fresh worker processes (``python THIS --rank``)
that do what a job's workers do up to training: a ``WorkerConfig`` of an
allreduce job over ``dp_shard = 2``, the strategy (gloo process group, mesh),
``Trainer(cfg, ...)``, then the strategy's close and a normal exit. The parent
records each process's exit status and whether its stderr holds the
``terminate called`` line. ``--path old`` runs the construction jobs used
before (the whole model on every rank, then sharded), patched in as in
``bench_memory.py``; ``--path unclosed`` runs the new one but exits with the
process group still open.

    .venv/bin/python benchmarks/init_abort_runs.py                 # 20 runs, new and old paths
    .venv/bin/python benchmarks/init_abort_runs.py --runs 3 --model qwen3-tiny --out /tmp/x

Writes ``benchmarks/results/bench_init_abort.json`` (one path: ``bench_init_abort_PATH.json``; ``--out``: that folder).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness

WORLD = 2
ABORT_LINE = "terminate called"


def _rank(rank: int, port: int, model: str, path: str, scratch: str) -> None:
    import bench_memory  # the worker config and the old path, shared with the memory benchmark

    from cantata.trainer import loop

    if path == "old":
        loop.build_sharded = bench_memory._old_build_sharded  # type: ignore[attr-defined]
    cfg = bench_memory.worker_config(model, WORLD, rank, port, Path(scratch))
    strategy = loop.AllReduce(cfg)
    loop.Trainer(cfg, None, threading.Event(), strategy)  # type: ignore[arg-type]
    if path != "unclosed":  # a worker closes its group in train()'s finally; "unclosed" exits with it open
        strategy.close()


def _run(model: str, path: str) -> dict:
    """One run: two worker processes; their exit statuses and whether either printed the abort line."""
    with tempfile.TemporaryDirectory() as scratch:
        port = bench_port()
        command = [
            sys.executable,
            __file__,
            "--model",
            model,
            "--path",
            path,
            "--scratch",
            scratch,
            "--port",
            str(port),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen([*command, "--rank", str(r)], stderr=subprocess.PIPE, text=True, env=env)
            for r in range(WORLD)
        ]
        began = time.perf_counter()
        outcomes = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    codes = [code for code, _ in outcomes]
    return {
        "exit_codes": codes,
        "aborted": any(code == -signal.SIGABRT for code in codes),
        "terminate_line": any(ABORT_LINE in err for _, err in outcomes),
        "failed": any(code != 0 for code in codes),
        "seconds": round(time.perf_counter() - began, 1),
        "stderr_tail": [err[-400:] for code, err in outcomes if code != 0],
    }


def bench_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--path", choices=("new", "old", "unclosed", "both"), default="both")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    harness.add_output_argument(parser)
    args = parser.parse_args()
    if args.rank is not None:
        _rank(args.rank, args.port, args.model, args.path, args.scratch)
        return
    paths = ("new", "old") if args.path == "both" else (args.path,)
    report: dict = {"model": args.model, "world": WORLD, "runs": args.runs, "paths": {}}
    for path in paths:
        runs = []
        for index in range(args.runs):
            runs.append(_run(args.model, path))
            print(f"{path} run {index + 1}/{args.runs}: exit codes {runs[-1]['exit_codes']}", flush=True)
        report["paths"][path] = {
            "aborted": sum(r["aborted"] for r in runs),
            "terminate_line": sum(r["terminate_line"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
            "succeeded": sum(not r["failed"] for r in runs),
            "runs": runs,
        }
    out = harness.output_dir(args.out, quick=False)
    name = "init_abort" if args.path == "both" else f"init_abort_{args.path}"
    print(f"wrote {harness.write_results(name, report, out)}")
    for path, counts in report["paths"].items():
        print(
            f"{path}: {counts['succeeded']}/{args.runs} clean, {counts['aborted']} SIGABRT, {counts['failed']} failed"
        )


if __name__ == "__main__":
    main()
