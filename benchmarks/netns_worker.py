"""One worker of ``bench_gasloc_bandwidth.py``, run inside its own network namespace.

It trains the platform's ``gpt-tiny`` with the platform's pieces: its mutual-TLS
``GossipNode``, its ``GASLoCOuter`` (gossip rounds, or DiLoCo rounds over
``GossipNode.allreduce``) and its ``RoundDeadline``. The benchmark sends one
JSON command a line on stdin (a run: method, seed, rounds, local steps, and
optionally the addresses to dial peers at for that run); the worker answers one ``RESULT {json}`` line on stdout per run with
its wall-clock per round, bytes sent, its own validation loss and, at every
evaluation, the loss of the workers' average (the consensus the platform ends
a job with) and that all-reduce's time. The process lives for all runs, so
torch is imported once.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from cantata.security.pki import Bundle
from cantata.trainer.gasloc import GASLoCOuter, flatten, make_topology
from cantata.trainer.gasloc.deadline import FIRST_DEADLINE_S, RoundDeadline
from cantata.trainer.gossip import GossipNode
from cantata.trainer.gossip.allreduce import AllReduceFailed
from cantata.trainer.model import build_model

JOB = "bench-netns"
PORT = 7100
CONTEXT, BATCH, INNER_LR, EVAL_BATCHES = 32, 8, 1e-3, 4
TOPOLOGY = {"gasloc-ring": "ring", "gasloc-one-peer": "one-peer", "gasloc-two-peer": "two-peer", "diloco": "complete"}
OUTER = (1.0, 0.5)  # (eta, gamma) for every method: bench_gasloc's setting for pystdlib at H = 20


def batch(data: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
    window = torch.stack([data[s : s + CONTEXT + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]


@torch.no_grad()
def validation(model: torch.nn.Module, val: torch.Tensor) -> float:
    g = torch.Generator().manual_seed(12345)
    model.eval()
    loss = sum(model(*batch(val, g))[1].item() for _ in range(EVAL_BATCHES)) / EVAL_BATCHES
    model.train()
    return loss


class Worker:
    def __init__(self, index: int, addresses: dict[int, str], certs: Path):
        self.index, self.addresses = index, addresses
        bundle = Bundle(*(certs.joinpath(name).read_bytes() for name in (f"{index}.crt", f"{index}.key", "ca.crt")))
        self.node = GossipNode(index, JOB, bundle, listen=f"{addresses[index].rsplit(':', 1)[0]}:{PORT}")
        self.node.start()
        from bench_gasloc import load_text

        self.train, self.val, _ = load_text("pystdlib")
        self.base = 0  # wire rounds only grow over the process's runs

    def run(self, c: dict) -> dict:
        n, me = len(self.addresses), self.index
        model = build_model("gpt-tiny", c["seed"])
        opt = torch.optim.AdamW(model.parameters(), lr=INNER_LR, betas=(0.9, 0.95), weight_decay=0.1)
        g = torch.Generator().manual_seed(1000 * c["seed"] + me)
        outer = GASLoCOuter(model.parameters(), make_topology(TOPOLOGY[c["method"]], n, c["seed"]), me, *OUTER)
        deadline = RoundDeadline(c["deadline_s"])
        base, self.base = self.base, self.base + 2 * (c["rounds"] + 1)  # rounds only grow over the process's runs
        dial = dict(enumerate(c["addresses"])) if "addresses" in c else self.addresses  # e.g. through delay relays
        others = {p: a for p, a in dial.items() if p != me}
        sent0 = self.node.bytes_sent

        def allreduce(round_: int, vector: torch.Tensor, seconds: float | None = None) -> torch.Tensor | None:
            try:
                return self.node.allreduce(base + round_, others, vector, seconds or deadline.seconds).total
            except AllReduceFailed:
                return None

        def exchange(round_: int, peers: list[int], wire: torch.Tensor):
            got = self.node.exchange(base + 2 * round_, {p: others[p] for p in peers}, wire, deadline.seconds)
            return {p: t.clone() for p, t in got.items()}

        def consensus(round_: int) -> tuple[float, float]:
            """The loss of the workers' average (the model a job ending now would give) and the all-reduce's time."""
            tick = time.perf_counter()
            vector = torch.cat([flatten(model.parameters()), torch.ones(1)])
            total = allreduce(round_, vector, max(deadline.seconds, FIRST_DEADLINE_S))  # as the platform's consensus
            seconds = time.perf_counter() - tick
            if total is None:
                return math.nan, seconds
            mean = total[:-1] / total[-1]
            average = build_model("gpt-tiny", c["seed"])
            offset = 0
            with torch.no_grad():
                for p in average.parameters():
                    p.copy_(mean[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
            return validation(average, self.val), seconds

        rounds, clock, evals = [], 0.0, []
        for t in range(c["rounds"]):
            began = time.perf_counter()
            for _ in range(c["local_steps"]):
                _, loss = model(*batch(self.train, g))
                loss.backward()
                opt.step()
                opt.zero_grad()
            exchanged = time.perf_counter()
            if c["method"] == "diloco":
                stats = outer.round_mean(t, lambda r, v: allreduce(2 * r, v), weight=float(c["local_steps"]))
            else:
                stats = outer.round(t, exchange, weight=float(c["local_steps"]))
            seconds = time.perf_counter() - exchanged
            if not stats.skipped:
                deadline.record(seconds)
            clock += time.perf_counter() - began
            rounds.append({"clock_s": clock, "exchange_s": seconds, "skipped": len(stats.skipped)})
            if (t + 1) % c["eval_every"] == 0 or t + 1 == c["rounds"]:  # measured off the clock
                loss, consensus_s = consensus(2 * t + 1)
                evals.append({"round": t, "clock_s": clock, "consensus_s": consensus_s, "consensus_val_loss": loss})
        return {
            "worker": me,
            "rounds": rounds,
            "evals": evals,
            "own_val_loss": validation(model, self.val),
            "bytes_sent": self.node.bytes_sent - sent0,
            "parameters": sum(p.numel() for p in model.parameters()),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--addresses", required=True, help="comma-separated host:port of every worker, in order")
    parser.add_argument("--certs", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    addresses = dict(enumerate(args.addresses.split(",")))
    worker = Worker(args.index, addresses, args.certs)
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        print("RESULT " + json.dumps(worker.run(json.loads(line))), flush=True)
    worker.node.stop()


if __name__ == "__main__":
    main()
