"""DiLoCo's all-reduce: the streamed one (``GossipNode.allreduce``) against the swap ring it replaced.

n worker processes on loopback, each with its own mutual-TLS ``GossipNode``,
sum a float32 vector of S bytes. ``streamed`` is the platform's all-reduce (one
``Reduce`` stream per pair of workers, direct reduce-scatter and all-gather
pipelined in chunks; see ``trainer/gossip/reduce.py``); ``ring`` is
``ring_allreduce`` over ``GossipNode.exchange``, 2(n-1) sequential swaps, each
a fresh exchange with a commit: what DiLoCo ran before. Both send 2(n-1)/n S
per worker. Methods are interleaved trial by trial, so load on the machine
hits them alike. An all-reduce's time is the slowest worker's, from a common
barrier; a row gives the median and the min/max over the trials that
succeeded (a failed all-reduce is counted, not timed), the per-worker
goodput 2(n-1)/n S / median, and the ratio ring / streamed of the medians.

    .venv/bin/python benchmarks/bench_allreduce.py [--quick]

Writes ``results/bench_allreduce.json`` (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import time
from datetime import timedelta

import harness

MIB = 1 << 20
JOB = "bench-allreduce"
METHODS = ("streamed", "ring")
STRIDE = 64  # exchange rounds per ring all-reduce (2(n-1) swaps at most)


def _worker(index, n, bundle, conn, barrier):
    import torch

    from cantata.trainer.gossip import GossipNode
    from cantata.trainer.gossip.allreduce import AllReduceFailed, ring_allreduce

    torch.set_num_threads(1)
    node = GossipNode(index, JOB, bundle, deadline_s=300.0)
    conn.send(node.start())
    book = conn.recv()
    others = {p: a for p, a in book.items() if p != index}
    while (command := conn.recv()) is not None:
        method, size, round_ = command
        vector = torch.full((size // 4,), float(index + 1))
        barrier.wait()
        start = time.perf_counter()
        try:
            if method == "streamed":
                total = node.allreduce(round_, others, vector).total
            else:

                def swap(step, payloads, round_=round_):
                    return node.exchange(round_ * STRIDE + step, {p: others[p] for p in payloads}, payloads)

                total = ring_allreduce(vector, sorted(book), index, swap)
        except AllReduceFailed:
            conn.send(math.inf)  # counted as a failure, not timed
            continue
        seconds = time.perf_counter() - start
        if not torch.equal(total, torch.full_like(vector, n * (n + 1) / 2)):
            raise RuntimeError(f"{method} all-reduce of worker {index} is wrong")
        conn.send(seconds)
    node.stop()


def measure(n: int, sizes: list[int], trials: int) -> list[dict]:
    from cantata.security.pki import CertificateAuthority, Principal, gossip_server_name

    ca = CertificateAuthority.create()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    pipes = [ctx.Pipe() for _ in range(n)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                i,
                n,
                ca.issue_bundle(
                    Principal.worker(JOB, i),
                    dns_names=[gossip_server_name(JOB, i)],
                    lifetime=timedelta(hours=2),
                    server=True,
                ),
                pipes[i][1],
                barrier,
            ),
        )
        for i in range(n)
    ]
    for p in procs:
        p.start()
    book = {i: pipes[i][0].recv() for i in range(n)}
    for i in range(n):
        pipes[i][0].send(book)
    rounds = iter(range(1, 1 << 30))

    def case(method: str, size: int):
        def run(trial: int) -> float:
            round_ = next(rounds)
            for i in range(n):
                pipes[i][0].send((method, size, round_))
            return max(pipes[i][0].recv() for i in range(n))

        return run

    samples = harness.interleave(
        {(method, size): case(method, size) for size in sizes for method in METHODS}, trials, warmup=1
    )
    for i in range(n):
        pipes[i][0].send(None)
    for p in procs:
        p.join(timeout=60)
    rows = []
    for size in sizes:
        done = {method: [t for t in samples[(method, size)] if math.isfinite(t)] for method in METHODS}
        medians = {method: statistics.median(done[method]) for method in METHODS}
        for method in METHODS:
            times = done[method]
            rows.append(
                {
                    "workers": n,
                    "size_mib": size / MIB,
                    "method": method,
                    "median_s": medians[method],
                    "min_s": min(times),
                    "max_s": max(times),
                    "trials": len(times),
                    "failed": len(samples[(method, size)]) - len(times),
                    "goodput_mb_per_s": 2 * (n - 1) / n * size / medians[method] / 1e6,
                    "ring_over_streamed": medians["ring"] / medians["streamed"],
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 4 only, 3 trials")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    out = harness.output_dir(args.out, args.quick)
    sizes = [1 * MIB, 16 * MIB]
    rows = []
    for n in (4,) if args.quick else (4, 8):
        rows += measure(n, sizes, 3 if args.quick else 5)
        for row in rows[-2 * len(sizes) :]:
            print(
                f"n={row['workers']} {row['size_mib']:>4.0f} MiB {row['method']:>8}: {row['median_s']:.3f} s "
                f"[{row['min_s']:.3f}, {row['max_s']:.3f}]  ring/streamed {row['ring_over_streamed']:.2f}x",
                flush=True,
            )
    path = harness.write_results("allreduce", {"rows": rows}, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
