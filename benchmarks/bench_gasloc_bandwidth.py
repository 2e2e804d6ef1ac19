"""Decentralized training on a real shaped network: DiLoCo (ring all-reduce) against GASLoC, in wall-clock.

Needs root (as CI has): it creates its own network, and always removes it.
Every worker is a real process (``netns_worker.py``) in its own network
namespace (``ip netns``), joined to the others by a veth pair on one bridge.
Each namespace's egress is shaped by the kernel: ``tc htb`` with one class per
destination (``u32 match ip dst``), under one parent class for the uplink.
The workers run the platform's own mutual-TLS gossip transport, outer step,
ring all-reduce, adaptive round deadline and time-budget rule (see
``netns_worker.py``); nothing about time is modelled.

Scenarios (links at ``--fast-mbit``, 160 mbit = 20 MB/s, unless said):
  uniform        every link fast
  slow-link      the ring link (0, n-1) at ``--slow-mbit`` (16 mbit = 2 MB/s) both ways
  slow-uplink    worker 0's whole egress shares ``--slow-mbit``
  slow-compute   worker 0 computes 3x slower (each step sleeps twice its own time)
  slow-compute-budget   the same, with time-budgeted rounds: every worker gets the
                 time a fast worker's median H steps took in the slow-compute run

Methods: diloco (ring all-reduce, in worker order, so the slow link is on the
ring), gasloc-ring, gasloc-one-peer, gasloc-two-peer; all with (eta, gamma) =
(1.0, 0.5), H = ``--local-steps``, ``--rounds`` rounds, a fixed round
deadline (``--deadline-s``), then the final consensus all-reduce. Reported per (scenario, method), mean over seeds: the
wall-clock of the rounds (the slowest worker's), of the consensus, the
consensus's validation loss, the mean of the workers' own, bytes each worker
sent (serialized gRPC messages), inner steps per round of the slow worker and
of the others; and loss against wall-clock plots.

    sudo nice .venv/bin/python benchmarks/bench_gasloc_bandwidth.py [--quick] [--seeds 3] [--rounds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import harness

from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.gossip import gossip_server_name

METHODS = ("diloco", "gasloc-ring", "gasloc-one-peer", "gasloc-two-peer")
SCENARIOS = ("uniform", "slow-link", "slow-uplink", "slow-compute", "slow-compute-budget")
SLOWDOWN = 3.0
JOB = "bench-netns"
PORT = 7100
HERE = Path(__file__).resolve().parent


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


class ShapedNetwork:
    """``n`` namespaces on one bridge, each with its own shaped egress; removed on ``close``."""

    def __init__(self, n: int, fast_mbit: int, slow_mbit: int):
        self.n, self.fast, self.slow = n, fast_mbit, slow_mbit
        tag = f"cg{os.getpid() % 10000}"
        self.bridge, self.ns = f"{tag}br", [f"{tag}n{i}" for i in range(n)]
        self.ifs = [f"{tag}p{i}" for i in range(n)]
        self.ips = [f"10.{77 + os.getpid() % 100}.0.{i + 1}" for i in range(n)]
        self._made: list[tuple[str, ...]] = []

    def open(self) -> ShapedNetwork:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._made.append(("ip", "link", "del", self.bridge))
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, inner, outer = self.ns[i], self.ifs[i], f"{self.ifs[i]}h"
            sh("ip", "netns", "add", ns)
            self._made.append(("ip", "netns", "del", ns))
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "master", self.bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ips[i]}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def shape(self, scenario: str) -> None:
        """Per namespace: htb root, one uplink class, one class per destination under it."""
        n = self.n
        for i in range(n):
            tc = ("ip", "netns", "exec", self.ns[i], "tc")
            dev = self.ifs[i]
            subprocess.run((*tc, "qdisc", "del", "dev", dev, "root"), capture_output=True)
            sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "999")
            uplink = self.slow if scenario == "slow-uplink" and i == 0 else 10 * self.fast
            sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", f"{uplink}mbit")
            sh(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", "1:999", "htb", "rate", f"{uplink}mbit")
            for j in range(n):
                if j == i:
                    continue
                slow = scenario == "slow-link" and {i, j} == {0, n - 1}
                rate = min(self.slow if slow else self.fast, uplink)
                sh(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{10 + j}", "htb", "rate",
                   f"{rate}mbit", "ceil", f"{rate}mbit")  # fmt: skip
                sh(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
                   "ip", "dst", f"{self.ips[j]}/32", "flowid", f"1:{10 + j}")  # fmt: skip

    def close(self) -> None:
        for undo in reversed(self._made):
            subprocess.run(undo, capture_output=True)
        self._made.clear()


class Workers:
    """The worker processes, one per namespace, started once for every run."""

    def __init__(self, net: ShapedNetwork, certs: Path):
        addresses = ",".join(f"{ip}:{PORT}" for ip in net.ips)
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        self.procs = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    str(HERE / "netns_worker.py"),
                    "--index",
                    str(i),
                    "--addresses",
                    addresses,
                    "--certs",
                    str(certs),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i, ns in enumerate(net.ns)
        ]
        for proc in self.procs:
            self._line(proc, "READY")

    @staticmethod
    def _line(proc: subprocess.Popen, prefix: str) -> str:
        assert proc.stdout is not None
        while line := proc.stdout.readline():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise RuntimeError(f"a worker exited (code {proc.wait()})")

    def run(self, commands: list[dict]) -> list[dict]:
        for proc, command in zip(self.procs, commands, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
        results: list[dict] = [{}] * len(self.procs)

        def read(k: int) -> None:
            results[k] = json.loads(self._line(self.procs[k], "RESULT "))

        threads = [threading.Thread(target=read, args=(k,)) for k in range(len(self.procs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def write_certs(folder: Path, n: int) -> None:
    ca = CertificateAuthority.create()
    for i in range(n):
        bundle = ca.issue_bundle(
            Principal.worker(JOB, i), dns_names=[gossip_server_name(JOB, i)], lifetime=timedelta(hours=4), server=True
        )
        (folder / f"{i}.crt").write_bytes(bundle.cert_pem)
        (folder / f"{i}.key").write_bytes(bundle.key_pem)
        (folder / "ca.crt").write_bytes(bundle.ca_pem)


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for scenario in SCENARIOS:
        for method in METHODS:
            mine = [r for r in runs if r["scenario"] == scenario and r["method"] == method]
            if not mine:
                continue

            def mean(key: str, mine=mine) -> float:
                return statistics.mean(r[key] for r in mine)

            def std(key: str, mine=mine) -> float:
                return statistics.stdev(r[key] for r in mine) if len(mine) > 1 else 0.0

            rows.append(
                {
                    "scenario": scenario,
                    "method": method,
                    "seeds": len(mine),
                    "seconds_mean": mean("seconds"),
                    "seconds_std": std("seconds"),
                    "consensus_seconds": mean("consensus_seconds"),
                    "consensus_val_loss_mean": mean("consensus_val_loss"),
                    "consensus_val_loss_std": std("consensus_val_loss"),
                    "own_val_loss_mean": mean("own_val_loss"),
                    "mb_sent_per_worker": mean("mb_sent_per_worker"),
                    "steps_per_round_slow_worker": mean("steps_slow"),
                    "steps_per_round_others": mean("steps_others"),
                    "skipped_edges": mean("skipped_edges"),
                }
            )
    for r in rows:
        base = next(b for b in rows if b["scenario"] == r["scenario"] and b["method"] == "diloco")
        r["diloco_over_method"] = base["seconds_mean"] / r["seconds_mean"]
    return rows


def one_run(workers: Workers, n: int, scenario: str, method: str, seed: int, args, budget: float | None) -> dict:
    slow = scenario.startswith("slow-compute")
    commands = [
        {
            "method": method,
            "seed": seed,
            "rounds": args.rounds,
            "local_steps": args.local_steps,
            "eval_every": args.eval_every,
            "slowdown": SLOWDOWN if slow and i == 0 else 1.0,
            "budget_s": budget if scenario == "slow-compute-budget" else None,
            "deadline_s": args.deadline_s,
        }
        for i in range(n)
    ]
    results = workers.run(commands)
    seconds = max(r["rounds"][-1]["clock_s"] for r in results)
    curve = [
        {
            "clock_s": max(r["evals"][k]["clock_s"] for r in results),
            "val_loss": statistics.mean(r["evals"][k]["val_loss"] for r in results),
        }
        for k in range(len(results[0]["evals"]))
    ]
    steps = [statistics.mean(x["steps"] for x in r["rounds"]) for r in results]
    fast_round_steps = [x for r in results[1:] for x in r["rounds"]]
    return {
        "scenario": scenario,
        "method": method,
        "seed": seed,
        "seconds": seconds,
        "consensus_seconds": max(r["consensus_s"] for r in results),
        "consensus_val_loss": results[0]["consensus_val_loss"],
        "own_val_loss": statistics.mean(r["own_val_loss"] for r in results),
        "mb_sent_per_worker": statistics.mean(r["bytes_sent"] for r in results) / 1e6,
        "steps_slow": steps[0],
        "steps_others": statistics.mean(steps[1:]),
        "skipped_edges": sum(x["skipped"] for r in results for x in r["rounds"]),
        "curve": curve,
        "parameters": results[0]["parameters"],
        "fast_round_s": [
            r["rounds"][k]["clock_s"] - (r["rounds"][k - 1]["clock_s"] if k else 0.0)
            for r in results[1:]
            for k in range(len(r["rounds"]))
        ],
        "fast_exchange_s": [x["exchange_s"] for x in fast_round_steps],
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SCENARIOS), figsize=(4 * len(SCENARIOS), 3.6), sharey=True)
    for ax, scenario in zip(axes, SCENARIOS, strict=True):
        for method in METHODS:
            mine = [r for r in runs if r["scenario"] == scenario and r["method"] == method]
            if not mine:
                continue
            points = len(mine[0]["curve"])
            xs = [statistics.mean(r["curve"][k]["clock_s"] for r in mine) for k in range(points)]
            ys = [statistics.mean(r["curve"][k]["val_loss"] for r in mine) for k in range(points)]
            ax.plot(xs, ys, marker="o", markersize=3, label=method)
        ax.set_title(scenario)
        ax.set_xlabel("wall-clock (s)")
    axes[0].set_ylabel("validation loss (workers' mean)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 6 rounds, two scenarios")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=60.0,
        help="fixed round deadline (a job's round_deadline_s): no link fails here, and on 2 shared cores the "
        "workers reach a round up to seconds apart, which an adaptive deadline can mistake for a dead peer",
    )
    parser.add_argument("--fast-mbit", type=int, default=160)
    parser.add_argument("--slow-mbit", type=int, default=16)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument(
        "--keep-from",
        type=Path,
        help="an earlier report of the same setup: its runs of the scenarios not run now are kept in the new one",
    )
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # so the network is removed on kill too
    if os.geteuid() != 0:
        sys.exit("bench_gasloc_bandwidth needs root: it creates network namespaces, veth pairs and tc qdiscs")
    if args.quick:
        args.seeds, args.rounds, args.eval_every = 1, 6, 3
        args.scenarios = [s for s in args.scenarios if s in ("uniform", "slow-link")]
    out = harness.output_dir(args.out, args.quick)
    runs: list[dict] = []
    began = time.perf_counter()
    net = ShapedNetwork(args.workers, args.fast_mbit, args.slow_mbit)
    workers = None
    try:
        with tempfile.TemporaryDirectory() as certs:
            write_certs(Path(certs), args.workers)
            net.open()
            workers = Workers(net, Path(certs))
            for seed in range(1, args.seeds + 1):
                budget = None
                for scenario in args.scenarios:
                    net.shape(scenario)
                    for method in METHODS:
                        if scenario == "slow-compute-budget" and budget is None:
                            continue  # needs the slow-compute run's fast-worker time
                        run = one_run(workers, args.workers, scenario, method, seed, args, budget)
                        runs.append(run)
                        if scenario == "slow-compute" and method == "diloco":
                            # the budget: a fast worker's median round compute (round minus exchange)
                            budget = statistics.median(
                                max(0.0, r - e)
                                for r, e in zip(run["fast_round_s"], run["fast_exchange_s"], strict=True)
                            )
                        print(
                            f"seed {seed} {scenario:20s} {method:16s} {run['seconds']:7.2f} s  "
                            f"consensus loss {run['consensus_val_loss']:.3f}  {run['mb_sent_per_worker']:.2f} MB/worker  "
                            f"steps slow/others {run['steps_slow']:.1f}/{run['steps_others']:.1f}",
                            flush=True,
                        )
    finally:
        if workers is not None:
            workers.close()
        net.close()
    for run in runs:
        del run["fast_round_s"], run["fast_exchange_s"]
    reruns = []
    if args.keep_from:
        earlier = json.loads(args.keep_from.read_text())
        if earlier["setup"]["rounds"] != args.rounds or earlier["setup"]["local_steps"] != args.local_steps:
            sys.exit(f"{args.keep_from} has another setup: its runs cannot be kept beside these")
        kept = [r for r in earlier["runs"] if r["scenario"] not in args.scenarios]
        runs = sorted(kept + runs, key=lambda r: (SCENARIOS.index(r["scenario"]), r["seed"]))
        reruns = [
            *earlier.get(
                "reruns", [{"scenarios": "all", "machine": earlier["machine"], "minutes": earlier["minutes"]}]
            ),
            {
                "scenarios": args.scenarios,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": harness.machine(),
                "minutes": (time.perf_counter() - began) / 60,
            },
        ]
    report = {
        "quick": args.quick,
        "setup": {
            "workers": args.workers,
            "rounds": args.rounds,
            "local_steps": args.local_steps,
            "eval_every": args.eval_every,
            "seeds": max(r["seed"] for r in runs) if runs else args.seeds,
            "fast_mbit": args.fast_mbit,
            "slow_mbit": args.slow_mbit,
            "slow_edge": [0, args.workers - 1],
            "slowdown": SLOWDOWN,
            "model": "gpt-tiny",
            "parameters": runs[0]["parameters"] if runs else 0,
            "outer": [1.0, 0.5],
            "round_deadline_s": args.deadline_s,
            "run_with": "nice, as root, on the 2 shared cores of the development machine",
        },
        "minutes": (time.perf_counter() - began) / 60,
        "reruns": reruns,
        "rows": summarize(runs),
        "runs": runs,
    }
    path = harness.write_results("gasloc_bandwidth", report, out)
    plot(runs, harness.result_file(out, "gasloc_bandwidth", ".png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
