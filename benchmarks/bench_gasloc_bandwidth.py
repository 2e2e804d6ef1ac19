"""Heterogeneous bandwidth: DiLoCo against GASLoC when one link of a ring of 8 is 10x slower.

Training is ``bench_gasloc.py``'s (8 workers of a small GPT on
``builtin:pystdlib`` or ``--corpus pydoc-topics``, batched in one process, the
real ``cantata.trainer.gasloc`` outer rounds); wall-clock is modelled by ``bandwidth_model.py``, because 8 real
workers on this 2-core machine would serialize their compute.

Network (stated, all flags): every pair of workers has its own full-duplex link
of ``--fast-mb-s`` MB/s, except the ring link (0, 7), which runs at
``--slow-mb-s`` (10x slower); ``--latency-ms`` per message. Parameters travel
as float32 (no compression).

Compute: one local step of one worker takes ``--step-ms`` or, by default, the
fastest measured time of one batched inner step divided by the 8 workers.

Methods, at H local steps per round (outer settings as in ``bench_gasloc.OUTER``):
  diloco                complete graph (exact averaging) as a ring all-reduce in
                        worker order, so every round waits for the slow link:
                        ``2 (n-1)/n * bytes / slowest + 2 (n-1) * latency``
                        (an all-reduce whose ring order avoided the one slow
                        pair would escape it; the issue's setting assumes not)
  gasloc-ring           ring; each worker swaps with its two neighbours; the slow
                        swap delays workers 0 and 7, and the delay spreads one
                        hop per round because a swap starts only when both ends
                        are ready
  gasloc-ring-deadline  ring with the transport's per-round deadline
                        (``--deadline-ms``, default 3x a fast swap): a swap not
                        done by both ends' deadline is skipped on both ends (its
                        weight goes back to self, as in ``OuterStep.finish``)
                        and they wait out the deadline
  gasloc-one-peer       random one-peer matchings; the slow link costs only in
                        rounds where 0 and 7 are matched (every pair has a link)

Every method runs ``--steps`` inner steps (the equal-steps comparison); the
GASLoC methods then keep training until they have used DiLoCo's modelled
wall-clock (at most ``--max-steps-factor`` times the steps), which gives their
wall-clock to reach DiLoCo's final loss. Curves are evaluated after every
round and timed when the last worker finished that round.

Reported per method (mean over seeds): final validation loss at equal steps,
modelled wall-clock for those steps, wall-clock to reach DiLoCo's final loss
(seed-mean curve) and DiLoCo's time over it, bytes sent per worker.
``--validate-transport`` also runs 4 real ``GossipNode``s over mutual TLS on
loopback with per-link token buckets and compares measured swap times with
the model (tolerance ``VALIDATION_TOLERANCE``).

    .venv/bin/python benchmarks/bench_gasloc_bandwidth.py [--quick] [--seeds 3] [--local-steps 20 5]
                                                         [--validate-transport]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from bandwidth_model import Network, Round, allreduce_transfer, edge, gossip_transfers, schedule
from bench_gasloc import (
    CORPORA,
    WORKERS,
    StackedGPT,
    batches,
    inner_optimizer,
    load_text,
    outer_settings,
    validation_loss,
    worker_shards,
)

from cantata.trainer.gasloc import Simulator, make_topology

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("diloco", "gasloc-ring", "gasloc-ring-deadline", "gasloc-one-peer")
TOPOLOGY = {"diloco": "complete", "gasloc-ring": "ring", "gasloc-ring-deadline": "ring", "gasloc-one-peer": "one-peer"}
SLOW_EDGE = (0, WORKERS - 1)
VALIDATION_TOLERANCE = 0.2  # relative, for measured against modelled transport times


@dataclass(frozen=True)
class Setup:
    network: Network
    step_s: float  # one local step of one worker
    deadline_s: float
    nbytes: int  # one worker's parameters as float32


def inner_step(model: StackedGPT, inner: torch.optim.Optimizer, shards, generator: torch.Generator) -> None:
    """One AdamW step of every worker on its own batch."""
    x, y = batches(shards, generator)
    inner.zero_grad(set_to_none=True)
    model.losses(x, y).sum().backward()
    inner.step()


def measure_step_seconds(data, blocks: int = 5, steps_per_block: int = 10) -> float:
    """One worker's share of a batched inner step: the fastest block (least disturbed by other load) / workers."""
    train, _, vocab = data
    model = StackedGPT(vocab, seed=0)
    inner = inner_optimizer(model)
    generator = torch.Generator().manual_seed(0)
    shards = worker_shards(train, iid=True)
    inner_step(model, inner, shards, generator)
    times = []
    for _ in range(blocks):
        started = time.perf_counter()
        for _ in range(steps_per_block):
            inner_step(model, inner, shards, generator)
        times.append((time.perf_counter() - started) / steps_per_block)
    return min(times) / WORKERS


def plan(method: str, setup: Setup, local_steps: int, seed: int, rounds: int) -> list[Round]:
    """The modelled event times of ``rounds`` outer rounds of ``method``."""
    net = setup.network
    if method == "diloco":
        transfers = [[allreduce_transfer(net, setup.nbytes)]] * rounds
    else:
        topology = make_topology(TOPOLOGY[method], WORKERS, seed=seed)
        transfers = [gossip_transfers(net, topology.edges(t), setup.nbytes) for t in range(rounds)]
    deadline = setup.deadline_s if method == "gasloc-ring-deadline" else None
    return schedule(WORKERS, transfers, local_steps * setup.step_s, deadline)


def train(
    method: str, local_steps: int, seed: int, rounds: list[Round], data, iid: bool, outer: tuple[float, float]
) -> list[tuple]:
    """Train through ``rounds``; return ``(inner steps, modelled seconds, validation loss)`` after each."""
    train_text, val, vocab = data
    shards = worker_shards(train_text, iid)
    model = StackedGPT(vocab, seed)
    inner = inner_optimizer(model)
    eta, gamma = outer
    simulator = Simulator(make_topology(TOPOLOGY[method], WORKERS, seed=seed), outer_lr=eta, outer_momentum=gamma)
    generator = torch.Generator().manual_seed(1000 + seed)
    thetas = model.vectors()
    curve = [(0, 0.0, validation_loss(model, val))]
    for t, timing in enumerate(rounds):
        for _ in range(local_steps):
            inner_step(model, inner, shards, generator)
        thetas, _ = simulator.round(t, thetas, model.vectors(), cut=timing.skipped)
        model.load_vectors(thetas)
        curve.append(((t + 1) * local_steps, max(timing.finish), validation_loss(model, val)))
    return curve


def rounds_within(timings: list[Round], seconds: float, at_least: int) -> int:
    """How many rounds end by ``seconds`` (never fewer than ``at_least``)."""
    return max(at_least, sum(max(r.finish) <= seconds for r in timings))


def first_time_at_or_below(curve: list[tuple], target: float) -> float | None:
    """The modelled seconds of the first point of ``curve`` whose loss is at most ``target``."""
    return next((seconds for _, seconds, loss in curve if loss <= target), None)


def mean_curve(runs: list[dict]) -> list[tuple]:
    """``(steps, mean seconds, mean loss)`` over seeds, as far as every seed's curve goes."""
    length = min(len(r["curve"]) for r in runs)
    return [
        (
            runs[0]["curve"][k][0],
            statistics.mean(r["curve"][k][1] for r in runs),
            statistics.mean(r["curve"][k][2] for r in runs),
        )
        for k in range(length)
    ]


def summarize(runs: list[dict], steps: int) -> list[dict]:
    rows = []
    for h in sorted({r["H"] for r in runs}):
        diloco = [r for r in runs if r["H"] == h and r["method"] == "diloco"]
        target = statistics.mean(r["val_loss"] for r in diloco)
        diloco_seconds = statistics.mean(r["seconds_for_steps"] for r in diloco)
        for method in METHODS:
            mine = [r for r in runs if r["H"] == h and r["method"] == method]
            losses = [r["val_loss"] for r in mine]
            if method == "diloco":
                to_target, per_seed = diloco_seconds, [diloco_seconds] * len(mine)
            else:
                to_target = first_time_at_or_below(mean_curve(mine), target)
                per_seed = [first_time_at_or_below(r["curve"], target) for r in mine]
            rows.append(
                {
                    "method": method,
                    "H": h,
                    "seeds": len(mine),
                    "steps": steps,
                    "val_loss_mean": statistics.mean(losses),
                    "val_loss_std": statistics.stdev(losses),
                    "seconds_for_steps": statistics.mean(r["seconds_for_steps"] for r in mine),
                    "seconds_per_round_last": statistics.mean(r["seconds_per_round_last"] for r in mine),
                    "diloco_final_loss": target,
                    "seconds_to_diloco_loss": to_target,
                    "seconds_to_diloco_loss_per_seed": per_seed,
                    "diloco_over_method": diloco_seconds / to_target if to_target else None,
                    "steps_run": [r["curve"][-1][0] for r in mine],
                    "val_loss_at_diloco_seconds": statistics.mean(
                        [loss for _, s, loss in r["curve"] if s <= diloco_seconds * (1 + 1e-9)][-1] for r in mine
                    ),
                    "mb_sent_per_worker": statistics.mean(r["bytes_sent_per_worker"] for r in mine) / 1e6,
                    "skipped_edge_rounds": statistics.mean(r["skipped_edge_rounds"] for r in mine),
                }
            )
    return rows


def run_all(args, data, setup: Setup) -> list[dict]:
    runs = []
    for h in args.local_steps:
        rounds = args.steps // h
        budget = None
        for method in METHODS:
            for seed in range(args.seeds):
                if method == "diloco":
                    timings = plan(method, setup, h, seed, rounds)
                    budget = max(timings[-1].finish)
                else:
                    timings = plan(method, setup, h, seed, rounds * args.max_steps_factor)
                    timings = timings[: rounds_within(timings, budget, rounds)]
                started = time.perf_counter()
                curve = train(
                    method, h, seed, timings, data, iid=args.shards == "iid", outer=outer_settings(args.corpus, h)
                )
                equal = timings[:rounds]
                runs.append(
                    {
                        "method": method,
                        "H": h,
                        "seed": seed,
                        "val_loss": curve[rounds][2],
                        "curve": curve,
                        "seconds_for_steps": max(equal[-1].finish),
                        "seconds_per_round_last": max(equal[-1].finish) - max(equal[-2].finish),
                        "bytes_sent_per_worker": statistics.mean(sum(r.sent[i] for r in equal) for i in range(WORKERS)),
                        "skipped_edge_rounds": sum(len(r.skipped) for r in equal),
                        "cpu_seconds": time.perf_counter() - started,
                    }
                )
                print(
                    f"H={h:>2} {method:>21} seed {seed}: val {curve[rounds][2]:.3f} at {args.steps} steps, "
                    f"{max(equal[-1].finish):.2f} s modelled; ran {curve[-1][0]} steps "
                    f"({runs[-1]['cpu_seconds']:.0f} s)",
                    flush=True,
                )
    return runs


def validate_transport(
    payload_bytes: int = 4 << 20, fast: float = 20e6, slow: float = 2e6, chunk_bytes: int = 128 << 10, repeats: int = 3
) -> dict:
    """Time ring rounds of 4 real mTLS ``GossipNode``s whose link (0, 3) is capped 10x below the others.

    The model's swap time is ``latency + (payload - burst) / rate``: the latency
    is a measured round of one-chunk payloads (the transport's fixed cost on
    loopback) and the token bucket lets one chunk through as a burst. Then, with a deadline
    between the fast and the slow swap, 0 and 3 must skip each other and return
    at the deadline.
    """
    from cantata.security.pki import CertificateAuthority, Principal
    from cantata.trainer.gossip import GossipNode, gossip_server_name

    job, n = "bench-bandwidth", 4
    ca = CertificateAuthority.create()
    nodes = [
        GossipNode(
            i,
            job,
            ca.issue_bundle(
                Principal.worker(job, i),
                dns_names=[gossip_server_name(job, i)],
                lifetime=timedelta(hours=1),
                server=True,
            ),
            deadline_s=60.0,
            chunk_bytes=chunk_bytes,
        )
        for i in range(n)
    ]
    addresses = [node.start() for node in nodes]
    ring = [(i, (i + 1) % n) for i in range(n)]
    slow_edge = (0, n - 1)
    payloads = [torch.full((payload_bytes // 4,), float(i)) for i in range(n)]
    small = [torch.full((chunk_bytes // 4,), float(i)) for i in range(n)]
    counter = iter(range(1_000_000))

    def ring_round(sent, deadline_s=None):
        t = next(counter)
        elapsed, received = [0.0] * n, [None] * n

        def worker(i):
            peers = {j: addresses[j] for a, b in ring if i in (a, b) for j in (a, b) if j != i}
            started = time.perf_counter()
            received[i] = set(nodes[i].exchange(t, peers, sent[i], deadline_s=deadline_s))
            elapsed[i] = time.perf_counter() - started

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return elapsed, received

    try:
        ring_round(payloads)  # connections and TLS handshakes
        latency = statistics.median(statistics.median(ring_round(small)[0]) for _ in range(repeats))
        for a, b in ring:
            rate = slow if edge(a, b) == slow_edge else fast
            nodes[a].set_link_rate(b, rate)
            nodes[b].set_link_rate(a, rate)
        measured = [ring_round(payloads)[0] for _ in range(repeats)]
        model = Network(n, fast, latency, {slow_edge: slow})
        burst_free = payload_bytes - chunk_bytes
        predicted = [max(model.swap_seconds(a, b, burst_free) for a, b in ring if i in (a, b)) for i in range(n)]
        median = [statistics.median(m[i] for m in measured) for i in range(n)]
        slow_ends, fast_ends = [0, n - 1], [1, n - 2]
        measured_ratio = statistics.mean(median[i] for i in slow_ends) / statistics.mean(median[i] for i in fast_ends)
        model_ratio = predicted[0] / predicted[1]
        deadline = 3 * predicted[1]
        elapsed, received = ring_round(payloads, deadline_s=deadline)
    finally:
        for node in nodes:
            node.stop()
    skipped_ok = n - 1 not in received[0] and 0 not in received[n - 1] and all(len(received[i]) == 2 for i in fast_ends)
    errors = [abs(m - p) / p for m, p in zip(median, predicted, strict=True)]
    errors += [abs(measured_ratio - model_ratio) / model_ratio]
    errors += [abs(elapsed[i] - deadline) / deadline for i in slow_ends]
    return {
        "nodes": n,
        "payload_bytes": payload_bytes,
        "chunk_bytes": chunk_bytes,
        "fast_bytes_per_s": fast,
        "slow_bytes_per_s": slow,
        "slow_edge": slow_edge,
        "latency_seconds": latency,
        "measured_seconds": median,
        "modelled_seconds": predicted,
        "measured_slow_over_fast": measured_ratio,
        "modelled_slow_over_fast": model_ratio,
        "deadline_seconds": deadline,
        "deadline_round_seconds": elapsed,
        "deadline_round_peers": [sorted(r) for r in received],
        "max_relative_error": max(errors),
        "tolerance": VALIDATION_TOLERANCE,
        "passed": max(errors) <= VALIDATION_TOLERANCE and skipped_ok,
    }


def plot(runs: list[dict], rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = sorted({r["H"] for r in runs})
    fig, axes = plt.subplots(len(hs), 2, figsize=(12, 4 * len(hs)), squeeze=False)
    for (by_time, by_steps), h in zip(axes, hs, strict=True):
        target = next(r["diloco_final_loss"] for r in rows if r["H"] == h)
        for method in METHODS:
            curve = mean_curve([r for r in runs if r["H"] == h and r["method"] == method])
            by_time.plot([s for _, s, _ in curve], [loss for *_, loss in curve], label=method)
            by_steps.plot([k for k, _, _ in curve], [loss for *_, loss in curve], label=method)
        for ax, xlabel in ((by_time, "modelled wall-clock (s)"), (by_steps, "inner steps per worker")):
            ax.axhline(target, color="grey", linestyle=":", label="DiLoCo's final loss")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("validation loss")
            ax.set_ylim(top=min(3.5, ax.get_ylim()[1]))
            ax.set_title(f"H = {h}, ring of {WORKERS}, link {SLOW_EDGE} 10x slower")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="120 inner steps instead of 400")
    parser.add_argument("--steps", type=int, help="inner steps per worker (default 400)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, nargs="+", default=[20], help="H values (e.g. 20 5)")
    parser.add_argument(
        "--max-steps-factor",
        type=int,
        default=2,
        help="cap on GASLoC's steps within DiLoCo's wall-clock, as a multiple of --steps",
    )
    parser.add_argument("--corpus", choices=CORPORA, default="pystdlib")
    parser.add_argument("--shards", choices=("iid", "contiguous"), default="iid")
    parser.add_argument("--fast-mb-s", type=float, default=20.0, help="every link but the slow one, MB/s")
    parser.add_argument("--slow-mb-s", type=float, default=2.0, help="the ring link (0, 7), MB/s")
    parser.add_argument("--latency-ms", type=float, default=1.0, help="per message")
    parser.add_argument("--step-ms", type=float, help="one worker's local step (default: measured)")
    parser.add_argument("--deadline-ms", type=float, help="gossip round deadline (default: 3x a fast swap)")
    parser.add_argument(
        "--validate-transport",
        action="store_true",
        help="also time real mTLS GossipNodes with capped links against the model",
    )
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 (the table reports a standard deviation)")
    args.steps = args.steps or (120 if args.quick else 400)
    if any(args.steps % h or args.steps // h < 2 for h in args.local_steps):
        parser.error("--steps must be a multiple of every H, with at least 2 rounds")
    torch.set_num_threads(1)
    wall_started = time.perf_counter()
    data = load_text(args.corpus)
    nbytes = 4 * sum(p[0].numel() for p in StackedGPT(data[2], seed=0).params.values())
    network = Network(WORKERS, args.fast_mb_s * 1e6, args.latency_ms / 1e3, {SLOW_EDGE: args.slow_mb_s * 1e6})
    step_s = args.step_ms / 1e3 if args.step_ms else measure_step_seconds(data)
    deadline_s = args.deadline_ms / 1e3 if args.deadline_ms else 3 * network.swap_seconds(1, 2, nbytes)
    setup = Setup(network, step_s, deadline_s, nbytes)
    assumptions = {
        "workers": WORKERS,
        "parameter_bytes": nbytes,
        "fast_bytes_per_s": network.bandwidth,
        "slow_bytes_per_s": args.slow_mb_s * 1e6,
        "slow_edge": SLOW_EDGE,
        "latency_s": network.latency_s,
        "step_seconds": step_s,
        "step_seconds_source": "flag" if args.step_ms else "measured",
        "deadline_seconds": deadline_s,
        "fast_swap_seconds": network.swap_seconds(1, 2, nbytes),
        "slow_swap_seconds": network.swap_seconds(*SLOW_EDGE, nbytes),
        "diloco_allreduce_seconds": network.ring_allreduce_seconds(nbytes),
        "compute_seconds_per_round": {h: h * step_s for h in args.local_steps},
    }
    print(json.dumps(assumptions, indent=1))
    runs = run_all(args, data, setup)
    rows = summarize(runs, args.steps)
    validation = validate_transport() if args.validate_transport else None
    print(
        f"\n{args.steps} inner steps, {WORKERS} workers, {args.seeds} seeds; GASLoC continues up to DiLoCo's "
        f"wall-clock (at most {args.max_steps_factor}x the steps)"
    )
    print(
        "| H | method | val loss at equal steps | modelled s for the steps | s to DiLoCo's final loss "
        "| DiLoCo s / method s | val loss at DiLoCo's s | MB sent per worker |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        reached = f"{r['seconds_to_diloco_loss']:.2f}" if r["seconds_to_diloco_loss"] else "not reached"
        ratio = f"{r['diloco_over_method']:.2f}x" if r["diloco_over_method"] else "-"
        print(
            f"| {r['H']} | {r['method']} | {r['val_loss_mean']:.3f} ± {r['val_loss_std']:.3f} "
            f"| {r['seconds_for_steps']:.2f} | {reached} | {ratio} | {r['val_loss_at_diloco_seconds']:.3f} "
            f"| {r['mb_sent_per_worker']:.1f} |"
        )
    if validation:
        print("transport validation:", json.dumps(validation, indent=1))
    RESULTS.mkdir(exist_ok=True)
    total = time.perf_counter() - wall_started
    (RESULTS / "gasloc_bandwidth.json").write_text(
        json.dumps(
            {
                "steps": args.steps,
                "seeds": args.seeds,
                "corpus": args.corpus,
                "shards": args.shards,
                "max_steps_factor": args.max_steps_factor,
                "assumptions": assumptions,
                "rows": rows,
                "transport_validation": validation,
                "runs": runs,
                "benchmark_seconds": total,
            },
            indent=1,
        )
    )
    plot(runs, rows, RESULTS / "gasloc_bandwidth.png")
    print(f"wrote {RESULTS / 'gasloc_bandwidth.json'} and {RESULTS / 'gasloc_bandwidth.png'} ({total:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
