"""Sharded decentralized worker groups, at the trainer's level: per-shard gossip against the gathered path.

Four real processes form two worker groups of two ranks (each group its own
``torch.distributed`` world, as in a job), train ``llama-tiny`` with real AdamW
steps and run the ``Decentralized`` strategy over real mutual-TLS gossip
endpoints, once with FSDP2-sharded groups (every rank gossips its shard) and
once with replicated groups (rank 0 gossips the whole model). The control plane
is the one part that is not real here: a shared table stands in for its peer
directory and records what the workers would report (the platform test in
``test_decentralized_jobs.py`` runs the same code against the real server).
"""

from __future__ import annotations

import os
from typing import cast

import torch
import torch.multiprocessing as mp

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.decoder import Decoder
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.parallel import parallelize
from cantata.trainer.process_exit import exit_without_finalizing
from testkit.gossip_rig import Directory, Parts, credentials, worker_config
from testkit.platform import free_ports

JOB = "job-sharded"
MODEL = "llama-tiny"
GROUPS, RANKS, H = 2, 2, 3
SCALE_ATTACK = {"kind": "scale", "scale": 30.0, "workers": [1]}


def _spec(sharded: bool, algorithm: str) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(
        name="x",
        model=MODEL,
        algorithm=algorithm,
        workers=GROUPS,
        ranks_per_worker=RANKS,
        dp_shard=RANKS if sharded else 1,
        topology="ring" if algorithm == "gasloc" else "complete",
        local_steps=H,
        steps=H,
        seed=5,
        outer_lr=0.7,
        outer_momentum=0.9,
        round_deadline_s=30.0,
    )
    jobfields.fill_defaults(spec)
    return spec


def _run(process: int, sharded: bool, algorithm: str, attack, port: int, table, paths: dict) -> dict:
    """One process's job: H AdamW steps on its own batches, one outer round, the final consensus."""
    from cantata.trainer.decentralized import Decentralized

    attack = attack if process == 3 else None  # one shard of group 1 is malicious
    cfg = worker_config(JOB, process, _spec(sharded, algorithm), port, paths, attack)
    directory = Directory(table, process)
    strategy = Decentralized(cfg, directory)  # type: ignore[arg-type]
    try:
        model = cast(Decoder, build_model(MODEL, 5))
        if strategy.mesh is not None:
            parallelize(model, strategy.mesh, MixedPrecision.FP32, False)
        optimizer = build_optimizer(
            model, "adamw", lr=3e-3, process_group=strategy.group if strategy.mesh is None else None
        )
        strategy.prepare(model, Parts())  # type: ignore[arg-type]
        strategy.first_round(0)
        data = torch.Generator().manual_seed(1000 + process)  # every process its own batches, in both paths
        for _ in range(H):
            batch = torch.randint(0, 256, (4, 17), generator=data)
            _, loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        strategy.after_round(0, H)
        round_bytes = strategy.node.bytes_sent if strategy.node is not None else 0
        probe = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(7))

        @torch.no_grad()
        def evaluate() -> float:
            return model(probe[:, :-1], probe[:, 1:])[1].item()

        strategy.finish(evaluate)
        full = {
            name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()
        }
        return {"params": full, "round_bytes": round_bytes}
    finally:
        strategy.close()


def _process(process: int, runs: list, port: int, table, paths: dict, out: str) -> None:
    torch.set_num_threads(1)
    results = []
    for k, (sharded, algorithm, attack) in enumerate(runs):
        results.append(_run(process, sharded, algorithm, attack, port + 10 * k, table[k], paths))
    torch.save(results, os.path.join(out, f"{process}.pt"))
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def test_per_shard_gossip_matches_the_gathered_path_sends_a_shard_and_rejects_a_bad_shard_groupwide(tmp_path):
    """gasloc and diloco, sharded against gathered; then gasloc with one malicious shard."""
    runs = [
        (True, "gasloc", None),
        (False, "gasloc", None),
        (True, "gasloc", SCALE_ATTACK),
        (True, "diloco", None),
        (False, "diloco", None),
    ]
    with mp.Manager() as manager:
        tables = [manager.dict() for _ in runs]
        mp.spawn(
            _process,
            args=(runs, free_ports(10 * len(runs)), tables, credentials(tmp_path, JOB, GROUPS * RANKS), str(tmp_path)),
            nprocs=GROUPS * RANKS,
        )
        tables = [dict(t) for t in tables]
    results = [torch.load(tmp_path / f"{p}.pt", weights_only=False) for p in range(GROUPS * RANKS)]
    sharded, gathered, attacked, diloco_sharded, diloco_gathered = ([r[k] for r in results] for k in range(len(runs)))

    # one gasloc round, then the consensus: the same parameters whether each rank gossiped its shard or
    # rank 0 gossiped the whole model (the canaries differ, but the mean they are averaged to does not)
    for name, value in gathered[0]["params"].items():
        torch.testing.assert_close(sharded[0]["params"][name], value, rtol=0, atol=1e-6)
        for p in range(1, GROUPS * RANKS):  # every rank of every group holds the consensus
            torch.testing.assert_close(sharded[p]["params"][name], sharded[0]["params"][name], rtol=0, atol=0)
    assert gathered[1]["round_bytes"] == 0  # a replicated group's rank 1 sends nothing; its rank 0 everything
    for p in range(GROUPS * RANKS):  # counted by the transport: each rank sends its shard, half of what rank 0 did
        ratio = sharded[p]["round_bytes"] / gathered[RANKS * (p // RANKS)]["round_bytes"]
        assert 0.45 < ratio < 0.55, (p, ratio)
    assert all(tables[0][("report", p, 0)][:2] == ([p ^ 2], []) for p in range(4))  # rank r swapped with rank r

    # a malicious shard (group 1, rank 1) is rejected by both ranks of group 0, reported once, by rank 0
    assert tables[2][("report", 0, 0)][:2] == ([], [2]) and tables[2][("report", 1, 0)][:2] == ([], [3])
    anomalies = {key: value for key, value in tables[2].items() if key[0] == "anomaly"}
    assert list(anomalies) == [("anomaly", 0, 2, 0)] and anomalies[("anomaly", 0, 2, 0)][1] == "reject"
    assert tables[2][("report", 2, 0)][:2] == ([0], []) and tables[2][("report", 3, 0)][:2] == ([1], [])
    for name, value in attacked[0]["params"].items():  # group 0 did not mix group 1 in, yet the consensus holds
        torch.testing.assert_close(attacked[3]["params"][name], value, rtol=0, atol=0)

    # diloco: each rank's ring all-reduce over its own shard gives the gathered path's parameters, for half the bytes
    for name, value in diloco_gathered[0]["params"].items():
        for p in range(GROUPS * RANKS):
            torch.testing.assert_close(diloco_sharded[p]["params"][name], value, rtol=0, atol=1e-6)
    for p in range(GROUPS * RANKS):
        ratio = diloco_sharded[p]["round_bytes"] / diloco_gathered[RANKS * (p // RANKS)]["round_bytes"]
        assert 0.45 < ratio < 0.55, (p, ratio)
