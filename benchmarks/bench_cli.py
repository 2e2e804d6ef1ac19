"""CLI start-up: wall time of ``cantata`` commands next to ``python -c pass``, the interpreter's own start.

Run: .venv/bin/python benchmarks/bench_cli.py [--quick]

Each case is a fresh process, as a user runs it; the cases take turns
(``harness.interleave``) and the median of the trials is kept. The commands
that talk to a server do so to a real one over mutual TLS on loopback, started
here, as a tenant with one finished job (the cost measured is start-up,
connection and one call). The target of issue 22 is
at most 0.7 s for ``--help`` and for every command that only talks to the
server. Writes benchmarks/results/bench_cli.json (``--quick``: a temporary
folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testkit.platform: the test kit's real server

from testkit.platform import Platform  # noqa: E402

TARGET_S = 0.7
TRIALS, QUICK_TRIALS = 15, 3
CLI = [sys.executable, "-m", "cantata.sdk.cli"]
LOCAL = {  # commands that need no server
    "cantata --help": ["--help"],
    "cantata --version": ["--version"],
    "cantata jobs submit --help": ["jobs", "submit", "--help"],
    "cantata profile list": ["profile", "list"],
}
REMOTE = {  # commands that only talk to the server
    "cantata jobs list": ["jobs", "list", "--profile", "bench"],
    "cantata jobs status J --json": ["jobs", "status", "{job}", "--profile", "bench", "--json"],
    "cantata admin tenants list": ["admin", "tenants", "list", "--profile", "admin"],
    "cantata data sources list": ["data", "sources", "list", "--profile", "bench"],
}


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TRIALS} trials instead of {TRIALS}")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    trials = QUICK_TRIALS if args.quick else TRIALS
    with tempfile.TemporaryDirectory() as tmp:
        platform = Platform(Path(tmp))
        platform.start()
        try:
            from cantata.sdk import Job

            with platform.enroll("bench") as client:
                job = client.submit(Job(name="bench", steps=1, checkpoint_every=1, eval_every=1, batch_size=1))
                job.wait(timeout=300)
            env = {**platform.env, "PYTHONDONTWRITEBYTECODE": "1"}
            cases = {"python -c pass": lambda _: timed([sys.executable, "-c", "pass"], env)}
            for label, argv in {**LOCAL, **REMOTE}.items():
                command = CLI + [a.replace("{job}", job.id) for a in argv]
                cases[label] = lambda _, command=command: timed(command, env)
            samples = harness.interleave(cases, trials, warmup=1)
        finally:
            platform.stop()
    medians = harness.medians(samples)
    baseline = medians["python -c pass"]
    rows = [
        {
            "command": label,
            "talks_to_server": label in REMOTE,
            "median_s": round(medians[label], 4),
            "over_python_s": round(medians[label] - baseline, 4),
            "ratio": round(medians[label] / baseline, 2),
            "meets_target": medians[label] <= TARGET_S,
        }
        for label in samples
        if label != "python -c pass"
    ]
    report = {
        "quick": args.quick,
        "trials": trials,
        "target_s": TARGET_S,
        "baseline": {"command": "python -c pass", "median_s": round(baseline, 4)},
        "commands": rows,
        "cpus": os.cpu_count(),
    }
    path = harness.write_results("cli", report, harness.output_dir(args.out, args.quick))
    for r in rows:
        print(f"{r['command']:34} {r['median_s']:.3f} s  ({r['ratio']:.1f}x python -c pass)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
