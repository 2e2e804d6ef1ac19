"""Decentralized training on a real shaped network: DiLoCo against GASLoC, in wall-clock, consensus included.

Needs root (as CI has): it creates its own network, and always removes it.
Every worker is a real process (``netns_worker.py``) in its own network
namespace (``ip netns``), joined to the others by a veth pair on one bridge.
A worker's NIC is its veth: shaped egress on its namespace side and ingress on
the bridge side (``tc htb`` for the rate, ``netem`` for delay), so a shaped
NIC limits what the worker sends and what it receives, whoever the peer. Where
the kernel has no ``netem``, the wan scenario's delay comes from a user-space
relay instead (``delay_relay.py``, one per namespace in front of its worker's
gossip port, peers dialling it): it holds each direction's bytes ``--delay-ms``,
so the RTT is the same, but TCP's own handshake and ACKs are not delayed; the
JSON's ``setup.wan_delay`` says which ran. The
workers run the platform's own mutual-TLS gossip transport, outer step,
streamed all-reduce (``GossipNode.allreduce``) and round deadline (see
``netns_worker.py``); nothing about time is modelled.

Scenarios:
  control     no qdisc at all: what the methods cost with no link limit
  slow-nic    worker 0's NIC at ``--slow-mbit`` both ways, the others' at ``--fast-mbit``
  wan         every NIC at ``--fast-mbit`` with ``--delay-ms`` each way (RTT twice that, WAN-like)
  slow-all    every NIC at ``--slow-mbit``: links slow enough that bandwidth dominates

Methods: diloco (the streamed all-reduce: the fastest DiLoCo the platform
runs), gasloc-ring, gasloc-one-peer, gasloc-two-peer; all with (eta, gamma) =
(1.0, 0.5), H = ``--local-steps``, ``--rounds`` rounds, a fixed round deadline;
in each (seed, scenario) the methods run one after another in an order that
rotates with the seed, so load on the shared machine hits them alike. Every
``--eval-every`` rounds, off the clock, the workers average their parameters
with the platform's consensus all-reduce and evaluate that average: the
model a job ending there gives its user. A run's wall-clock is its rounds' plus
its final consensus's (the slowest worker's). Per (scenario, method) over the
seeds: mean, min and max of that wall-clock and of the consensus's loss at
equal rounds (the last) and at equal wall-clock (each seed's shortest run's
wall-clock in that scenario, interpolated on each method's consensus curve);
against DiLoCo, a difference counts only when the two methods' ranges over
seeds do not overlap (``SIGNIFICANCE``).

    sudo nice .venv/bin/python benchmarks/bench_gasloc_bandwidth.py [--quick] [--seeds 3] [--rounds 10]

``--keep-other-scenarios`` re-runs only ``--scenarios`` and keeps the other
scenarios' runs from the results file (its settings must match).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
SCENARIOS = ("control", "slow-nic", "wan", "slow-all")
SIGNIFICANCE = "a difference counts only when the two methods' ranges (min to max) over seeds do not overlap"
JOB = "bench-netns"
PORT = 7100
RELAY_PORT = 7101
WAN_DELAY = {
    "netem": "netem on each NIC's egress",
    "relay": "a user-space TCP relay before each worker (delay_relay.py), as this kernel has no netem",
}
HERE = Path(__file__).resolve().parent


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


class ShapedNetwork:
    """``n`` namespaces on one bridge, each worker's NIC shaped both ways; removed on ``close``."""

    def __init__(self, n: int, fast_mbit: int, slow_mbit: int, delay_ms: float):
        self.n, self.fast, self.slow, self.delay = n, fast_mbit, slow_mbit, delay_ms
        tag = f"cg{os.getpid() % 10000}"
        self.bridge, self.ns = f"{tag}br", [f"{tag}n{i}" for i in range(n)]
        self.ifs = [f"{tag}p{i}" for i in range(n)]
        self.ips = [f"10.{77 + os.getpid() % 100}.0.{i + 1}" for i in range(n)]
        self._made: list[tuple[str, ...]] = []
        self.netem = True  # whether shape() delays with netem; else only rates are shaped (relays add the delay)

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

    def nic(self, scenario: str, worker: int) -> tuple[int | None, float]:
        """(rate in mbit or None for no limit, one-way delay in ms) of ``worker``'s NIC."""
        if scenario == "control":
            return None, 0.0
        if scenario == "wan":
            return self.fast, self.delay
        if scenario == "slow-all" or worker == 0:
            return self.slow, 0.0
        return self.fast, 0.0

    def shape(self, scenario: str) -> None:
        """Each NIC: egress on the namespace's side of its veth, ingress on the bridge's side."""
        for i in range(self.n):
            rate, delay = self.nic(scenario, i)
            egress = ("ip", "netns", "exec", self.ns[i], "tc")
            for tc, dev in ((egress, self.ifs[i]), (("tc",), f"{self.ifs[i]}h")):
                subprocess.run((*tc, "qdisc", "del", "dev", dev, "root"), capture_output=True)
                if rate is None and not delay:
                    continue
                sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
                limit = f"{rate}mbit" if rate is not None else "10gbit"
                sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", limit,
                   "ceil", limit)  # fmt: skip
                if delay and self.netem and tc == egress:  # one-way delay once per path: on the sender's egress
                    sh(*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem", "delay",
                       f"{delay}ms", "limit", "100000")  # fmt: skip

    def can_delay(self) -> bool:
        """Whether this kernel has ``netem`` (the wan scenario needs it)."""
        tc = ("ip", "netns", "exec", self.ns[0], "tc")
        added = subprocess.run((*tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"), capture_output=True)
        subprocess.run((*tc, "qdisc", "del", "dev", "lo", "root"), capture_output=True)
        return added.returncode == 0

    def close(self) -> None:
        for undo in reversed(self._made):
            subprocess.run(undo, capture_output=True)
        self._made.clear()


class Relays:
    """One ``delay_relay.py`` per namespace, from ``RELAY_PORT`` to its worker's gossip port."""

    def __init__(self, net: ShapedNetwork, delay_ms: float):
        self.addresses = [f"{ip}:{RELAY_PORT}" for ip in net.ips]
        self.procs = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    str(HERE / "delay_relay.py"),
                    "--listen",
                    f"{ip}:{RELAY_PORT}",
                    "--to",
                    f"{ip}:{PORT}",
                    "--delay-ms",
                    str(delay_ms),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for ns, ip in zip(net.ns, net.ips, strict=True)
        ]
        for proc in self.procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError(f"a delay relay exited (code {proc.wait()})")

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


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


def interpolate(curve: list[dict], at: float) -> float | None:
    """The consensus loss of ``curve`` (points of ``clock_s``, ``loss``) at wall-clock ``at``; None before its
    first point."""
    for before, after in itertools.pairwise(curve):
        if before["clock_s"] <= at <= after["clock_s"]:
            span = after["clock_s"] - before["clock_s"]
            w = (at - before["clock_s"]) / span if span else 1.0
            return before["loss"] + w * (after["loss"] - before["loss"])
    if curve and curve[-1]["clock_s"] <= at:
        return curve[-1]["loss"]
    return None


def spread(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)} if values else {}


def apart(a: dict, b: dict) -> bool:
    """``SIGNIFICANCE``: the two ranges over seeds do not overlap."""
    return bool(a and b) and (a["max"] < b["min"] or b["max"] < a["min"])


def summarize(runs: list[dict]) -> list[dict]:
    for run in runs:  # equal wall-clock: the shortest run of its seed and scenario
        peers = [r for r in runs if r["scenario"] == run["scenario"] and r["seed"] == run["seed"]]
        run["equal_time_s"] = min(r["seconds"] for r in peers)
        run["loss_at_equal_time"] = interpolate(run["curve"], run["equal_time_s"])
    rows = []
    for scenario in SCENARIOS:
        for method in METHODS:
            mine = [r for r in runs if r["scenario"] == scenario and r["method"] == method]
            if mine:
                rows.append(
                    {
                        "scenario": scenario,
                        "method": method,
                        "seeds": len(mine),
                        "seconds": spread([r["seconds"] for r in mine]),
                        "consensus_seconds": spread([r["consensus_seconds"] for r in mine]),
                        "loss_at_equal_rounds": spread([r["consensus_val_loss"] for r in mine]),
                        "loss_at_equal_time": spread(
                            [r["loss_at_equal_time"] for r in mine if r["loss_at_equal_time"] is not None]
                        ),
                        "own_val_loss": statistics.mean(r["own_val_loss"] for r in mine),
                        "mb_sent_per_worker": statistics.mean(r["mb_sent_per_worker"] for r in mine),
                        "skipped_edges": statistics.mean(r["skipped_edges"] for r in mine),
                        "load_average_1m": spread([r["load_average_1m"] for r in mine]),
                    }
                )
    for r in rows:
        base = next(b for b in rows if b["scenario"] == r["scenario"] and b["method"] == "diloco")
        r["speedup_over_diloco"] = base["seconds"]["mean"] / r["seconds"]["mean"]
        r["time_differs"] = apart(r["seconds"], base["seconds"])
        r["loss_at_equal_time_differs"] = apart(r["loss_at_equal_time"], base["loss_at_equal_time"])
        r["loss_at_equal_rounds_differs"] = apart(r["loss_at_equal_rounds"], base["loss_at_equal_rounds"])
    return rows


def one_run(
    workers: Workers, n: int, scenario: str, method: str, seed: int, args, dial: list[str] | None = None
) -> dict:
    load = os.getloadavg()[0]
    command: dict = {
        "method": method,
        "seed": seed,
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "eval_every": args.eval_every,
        "deadline_s": args.deadline_s,
    }
    if dial is not None:
        command["addresses"] = dial
    results = workers.run([command] * n)
    evals = len(results[0]["evals"])
    curve = [
        {
            "clock_s": max(r["evals"][k]["clock_s"] + r["evals"][k]["consensus_s"] for r in results),
            "loss": results[0]["evals"][k]["consensus_val_loss"],
        }
        for k in range(evals)
    ]
    rounds_s = max(r["rounds"][-1]["clock_s"] for r in results)
    consensus_s = max(r["evals"][-1]["consensus_s"] for r in results)
    return {
        "scenario": scenario,
        "method": method,
        "seed": seed,
        "load_average_1m": load,
        "seconds": rounds_s + consensus_s,
        "rounds_seconds": rounds_s,
        "consensus_seconds": consensus_s,
        "consensus_val_loss": curve[-1]["loss"],
        "own_val_loss": statistics.mean(r["own_val_loss"] for r in results),
        "mb_sent_per_worker": statistics.mean(r["bytes_sent"] for r in results) / 1e6,
        "skipped_edges": sum(x["skipped"] for r in results for x in r["rounds"]),
        "curve": curve,
        "parameters": results[0]["parameters"],
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
            ys = [statistics.mean(r["curve"][k]["loss"] for r in mine) for k in range(points)]
            ax.plot(xs, ys, marker="o", markersize=3, label=method)
        ax.set_title(scenario)
        ax.set_xlabel("wall-clock with consensus (s)")
    axes[0].set_ylabel("validation loss of the workers' average")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 rounds, two scenarios")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=60.0,
        help="fixed round deadline (a job's round_deadline_s): no link fails here, and on 2 shared cores the "
        "workers reach a round up to seconds apart, which an adaptive deadline can mistake for a dead peer",
    )
    parser.add_argument("--fast-mbit", type=int, default=160)
    parser.add_argument("--slow-mbit", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay of the wan scenario")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--keep-other-scenarios",
        action="store_true",
        help="keep the results file's runs of the scenarios not in --scenarios (same settings), re-run only these",
    )
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # so the network is removed on kill too
    if os.geteuid() != 0:
        sys.exit("bench_gasloc_bandwidth needs root: it creates network namespaces, veth pairs and tc qdiscs")
    if args.quick:
        args.seeds, args.rounds, args.eval_every = 1, 4, 2
        args.scenarios = [s for s in args.scenarios if s in ("control", "slow-all")]
    out = harness.output_dir(args.out, args.quick)
    setup = {
        "workers": args.workers,
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "eval_every": args.eval_every,
        "seeds": args.seeds,
        "fast_mbit": args.fast_mbit,
        "slow_mbit": args.slow_mbit,
        "delay_ms": args.delay_ms,
        "round_deadline_s": args.deadline_s,
        "methods": args.methods,
    }
    runs: list[dict] = []
    not_run: dict[str, str] = {}  # scenario -> why
    minutes = 0.0
    if args.keep_other_scenarios:
        kept = json.loads(harness.result_file(out, "gasloc_bandwidth").read_text())
        if differ := {k: (kept["setup"].get(k), v) for k, v in setup.items() if kept["setup"].get(k) != v}:
            sys.exit(f"--keep-other-scenarios: the results file ran other settings (theirs, these): {differ}")
        runs = [r for r in kept["runs"] if r["scenario"] not in args.scenarios]
        not_run = {k: why for k, why in kept.get("not_run", {}).items() if k not in args.scenarios}
        minutes = kept["minutes"]
        setup.update({k: kept["setup"][k] for k in ("wan_delay",) if k in kept["setup"]})
    began = time.perf_counter()
    net = ShapedNetwork(args.workers, args.fast_mbit, args.slow_mbit, args.delay_ms)
    workers = relays = None
    try:
        with tempfile.TemporaryDirectory() as certs:
            write_certs(Path(certs), args.workers)
            net.open()
            if "wan" in args.scenarios:
                net.netem = net.can_delay()
                setup["wan_delay"] = WAN_DELAY["netem" if net.netem else "relay"]
                if not net.netem:
                    relays = Relays(net, args.delay_ms)
            workers = Workers(net, Path(certs))
            for seed in range(1, args.seeds + 1):
                for scenario in args.scenarios:
                    net.shape(scenario)
                    dial = relays.addresses if relays is not None and scenario == "wan" else None
                    turn = (seed - 1) % len(args.methods)
                    for method in args.methods[turn:] + args.methods[:turn]:
                        run = one_run(workers, args.workers, scenario, method, seed, args, dial)
                        runs.append(run)
                        print(
                            f"seed {seed} {scenario:9s} {method:16s} {run['seconds']:7.2f} s "
                            f"(consensus {run['consensus_seconds']:.2f} s)  loss {run['consensus_val_loss']:.3f}  "
                            f"{run['mb_sent_per_worker']:.2f} MB/worker  load {run['load_average_1m']:.1f}",
                            flush=True,
                        )
    finally:
        if workers is not None:
            workers.close()
        if relays is not None:
            relays.close()
        net.close()
    rows = summarize(runs)
    report = {
        "quick": args.quick,
        "setup": {
            **setup,
            "model": "gpt-tiny",
            "parameters": runs[0]["parameters"] if runs else 0,
            "outer": [1.0, 0.5],
            "significance": SIGNIFICANCE,
            "run_with": "nice, as root, on the 2 cores of the development machine, shared with other work",
        },
        "minutes": minutes + (time.perf_counter() - began) / 60,
        "not_run": not_run,
        "rows": rows,
        "runs": runs,
    }
    path = harness.write_results("gasloc_bandwidth", report, out)
    plot(runs, harness.result_file(out, "gasloc_bandwidth", ".png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
