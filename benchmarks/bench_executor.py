"""The local executor vs the Ray executor on one machine: submit to first step, and draining a queue.

Two real servers run side by side: one with the local executor (workers
forked from its warm zygote), one with the Ray executor on a one-node Ray
cluster in a network namespace of its own (token authentication and TLS on,
as in the tests: needs root), the server beside it as the driver. Both give
a job 8 worker slots (the Ray node has 8 logical CPUs). Per executor:

- ``first_step``: from the submit call of a 2-worker all-reduce job to its
  first progress event (the tenant's view); interleaved trials, median.
- ``drain``: ``--jobs`` one-step, one-worker jobs submitted at once, timed
  until the last one ended SUCCEEDED; per-job overhead = drain time / jobs.

Ray's share is a placement group (it only reserves the bundles) and a few
calls to the node's host actor, which writes each worker's files and forks
it from its warm zygote, as the local executor's are forked from the
server's: no actor process starts for a job. Each side's overhead is
reported against the other's, per job and to the first step.

The namespace's resolver fails lookups at once (see ``testkit/raycluster.py``):
with the host's, out of reach there, torch's rendezvous waited out two 10 s
reverse lookups of the node's address, which no real node pays.

    python benchmarks/bench_executor.py [--trials N] [--jobs N] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kit's real-server and Ray-cluster harness

from cantata.sdk.job import Job
from cantata.server.executors.tokens import write_token
from testkit.platform import Platform, cli
from testkit.raycluster import RayCluster

FIRST = dict(algorithm="allreduce", workers=2, model="gpt-tiny", steps=50, eval_every=1000, batch_size=4, seq_len=32)
ONE_STEP = dict(algorithm="single", workers=1, model="gpt-tiny", steps=1, eval_every=1, eval_batches=1, batch_size=4)
SLOTS = 8


def first_step(client) -> float:
    """Seconds from submit to the first progress event of a new 2-worker job; the job is cancelled after."""
    start = time.monotonic()
    handle = client.submit(Job(name="first-step", **FIRST))
    for event in handle.events():
        if event.kind == "PROGRESS":
            seconds = time.monotonic() - start
            break
        if event.kind == "STATE" and event.state in ("FAILED", "CANCELLED", "SUCCEEDED"):
            raise RuntimeError(f"the job ended before its first step: {handle.status().reason}")
    client.cancel(handle.id)
    handle.wait()
    return seconds


def drain(client, jobs: int) -> float:
    """Seconds from submitting ``jobs`` one-step jobs at once until all of them SUCCEEDED."""
    start = time.monotonic()
    handles = [client.submit(Job(name=f"drain-{i}", **ONE_STEP)) for i in range(jobs)]
    for handle in handles:
        status = handle.wait()
        if status.state != "SUCCEEDED":
            raise RuntimeError(f"{handle.id} ended {status.state}: {status.reason}")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=100, help="one-step jobs drained from the queue")
    parser.add_argument("--quick", action="store_true", help="2 trials, 8 jobs")
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    trials, jobs = (2, 8) if args.quick else (args.trials, args.jobs)
    quota = dict(max_concurrent_jobs=jobs + 1, max_workers_per_job=SLOTS)
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
        root = Path(tmp)
        cluster = RayCluster(root / "cluster")
        platforms: dict[str, Platform] = {}
        clients = {}
        try:
            cluster.build_network(count=1)
            local = platforms["local"] = Platform(root / "local", settings={"max_workers_on_node": SLOTS})
            local.start()  # each Platform points CANTATA_HOME at its own: one after the other
            clients["local"] = local.enroll("bench-local", **quota)
            ray = platforms["ray"] = Platform(
                root / "ray",
                host=cluster.head.ip,
                settings={
                    "executor": "ray",
                    "ray_address": cluster.address,
                    "shared_roots": [str(root / "ray" / "data" / "checkpoints")],
                },
            )
            write_token(ray.paths.ray_token)
            node = cluster.head
            cli("cluster", "node-cert", "--data-dir", str(ray.data_dir), "--node-ip", node.ip, "--out", str(node.certs))
            cluster.start(ray.paths.ray_token, gpus=0, cpus=SLOTS)
            ray.env.update(cluster.node_env(node))
            ray.start(prefix=tuple(node.run()))
            clients["ray"] = ray.enroll("bench-ray", **quota)
            first = harness.interleave(
                {name: (lambda trial, c=client: first_step(c)) for name, client in clients.items()}, trials, warmup=1
            )
            drained = {name: drain(client, jobs) for name, client in clients.items()}
        finally:
            for client in clients.values():
                client.close()
            for platform in platforms.values():
                if platform.proc is not None:
                    platform.stop()
            cluster.teardown()
    first_median = harness.medians(first)
    per_job = {name: seconds / jobs for name, seconds in drained.items()}
    report = {
        "quick": args.quick,
        "trials": trials,
        "jobs": jobs,
        "slots": SLOTS,
        "first_step_job": FIRST,
        "drain_job": ONE_STEP,
        "first_step_s": {name: [round(s, 3) for s in values] for name, values in first.items()},
        "first_step_median_s": {name: round(v, 3) for name, v in first_median.items()},
        "first_step_ray_over_local": round(first_median["ray"] / first_median["local"], 2),
        "ray_first_step_overhead_s": round(first_median["ray"] - first_median["local"], 3),
        "drain_s": {name: round(v, 3) for name, v in drained.items()},
        "drain_per_job_s": {name: round(v, 3) for name, v in per_job.items()},
        "drain_ray_over_local": round(drained["ray"] / drained["local"], 2),
        "ray_overhead_per_job_s": round(per_job["ray"] - per_job["local"], 3),
    }
    path = harness.write_results("executor", report, harness.output_dir(args.out, args.quick))
    print(
        f"first step: local {first_median['local']:.2f} s, ray {first_median['ray']:.2f} s; "
        f"drain of {jobs}: local {drained['local']:.1f} s, ray {drained['ray']:.1f} s -> {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
