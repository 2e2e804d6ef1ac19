"""Submit → first training step of a 2-worker job: workers forked from a warm zygote vs. cold ones.

Two real servers run side by side on the same machine, one with
``warm_workers: true`` (the zygote imported torch, the training modules and
what AdamW imports lazily, and read the built-in corpus, before it forks) and
one with ``warm_workers: false`` (each forked worker imports and reads all of
it itself, as a freshly started ``python -m cantata.trainer.worker`` did
before). Both start workers through the same sandbox (allow-listed
environment, own uid as root, memory limit). Each trial submits one 2-worker
all-reduce job to each server, in alternating order, and times the tenant's
view: from the submit call to the first progress event (step 1), then cancels
the job and waits for its end. Medians and their ratio go to
``benchmarks/results/bench_worker_start.json``.

    python benchmarks/bench_worker_start.py [--trials N] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kit's real-server harness

from cantata.sdk.job import Job
from testkit.platform import Platform

JOB = dict(algorithm="allreduce", workers=2, model="gpt-tiny", steps=50, eval_every=1000, batch_size=4, seq_len=32)
CASES = {"cold": False, "warm": True}


def first_step(client) -> float:
    """Seconds from submit to the first progress event of a new 2-worker job; the job is cancelled after."""
    start = time.monotonic()
    handle = client.submit(Job(name="first-step", **JOB))
    for event in handle.events():
        if event.kind == "PROGRESS":
            seconds = time.monotonic() - start
            break
        if event.kind == "STATE" and event.state in ("FAILED", "CANCELLED", "SUCCEEDED"):
            raise RuntimeError(f"the job ended before its first step: {handle.status().reason}")
    client.cancel(handle.id)
    handle.wait()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2 trials")
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    trials = 2 if args.quick else args.trials
    platforms: dict[str, Platform] = {}
    clients = {}
    with tempfile.TemporaryDirectory(prefix="bench-worker-start-") as tmp:
        try:
            for name, warm in CASES.items():
                root = Path(tmp) / name
                root.mkdir()
                platform = platforms[name] = Platform(root)
                settings = platform.paths.load_settings()
                settings.warm_workers = warm
                platform.paths.save_settings(settings)
                platform.start()
                clients[name] = platform.enroll(f"bench-{name}")
            samples = harness.interleave(
                {name: (lambda trial, c=client: first_step(c)) for name, client in clients.items()},
                trials,
                warmup=1,
            )
        finally:
            for client in clients.values():
                client.close()
            for platform in platforms.values():
                if platform.proc is not None:
                    platform.stop()
    medians = harness.medians(samples)
    report = {
        "quick": args.quick,
        "trials": trials,
        "job": JOB,
        "seconds": {name: [round(s, 3) for s in values] for name, values in samples.items()},
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "cold_over_warm": round(medians["cold"] / medians["warm"], 2),
    }
    path = harness.write_results("worker_start", report, harness.output_dir(args.out, args.quick))
    print(f"cold {medians['cold']:.2f} s, warm {medians['warm']:.2f} s ({report['cold_over_warm']}×) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
