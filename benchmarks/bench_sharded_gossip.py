"""Sharded decentralized groups against the gathered path: bytes each rank sends and the outer round's time.

Two worker groups of two ranks run the trainer's ``Decentralized`` strategy
(gasloc, ring) over real mutual-TLS gossip endpoints, in four processes: once
with FSDP2-sharded groups (every rank gossips its own shard with the same rank
of the other group) and once with replicated groups (rank 0 gossips the whole
model, its ranks follow by broadcast). The cases alternate within each trial.
Bytes are what each process's transport serialized (``GossipNode.bytes_sent``);
the round time is the slowest process's ``after_round`` (the outer step with
its exchange, screening, group agreement and, when replicated, the broadcast).
Inner steps are replaced by a fixed perturbation of the parameters: only the
outer round is measured. The control plane's peer directory is a shared table (``testkit/gossip_rig.py``).

    .venv/bin/python benchmarks/bench_sharded_gossip.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kit's stand-in for the control plane

from testkit.gossip_rig import Directory, Parts, credentials, worker_config
from testkit.platform import free_ports

JOB = "job-bench-sharded"
GROUPS, RANKS = 2, 2
MODELS = {  # name -> decoder shape (None: the named model)
    "llama-tiny": None,
    "decoder-17m": dict(dim=512, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536, vocab_size=4096),
}


def _model(name: str):
    from cantata.trainer.decoder import Decoder, DecoderConfig
    from cantata.trainer.model import build_model

    shape = MODELS[name]
    if shape is None:
        return build_model(name, 5)
    torch.manual_seed(5)
    return Decoder(
        DecoderConfig(block_size=256, rope_theta=1e4, norm_eps=1e-6, tie_embeddings=False, qk_norm=True, **shape)
    )


def _case(process: int, model_name: str, sharded: bool, rounds: int, port: int, table, paths: dict) -> dict:
    from cantata.proto import jobfields
    from cantata.proto.v1 import common_pb2
    from cantata.proto.vocabulary import MixedPrecision
    from cantata.trainer.decentralized import Decentralized
    from cantata.trainer.group_agreement import local_shards
    from cantata.trainer.parallel import parallelize

    spec = common_pb2.JobSpec(
        name="bench",
        model="llama-tiny",
        algorithm="gasloc",
        workers=GROUPS,
        ranks_per_worker=RANKS,
        dp_shard=RANKS if sharded else 1,
        topology="ring",
        local_steps=1,
        steps=rounds,
        seed=5,
        round_deadline_s=60.0,
    )
    jobfields.fill_defaults(spec)
    cfg = worker_config(JOB, process, spec, port, paths)
    strategy = Decentralized(cfg, Directory(table, process))  # type: ignore[arg-type]
    try:
        model = _model(model_name)
        if strategy.mesh is not None:
            parallelize(model, strategy.mesh, MixedPrecision.FP32, False)
        strategy.prepare(model, Parts())  # type: ignore[arg-type]
        strategy.first_round(0)
        noise = torch.Generator().manual_seed(process // RANKS)
        seconds, sent = [], []
        for t in range(rounds):
            with torch.no_grad():  # the inner steps' stand-in: a change of what this process gossips
                for p in strategy.params():
                    p.add_(1e-3 * torch.randn(p.shape, generator=noise))
            before = strategy.node.bytes_sent if strategy.node is not None else 0
            began = time.perf_counter()
            strategy.after_round(t, 1)
            seconds.append(time.perf_counter() - began)
            sent.append((strategy.node.bytes_sent if strategy.node is not None else 0) - before)
        elements = sum(s.numel() for s in local_shards(model))
        return {"seconds": seconds, "bytes": sent, "elements": elements}
    finally:
        strategy.close()


def _process(process: int, plan: list, port: int, tables: list, paths: dict, out: str) -> None:
    from cantata.trainer.process_exit import exit_without_finalizing

    torch.set_num_threads(1)
    rows = [_case(process, *case, port + 10 * k, tables[k], paths) for k, case in enumerate(plan)]
    torch.save(rows, os.path.join(out, f"{process}.pt"))
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="llama-tiny only, one trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4, help="outer rounds per case (the first is not timed)")
    harness.add_output_argument(parser)
    args = parser.parse_args(argv)
    models = ["llama-tiny"] if args.quick else list(MODELS)
    trials = 1 if args.quick else args.trials
    plan = []  # the cases alternate within each trial, order reversed every other trial
    for trial in range(trials):
        for model in models:
            modes = [True, False] if trial % 2 == 0 else [False, True]
            plan += [(model, sharded, args.rounds) for sharded in modes]
    with tempfile.TemporaryDirectory() as work, mp.Manager() as manager:
        tables = [manager.dict() for _ in plan]
        port = free_ports(10 * len(plan))
        paths = credentials(Path(work), JOB, GROUPS * RANKS)
        mp.spawn(_process, args=(plan, port, tables, paths, work), nprocs=GROUPS * RANKS)
        results = [torch.load(Path(work) / f"{p}.pt", weights_only=False) for p in range(GROUPS * RANKS)]
    rows = []
    for model in models:
        row: dict = {"model": model}
        for sharded in (True, False):
            mode = "sharded" if sharded else "gathered"
            cases = [k for k, case in enumerate(plan) if case[:2] == (model, sharded)]
            # per round the slowest process; the first round (connections, TLS handshakes) is left out
            times = [max(results[p][k]["seconds"][t] for p in range(4)) for k in cases for t in range(1, args.rounds)]
            per_rank = [
                statistics.median(results[p][k]["bytes"][t] for k in cases for t in range(1, args.rounds))
                for p in range(4)
            ]
            row[mode] = {
                "round_s_median": statistics.median(times),
                "bytes_per_round_per_rank": per_rank,
                "max_bytes_per_rank": max(per_rank),
                "elements_per_rank": [results[p][cases[0]]["elements"] for p in range(4)],
            }
        row["bytes_ratio"] = row["sharded"]["max_bytes_per_rank"] / row["gathered"]["max_bytes_per_rank"]
        row["round_time_ratio"] = row["sharded"]["round_s_median"] / row["gathered"]["round_s_median"]
        rows.append(row)
        print(
            f"{model}: bytes per rank per round sharded {row['sharded']['max_bytes_per_rank']:,.0f} "
            f"gathered {row['gathered']['max_bytes_per_rank']:,.0f} (x{row['bytes_ratio']:.3f}); round "
            f"sharded {row['sharded']['round_s_median']:.3f} s gathered {row['gathered']['round_s_median']:.3f} s "
            f"(x{row['round_time_ratio']:.2f})",
            flush=True,
        )
    out = harness.output_dir(args.out, args.quick)
    path = harness.write_results(
        "sharded_gossip",
        {"quick": args.quick, "trials": trials, "rounds": args.rounds, "groups": GROUPS, "ranks": RANKS, "rows": rows},
        out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
