"""GASLoC and DiLoCo jobs end to end: worker processes gossiping over mutual TLS."""

from __future__ import annotations

import os
import re
import sqlite3
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
import torch
from safetensors.torch import load_file

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records
from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.decentralized import parameters_digest
from cantata.trainer.gossip import gossip_server_name
from cantata.trainer.gossip.chunks import Assembly
from cantata.trainer.gossip.client import exchange_with
from cantata.trainer.model import build_model
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

SMALL = dict(workers=4, local_steps=5, steps=60, eval_every=30, checkpoint_every=20, batch_size=8, seq_len=32)


@pytest.mark.parametrize(
    "algorithm,topology,compression", [("gasloc", "ring", ""), ("diloco", "", ""), ("gasloc", "one-peer", "int8")]
)
def test_decentralized_job_succeeds_with_falling_loss(tenant, algorithm, topology, compression):
    handle = tenant.submit(
        Job(name=algorithm, algorithm=algorithm, topology=topology, compression=compression, **SMALL)
    )
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    rounds = [e for e in events if e.kind == "ROUND"]
    assert len({e.step for e in rounds}) == 12
    exchanged = [e for e in rounds if "exchanged with []" not in e.message]
    assert len(exchanged) >= 0.9 * len(rounds), [e.message for e in rounds]  # peers really swapped parameters
    losses = [e.loss for e in events if e.kind == "PROGRESS"]
    assert losses[-1] < losses[0] - 0.5
    assert status.val_loss < 4.0
    history = tenant.metrics(handle.id, ["round_s", "bytes_sent_to_peer", "bytes_received_from_peer"])
    for worker in range(SMALL["workers"]):  # each worker's rounds, at each round's last step
        assert [r.step for r in history if r.name == "round_s" and r.worker == worker] == list(range(5, 61, 5))
    received = [r for r in history if r.name == "bytes_received_from_peer"]
    assert received and all(r.peer is not None and r.peer != r.worker for r in received)
    assert sum(r.value > 0 for r in received) >= 0.9 * len(received)  # what the peers really swapped


@pytest.mark.parametrize("algorithm", ["gasloc", "diloco"])
def test_killed_worker_is_skipped_restarted_and_rejoins(tenant, algorithm):
    # diloco: the rounds' all-reduce leaves the dead worker out of its ring, and each round says so
    handle = tenant.submit(Job(name="resilient", algorithm=algorithm, **{**SMALL, "steps": 150}))
    messages = _kill_mid_job_and_finish(handle, worker=2)
    assert any("worker 2 exited with code -9" in m and "restarting it (1/3)" in m for m in messages)
    if algorithm == "gasloc":
        assert any("skipped [2]" in m for m in messages)
    else:  # a ring that lost worker 2 mid-round fails for everyone; a later one leaves it out while it is away
        assert any("2" in m.split("skipped [")[1].split("]")[0].split(", ") for m in messages if "skipped [" in m)
    assert any(m.startswith("worker 2 rejoins at round") for m in messages)
    # ... and takes part again: its rounds line up with its neighbours', and though it came back from an older
    # checkpoint (its first updates may be rejected as too far off) nobody quarantines it, so most rounds mix
    events = list(handle.events())
    assert not any(e.kind == "ANOMALY" and "quarantined" in e.message for e in events), [e.message for e in events]
    rejoined = next(e.seq for e in events if e.message.startswith("worker 2 rejoins at round"))
    after = [e.message for e in events if e.kind == "ROUND" and e.worker == 2 and e.seq > rejoined]
    mixed = [m for m in after if "exchanged with []" not in m]
    assert after and 2 * len(mixed) >= len(after), after


def test_worker_groups_train_data_parallel_inside_and_gossip_from_rank_0(tenant):
    handle = tenant.submit(
        Job(
            name="groups",
            algorithm="gasloc",
            optimizer="muon",
            ranks_per_worker=2,
            trace_samples=True,
            **{**SMALL, "workers": 2, "steps": 40},
        )
    )
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    rounds = [e for e in events if e.kind == "ROUND"]
    assert {e.worker for e in rounds} == {0, 2}  # only each group's rank 0 gossips ...
    assert all("exchanged with [2]" in e.message for e in rounds if e.worker == 0), [e.message for e in rounds]
    losses = [e.loss for e in events if e.kind == "PROGRESS"]
    assert losses[-1] < losses[0] and status.val_loss < 3.5  # (uniform guessing: ln 256 = 5.5)

    logs = list(handle.logs())
    finals = {w: line.rsplit(" ", 1)[1] for w, line in logs if "finished, validation loss" in line}
    assert finals[0] == finals[1] and finals[2] == finals[3]  # ... and its ranks hold one model
    first_batch = {w: line for w, line in logs if line.startswith("samples step=1 ")}
    assert len(set(first_batch.values())) == 4  # every rank reads its own data
    assert sum(line.startswith("samples ") for _, line in logs) == 4 * 40


def test_a_group_that_loses_a_rank_restarts_together_and_rejoins(tenant):
    messages = _kill_mid_job_and_finish(
        tenant.submit(
            Job(name="group-fault", algorithm="gasloc", ranks_per_worker=2, **{**SMALL, "workers": 2, "steps": 150})
        ),
        worker=3,
        watched=2,
    )
    assert any("worker 3 exited with code -9" in m and "restarting it" in m for m in messages)
    restarts = [m for m in messages if "restarting it" in m]  # worker 3, and worker 2 stopped for the group's restart
    assert len(restarts) == 2 and all("restarting it (1/" in m for m in restarts), "\n".join(restarts)
    assert any(m.startswith("worker 2 rejoins at round") for m in messages), "\n".join(messages)


def test_sign_flipping_worker_is_quarantined_and_the_job_still_learns(platform, tenant):
    blocker = tenant.submit(
        Job(
            name="blocker",
            algorithm="allreduce",
            workers=8,
            steps=100_000,
            batch_size=2,
            seq_len=8,
            eval_every=50_000,
            checkpoint_every=50_000,
        )
    )
    attacked = tenant.submit(Job(name="attacked", algorithm="gasloc", topology="complete", **{**SMALL, "steps": 100}))
    with platform.admin() as admin:
        admin.simulate_attack(attacked.id, [1], "sign_flip")
        with pytest.raises(errors.InvalidArgument, match="benchmark"):
            admin.simulate_attack(attacked.id, [1], "alie")
    with pytest.raises(errors.PermissionDenied):
        tenant.simulate_attack(attacked.id, [1], "nan")  # a tenant can never switch it on
    blocker.cancel()
    status = attacked.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert status.val_loss < 4.0
    with platform.admin() as admin:
        found = admin.anomalies(attacked.id)
    assert found and {a.peer for a in found} == {1}
    assert any(a.quarantined for a in found)
    screened = tenant.metrics(attacked.id, ["screen_clip", "screen_reject"])
    assert len(screened) == len(found) and {r.peer for r in screened} == {1}  # the verdicts are in its history
    actions = {r.action for r in read_records(platform.data_dir / "audit") if r.resource == attacked.id}
    assert {Action.GRADIENT_ANOMALY_DETECTED, Action.PEER_QUARANTINED, Action.ATTACK_SIMULATION_PLANNED} <= actions


def test_a_peer_of_another_job_is_refused_and_audited(platform, tenant):
    handle = tenant.submit(Job(name="guarded", algorithm="gasloc", **{**SMALL, "workers": 2, "steps": 100_000}))
    wait_for(lambda: any(e.kind == "ROUND" for e in _events_so_far(handle)), timeout=JOB_TIMEOUT_S)
    with sqlite3.connect(f"file:{platform.data_dir / 'state.db'}?mode=ro", uri=True) as db:
        ((address,),) = db.execute("SELECT gossip_address FROM workers WHERE job_id=? AND idx=0", (handle.id,))
    ca = CertificateAuthority.load(platform.paths.ca_cert.read_bytes(), platform.paths.ca_key.read_bytes())
    intruder = ca.issue_bundle(
        Principal.worker("job-other", 1),
        dns_names=[gossip_server_name("job-other", 1)],
        lifetime=timedelta(hours=1),
        server=True,
    )  # a valid certificate of another job
    credentials = grpc.ssl_channel_credentials(intruder.ca_pem, intruder.key_pem, intruder.cert_pem)
    options = [("grpc.ssl_target_name_override", gossip_server_name(handle.id, 0))]
    with grpc.secure_channel(address, credentials, options=options) as channel, pytest.raises(grpc.RpcError) as refused:
        exchange_with([channel], 0, 1, torch.zeros(10), Assembly(0, 0, bytearray(40)), timeout=10, chunk_bytes=1 << 20)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED

    def refusals():
        return [
            r
            for r in read_records(platform.data_dir / "audit")
            if r.action == Action.AUTHZ_DENIED and r.resource == handle.id
        ]

    wait_for(refusals, timeout=JOB_TIMEOUT_S)
    (record,) = refusals()
    assert record.actor == Principal.worker(handle.id, 0).uri and record.tenant == "acme"  # the reporter, verified
    assert record.details["service"] == "gossip" and "not a worker of job" in record.details["reason"]
    assert record.details["reported"] is True
    assert record.details["reported_principal"] == "spiffe://cantata/job/job-other/worker/1"
    handle.cancel()
    assert handle.wait().state == "CANCELLED"


def _kill_mid_job_and_finish(handle, worker: int, watched: int | None = None) -> list[str]:
    """SIGKILL one worker process in round 5; the job must still succeed. Returns its event messages."""
    kill_after_round_4(handle, worker, watched)
    status = handle.wait()
    events = list(handle.events())
    assert status.state == "SUCCEEDED", "\n".join([status.reason, *(f"[{e.worker}] {e.message}" for e in events)])
    return [e.message for e in events]


def kill_after_round_4(handle, worker: int, watched: int | None = None) -> None:
    """SIGKILL one worker process of a running decentralized job as soon as it (or ``watched``, the gossiping rank
    of its group) reports round 4.

    With ``SMALL``'s checkpoint_every=20 and local_steps=5 the last checkpoint is then step 20 (the end of round 3)
    and the job is already past it, so a restarted worker always comes back behind its peers; killing it at a
    checkpoint's own round would race the checkpoint.
    """
    watched = worker if watched is None else watched
    next(e for e in handle.events() if e.kind == "ROUND" and e.worker == watched and e.step >= 4)
    victim = [pid for pid in _pids_of(handle.id) if _worker_of(pid) == worker]
    assert victim, f"worker {worker} is not running: {handle.status()}"
    os.kill(victim[0], 9)


def _events_so_far(handle):
    from tests.test_server_faults import _events_until_now

    return _events_until_now(handle._client, handle.id)


def _worker_of(pid: int) -> int:
    """The worker index a worker process was started for (from its config file name).

    A worker forked from the zygote shows its command line as one title (spaces, not NULs).
    """
    args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    config = args[args.index(b"--config") + 1].decode()
    return int(config.rsplit("worker-", 1)[1].split(".")[0])


@pytest.mark.parametrize("algorithm", ["diloco", "gasloc"])
def test_time_budgeted_rounds_end_in_the_workers_consensus(tenant, tmp_path, algorithm):
    """A budget far below one step's time: every worker runs exactly one inner step per round, not local_steps.

    Each worker's payload carries its steps as its weight (gasloc: on the
    gossip wire; diloco: in the all-reduce). At the end the workers average
    their parameters: each reports the same digest, and the final checkpoint
    holds those very parameters.
    """
    job = Job(name="budget", algorithm=algorithm, round_time_s=1e-6, **{**SMALL, "workers": 3, "steps": 20})
    handle = tenant.submit(job)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    rounds = [e for e in events if e.kind == "ROUND"]
    assert {(e.worker, e.step) for e in rounds} == {(w, t) for w in range(3) for t in range(4)}
    assert all("inner steps: 1," in e.message and "skipped" not in e.message for e in rounds), rounds
    sent = {e.worker: int(re.search(r"sent so far: (\d+) bytes", e.message)[1]) for e in rounds if e.step == 3}
    assert all(b > 0 for b in sent.values())
    agreed = [re.search(r"consensus of (\d+) workers \(parameters (\w+)\)", e.message) for e in events]
    agreed = [m for m in agreed if m]
    assert len(agreed) == 3 and {m[1] for m in agreed} == {"3"}
    digests = {m[2] for m in agreed}
    assert len(digests) == 1
    state = torch.load(tenant.download_checkpoint(handle.id, 20, tmp_path / "final.pt"), weights_only=True)
    model = build_model(job.model, job.seed or 1337)
    model.load_state_dict(state)
    assert parameters_digest(list(model.parameters())) in digests


def test_sharded_worker_groups_gossip_shard_by_shard_and_end_in_one_consensus(tenant, tmp_path):
    """Two FSDP2-sharded groups of two ranks: rank r swaps only its shard, with rank r of the other group.

    Every rank reports its own rounds, and the bytes its transport sent per
    round are about half the model's (its shard); at the end each shard is
    averaged across the groups, and the final checkpoint holds those shards.
    """
    job = Job(
        name="sharded-groups",
        algorithm="gasloc",
        model="llama-tiny",
        ranks_per_worker=2,
        dp_shard=2,
        **{**SMALL, "workers": 2, "steps": 16, "local_steps": 4, "eval_every": 16, "checkpoint_every": 8},
        eval_batches=2,
    )
    handle = tenant.submit(job)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    rounds = [e for e in events if e.kind == "ROUND"]
    assert {(e.worker, e.step) for e in rounds} == {(w, t) for w in range(4) for t in range(4)}
    partner = {0: 2, 1: 3, 2: 0, 3: 1}  # the same rank of the other group
    assert all(f"exchanged with [{partner[e.worker]}]" in e.message for e in rounds), [
        (e.worker, e.message) for e in rounds
    ]
    losses = [e.loss for e in events if e.kind == "PROGRESS"]
    assert losses[-1] < losses[0]

    model = build_model(job.model, job.seed or 1337)
    whole = 4 * sum(p.numel() for p in model.parameters())
    sent = {
        w: [int(re.search(r"sent so far: (\d+) bytes", e.message)[1]) for e in rounds if e.worker == w]
        for w in range(4)
    }
    for w, totals in sent.items():  # what each rank's transport serialized per round: its shard, not the model
        per_round = totals[-1] / len(totals)
        assert 0.45 * whole < per_round < 0.6 * whole, (w, per_round, whole)

    agreed = [
        re.search(r"worker (\d) holds the consensus of (\d+) workers \(parameters shard (\d) (\w+)\)", e.message)
        for e in events
    ]
    digests = {int(m[1]): (int(m[3]), m[4]) for m in agreed if m and m[2] == "2"}
    assert sorted(digests) == [0, 1, 2, 3]
    assert digests[0] == digests[2] and digests[1] == digests[3] and digests[0] != digests[1]
    final = tenant.download_checkpoint(handle.id, 16, tmp_path / "final", consolidate=True)  # group 0's shards
    model.load_state_dict(load_file(final / "model.safetensors"))
    for rank in range(2):  # FSDP2 shards dim 0 in torch.chunk's pieces
        shards = [p.detach().chunk(2, dim=0)[rank] if p.shape[0] > rank else p[:0] for p in model.parameters()]
        assert parameters_digest(shards) == digests[rank][1]
