"""How many tasks (processes and threads) a real job's workers use: the measure behind ``worker_task_allowance``.

``RLIMIT_NPROC`` counts every task of a uid, and a job's workers on a node
share one, so the bound a worker gets is ``processes x (threads +
allowance)`` (:func:`cantata.security.worker_confinement.task_limit`). This
starts a real root-run server with no task limit (``worker_task_allowance:
0``), runs an all-reduce job and a decentralized (gossip) job of 2 workers
each to their end, and samples, every 20 ms, the tasks of all processes of
the job's uid. It reports the most seen at once, per job and per worker
process beyond its compute threads (``threads`` in its config), in
``benchmarks/results/bench_worker_tasks.json``.

    python benchmarks/measure_worker_tasks.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kit's real-server harness

from cantata.sdk.job import Job
from testkit.platform import Platform

COMMON = dict(workers=2, model="gpt-tiny", eval_every=20, checkpoint_every=20, batch_size=4, seq_len=32)
JOBS = {
    "allreduce": dict(algorithm="allreduce", steps=60, **COMMON),
    "diloco": dict(algorithm="diloco", local_steps=5, steps=60, **COMMON),
    "gasloc_2_ranks": dict(algorithm="gasloc", local_steps=5, steps=60, ranks_per_worker=2, **COMMON),
}


def uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def tasks_of_uid(uid: int) -> tuple[int, int]:
    """(tasks, processes) of ``uid`` now."""
    tasks = processes = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and uid_of(pid) == uid:
            try:
                tasks += len(os.listdir(f"/proc/{pid}/task"))
                processes += 1
            except OSError:
                continue
    return tasks, processes


def worker_uid(workspace: Path, stop: threading.Event) -> int:
    while not stop.is_set():
        if workspace.is_dir() and workspace.stat().st_uid != 0:
            return workspace.stat().st_uid
        stop.wait(0.02)
    return 0


def measure(platform: Platform, client, name: str, spec: dict) -> dict:
    handle = client.submit(Job(name=name, **spec))
    peak = {"tasks": 0, "processes": 0}
    stop = threading.Event()

    def sample() -> None:
        uid = worker_uid(platform.paths.jobs / handle.id, stop)
        while not stop.is_set():
            tasks, processes = tasks_of_uid(uid)
            if tasks > peak["tasks"]:
                peak.update(tasks=tasks, processes=processes)
            stop.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        status = handle.wait()
    finally:
        stop.set()
        sampler.join()
    if status.state != "SUCCEEDED":
        raise RuntimeError(f"{name} ended {status.state}: {status.reason}")
    worker_processes = spec["workers"] * spec.get("ranks_per_worker", 1)
    threads = max(1, (os.cpu_count() or 1) // worker_processes)  # what the local launcher gives each
    per_process = -(-peak["tasks"] // worker_processes)
    return {
        "spec": spec,
        "worker_processes": worker_processes,
        "compute_threads_per_process": threads,
        "peak_tasks_of_the_job_uid": peak["tasks"],
        "peak_tasks_per_process": per_process,
        "beyond_compute_threads_per_process": per_process - threads,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the all-reduce job only")
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("run as root: workers get a uid of their own only then", file=sys.stderr)
        return 1
    jobs = {"allreduce": JOBS["allreduce"]} if args.quick else JOBS
    with tempfile.TemporaryDirectory(prefix="measure-worker-tasks-") as tmp:
        platform = Platform(Path(tmp), settings={"worker_task_allowance": 0})
        platform.start()
        try:
            with platform.enroll("tasks") as client:
                results = {name: measure(platform, client, name, spec) for name, spec in jobs.items()}
        finally:
            platform.stop()
    report = {"machine": harness.machine(), "jobs": results}
    path = harness.write_results("worker_tasks", report, harness.output_dir(args.out, args.quick))
    for name, result in results.items():
        print(
            f"{name}: {result['peak_tasks_of_the_job_uid']} tasks at most for {result['worker_processes']} processes, "
            f"{result['beyond_compute_threads_per_process']} per process beyond its compute threads"
        )
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
