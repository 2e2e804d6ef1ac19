"""The Ray executor on a real, locked Ray cluster of three nodes in network namespaces (needs root, as CI runs).

One cluster and one server serve the whole module (a Ray node takes tens of
seconds to start on a loaded machine): the control plane runs in the head
node's namespace as a Ray driver, the tenant's SDK calls it across the bridge.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records
from cantata.server.executors.ray import RayClusterError, check_locked
from cantata.server.executors.ray_actor import node_root
from testkit.platform import Platform, cli
from testkit.raycluster import RayCluster
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TINY = dict(steps=6, eval_every=3, checkpoint_every=3, batch_size=4, seq_len=16)
STEP_LINE = re.compile(rb"step (\d+)/\d+ loss")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = RayCluster(tmp_path_factory.mktemp("ray"))
    try:
        c.build_network()
        yield c
    finally:
        c.teardown()


@pytest.fixture(scope="module")
def ray_platform(cluster, tmp_path_factory):
    """A server on the head node's address, its workers Ray actors on the three nodes."""
    root = tmp_path_factory.mktemp("ray-platform")
    p = Platform(
        root,
        host=cluster.head.ip,
        init=("--ray-token",),  # the README's commands: the token from init, the executor from start's flags
        settings={"shared_roots": [str(root / "data" / "checkpoints")]},  # the namespaces share one file system
    )
    token = p.paths.ray_token
    for node in cluster.nodes:  # node certificates from the platform CA, through the CLI an operator uses
        cli("cluster", "node-cert", "--data-dir", str(p.data_dir), "--node-ip", node.ip, "--out", str(node.certs))
    cluster.start(token)  # the head; the other two join while the server starts
    p.env.update(cluster.node_env(cluster.head))
    _start(p, cluster)
    cluster.wait_nodes()
    yield p
    if p.proc is not None:
        p.stop()


def _start(platform: Platform, cluster: RayCluster) -> None:
    """``cantata server start --executor ray --ray-address HEAD:6379`` in the head node's namespace."""
    platform.start("--executor", "ray", "--ray-address", cluster.address, prefix=tuple(cluster.head.run()))


@pytest.fixture(scope="module")
def ray_tenant(ray_platform):
    with ray_platform.enroll("raytenant", max_gpus=8) as client:
        yield client


def test_the_server_uses_the_cluster_only_once_it_refused_a_client_without_the_token(cluster, ray_platform):
    # At start the server ran a driver with TLS but no token against the cluster, and went on only because
    # the cluster answered with its authentication error (check_locked): the proof is in its log.
    assert f"the Ray cluster at {cluster.address} refused a client without its token" in ray_platform.server_log()


def test_the_lock_check_refuses_an_environment_without_token_auth_or_tls(cluster):
    env = cluster.node_env(cluster.head)
    with pytest.raises(RayClusterError, match="RAY_AUTH_MODE=token"):
        check_locked(cluster.address, {**env, "RAY_AUTH_MODE": "disabled"})
    with pytest.raises(RayClusterError, match="RAY_USE_TLS=1"):
        check_locked(cluster.address, {k: v for k, v in env.items() if k != "RAY_USE_TLS"})


def test_an_allreduce_job_packs_on_one_node_and_succeeds(cluster, ray_tenant):
    handle = ray_tenant.submit(Job(name="packed", algorithm="allreduce", workers=2, gpus_per_worker=1, **TINY))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    placed = [e.message for e in handle.events() if e.message.startswith("placed on ")]
    assert len(placed) == 1
    ips = {part.rsplit(": ", 1)[1] for part in placed[0].removeprefix("placed on ").split(", ")}
    assert len(ips) == 1 and ips <= {n.ip for n in cluster.nodes}, placed
    # Each worker got a GPU of its own from Ray (the nodes have 2 fake ones): its log, copied back here, says which.
    devices = {
        w: line.split("CUDA_VISIBLE_DEVICES=")[1].split(")")[0] for w, line in handle.logs() if "training on" in line
    }
    assert set(devices) == {0, 1} and len(set(devices.values())) == 2 and "''" not in devices.values(), devices


def test_a_gasloc_job_spreads_over_three_nodes_and_gossips_across_them(cluster, ray_tenant):
    cluster.wait_idle()  # SPREAD is best effort: with an earlier job's group still on a node, two could share one
    handle = ray_tenant.submit(Job(name="spread", algorithm="gasloc", workers=3, local_steps=2, **TINY))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    placed = [e.message for e in events if e.message.startswith("placed on ")]
    ips = {part.rsplit(": ", 1)[1] for part in placed[0].removeprefix("placed on ").split(", ")}
    assert ips == {n.ip for n in cluster.nodes}, placed
    rounds = [e for e in events if e.kind == "ROUND"]
    assert any("exchanged with [" in e.message and "exchanged with []" not in e.message for e in rounds), [
        e.message for e in rounds
    ]


def test_an_allreduce_group_too_big_for_one_node_spans_two_and_succeeds(cluster, ray_tenant):
    # Three processes, two CPUs a node: PACK puts the group on two nodes, and its gloo pairs cross between them
    # (bound to each node's cluster address: this machine's host name resolves to a loopback address).
    cluster.wait_idle()
    handle = ray_tenant.submit(Job(name="spanning", algorithm="allreduce", workers=3, **TINY))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert len(set(_placement(handle).values())) == 2, _placement(handle)


def test_a_job_asking_for_more_gpus_than_the_cluster_has_stays_queued_with_a_reason(ray_tenant):
    handle = ray_tenant.submit(Job(name="greedy", algorithm="allreduce", workers=4, gpus_per_worker=2, **TINY))
    reason = _waiting_reason(handle)
    assert "needs 8 GPUs; the Ray cluster has 6 GPUs" in reason, reason
    assert handle.status().state == "QUEUED"
    handle.cancel()


def test_a_multi_node_job_with_a_file_store_outside_the_shared_roots_is_refused(ray_platform, ray_tenant):
    store = ray_platform.tenant_dir("raytenant", "ckpt").as_uri()
    with pytest.raises(errors.InvalidJob, match="different nodes"):
        ray_tenant.submit(Job(name="local-store", algorithm="gasloc", workers=3, checkpoint_store=store, **TINY))


def test_a_tenant_over_its_gpu_quota_is_refused(ray_tenant):
    with pytest.raises(errors.QuotaExceeded, match="GPUs"):
        ray_tenant.submit(Job(name="over", algorithm="allreduce", workers=3, gpus_per_worker=3, **TINY))


def _waiting_reason(handle) -> str:
    for event in handle.events():
        if event.message.startswith("waiting: "):
            return event.message
    raise AssertionError("the job never said why it waits")


def _node_step(job_id: str, worker: int = 0) -> int:
    """The latest step the worker's log on its node shows (written by the worker, control plane or not)."""
    try:
        text = (node_root() / job_id / f"worker-{worker}" / "worker.log").read_bytes()
    except FileNotFoundError:
        return 0
    return max((int(m.group(1)) for m in STEP_LINE.finditer(text)), default=0)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        os.killpg(pid, sig)


def _readopted(handle) -> int:
    return sum(e.message.startswith("server restarted; re-adopted") for e in _events_so_far(handle))


def test_the_workers_train_on_through_a_killed_and_a_stopped_control_plane_which_readopts_them(
    cluster, ray_platform, ray_tenant
):
    steps = 200
    handle = ray_tenant.submit(
        Job(
            name="through",
            algorithm="allreduce",
            workers=2,
            **{**TINY, "steps": steps, "eval_every": 100, "checkpoint_every": 50},
        )
    )
    wait_for(lambda: _node_step(handle.id) >= 10, timeout=JOB_TIMEOUT_S)
    pids = _pids_of(handle.id)
    assert len(pids) == 2, pids
    try:
        for outage in (1, 2):
            # Paused through each outage but for the stretch it tests: a graceful stop can take longer than the
            # whole job trains (100 steps a second here), so the job is still running, at a known step, when the
            # control plane is away. The workers are the same processes throughout.
            _signal(pids, signal.SIGSTOP)
            try:
                at = _node_step(handle.id)
                if outage == 1:
                    ray_platform.kill()  # SIGKILL: the Ray driver dies with it
                else:
                    assert ray_platform.stop(leave_workers=True) == 0  # graceful, on_stop "leave": an upgrade
                _signal(pids, signal.SIGCONT)
                wait_for(
                    lambda at=at: _node_step(handle.id) >= at + 10, timeout=JOB_TIMEOUT_S
                )  # trains on, no control plane
                _signal(pids, signal.SIGSTOP)
                assert _node_step(handle.id) < steps
                _start(ray_platform, cluster)
                wait_for(lambda outage=outage: _readopted(handle) == outage)  # it serves, and adopted both actors
            finally:
                _signal(pids, signal.SIGCONT)
    finally:
        if ray_platform.proc is None:  # failed mid-outage: the module's later tests need their server
            _start(ray_platform, cluster)
    assert sorted(_pids_of(handle.id)) == sorted(pids)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gapless
    progress = [e.step for e in events if e.kind == "PROGRESS"]
    assert progress == sorted(set(progress)) and progress[-1] == steps  # each report once, in order
    assert [e.step for e in events if e.kind == "CHECKPOINT"] == [50, 100, 150, 200]
    assert [e.step for e in events if e.kind == "EVAL"] == [100, 200]
    messages = [e.message for e in events]
    assert messages.count("server restarted; re-adopted 2 running worker processes") == 2, messages
    assert not any("restarting the job" in m or "will resume" in m for m in messages), messages
    actions = [r.action for r in read_records(ray_platform.data_dir / "audit") if r.resource == handle.id]
    assert actions.count(Action.JOB_STARTED) == 1 and Action.JOB_RESTARTED not in actions
    for worker in (0, 1):  # one process trained it all, in the first attempt
        log = (node_root() / handle.id / f"worker-{worker}" / "worker.log").read_text()
        assert log.count("started (attempt") == 1 and "started (attempt 1)" in log


def _host_pid(node) -> int:
    """The pid of the node's host actor (Ray titles an actor's process ``ray::<class>``); 0 while there is none."""
    for pid in node.pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::NodeHost"):
                return pid
    return 0


def test_a_node_host_that_dies_is_restarted_and_answers_for_the_workers_it_started(cluster, ray_tenant):
    # The actor that forked a node's workers is SIGKILLed mid-job: the workers train on, Ray starts the host
    # again, and the new one, from its records on the node, reaches them: it stops them on cancel, and reports
    # their exits (none of which is taken for a failure).
    long = {**TINY, "steps": 20_000, "eval_every": 20_000, "checkpoint_every": 20_000}  # a log line every 200 steps
    handle = ray_tenant.submit(Job(name="host-loss", algorithm="allreduce", workers=2, **long))
    wait_for(lambda: _node_step(handle.id) >= 200, timeout=JOB_TIMEOUT_S)
    node = next(n for n in cluster.nodes if n.ip in _placement(handle).values())
    pids, host = _pids_of(handle.id), _host_pid(node)
    assert len(pids) == 2 and host, (pids, host)
    os.kill(host, signal.SIGKILL)
    wait_for(lambda: _host_pid(node) not in (0, host))
    at = _node_step(handle.id)
    wait_for(lambda: _node_step(handle.id) >= at + 200, timeout=JOB_TIMEOUT_S)
    assert sorted(_pids_of(handle.id)) == sorted(pids)  # the same processes, training on
    handle.cancel()
    assert handle.wait().state == "CANCELLED"
    assert _pids_of(handle.id) == []  # stopped through the new host
    messages = [e.message for e in handle.events()]
    assert not any("exited with code" in m or "restart" in m for m in messages), messages


def test_a_gasloc_job_outlives_a_lost_node_its_worker_placed_again_on_another(cluster, ray_tenant):
    # Last in the module: the node stays lost. Its raylet and every process in its namespace are killed.
    handle = ray_tenant.submit(
        Job(
            name="node-loss",
            algorithm="gasloc",
            workers=3,
            local_steps=2,
            round_time_s=2.0,  # rounds of 2 s: the peers train on long enough for the lost worker to come back
            **{**TINY, "steps": 60, "eval_every": 60, "checkpoint_every": 20},
        )
    )
    placed = _placement(handle)
    wait_for(lambda: any(e.kind == "ROUND" and e.step >= 4 for e in _events_so_far(handle)), timeout=JOB_TIMEOUT_S)
    lost = cluster.nodes[2]
    victim = next(w for w, ip in placed.items() if ip == lost.ip)
    cluster.kill_node(lost)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    messages = [e.message for e in handle.events()]
    assert any(f"worker {victim} exited with code -9" in m and "restarting it" in m for m in messages), messages
    again = [m for m in messages if m.startswith(f"worker {victim} placed on ")]
    assert again and again[-1].removeprefix(f"worker {victim} placed on ") in {cluster.nodes[0].ip, cluster.nodes[1].ip}
    events = list(handle.events())
    replaced = max(i for i, e in enumerate(events) if e.message.startswith(f"worker {victim} placed on "))
    rejoined = [  # the relaunched worker gossips with its peers again, not alone to the end
        e
        for e in events[replaced:]
        if e.kind == "ROUND" and e.worker == victim and "exchanged with []" not in e.message
    ]
    assert rejoined, [e.message for e in events[replaced:] if e.worker == victim]


def _placement(handle) -> dict[int, str]:
    """Worker -> node address, from the job's "placed on" event."""
    for event in handle.events():
        if event.message.startswith("placed on "):
            parts = event.message.removeprefix("placed on ").split(", ")
            return {int(p.split(":")[0].removeprefix("worker ")): p.rsplit(": ", 1)[1] for p in parts}
    raise AssertionError("the job was never placed")


def _events_so_far(handle):
    from tests.test_server_faults import _events_until_now

    return _events_until_now(handle._client, handle.id)


def test_an_allreduce_job_restarts_its_group_on_another_node_when_its_node_is_lost(cluster, ray_tenant):
    # After the GASLoC node-loss test: nodes 0 (the head) and 1 are left. A driver of the test's own holds the
    # head's CPUs, so the job packs onto node 1; once node 1 is lost, the head is freed for its restart.
    cluster.wait_idle()
    head = cluster.head
    hold = (
        "import ray, sys\n"
        "from ray.util.placement_group import placement_group\n"
        f"ray.init(address={cluster.address!r}, namespace='test-holder', logging_level='ERROR')\n"
        f"g = placement_group([{{'CPU': 2, 'node:{head.ip}': 0.01}}], strategy='STRICT_PACK')\n"
        "ray.get(g.ready(), timeout=600)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        head.run(sys.executable, "-c", hold),
        env=cluster.node_env(head),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        handle = ray_tenant.submit(
            Job(
                name="group-loss",
                algorithm="allreduce",
                workers=2,
                max_failures=0,
                **{**TINY, "steps": 200, "eval_every": 100, "checkpoint_every": 20},
            )
        )
        placed = _placement(handle)
        lost = cluster.nodes[1]
        assert set(placed.values()) == {lost.ip}, placed
        # the server's record of a checkpoint (the restart resumes from it), not only its objects in the store
        wait_for(
            lambda: any(e.kind == "CHECKPOINT" and e.step >= 20 for e in _events_so_far(handle)), timeout=JOB_TIMEOUT_S
        )
        cluster.kill_node(lost)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder's driver ends, and its group with it
        holder.wait()
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason  # max_failures=0: the lost node was no failure of the job
    messages = [e.message for e in handle.events() if e.message]  # not the progress reports
    restarted = [m for m in messages if "was lost with its node; restarting the job from step" in m]
    assert len(restarted) == 1 and "(not counted: 0/0 failures)" in restarted[0], messages
    step = int(restarted[0].split("from step ")[1].split(" ")[0])
    assert step >= 20 and f"resumed from checkpoint at step {step}" in messages, messages
    again = [m for m in messages if m.startswith("placed on ")]
    assert len(again) == 2 and set(_ips(again[1])) == {head.ip}, again


def _ips(placed: str) -> list[str]:
    return [part.rsplit(": ", 1)[1] for part in placed.removeprefix("placed on ").split(", ")]
