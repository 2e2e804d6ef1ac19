"""The SDK across server faults: bounded waits, event streams that outlive a restart, request ids that mean one spec.

The module's server has one worker slot, so a two-worker job stays QUEUED for
as long as a test needs a job that never produces another event. Its tenant's
jobs checkpoint to Azurite, so the server itself talks to Azure.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid

import grpc
import pytest

from cantata.sdk import errors
from cantata.sdk.client import Client
from cantata.sdk.job import Job
from cantata.server.config import DataDir
from cantata.storage import open_store
from cantata.storage.logs import LEVEL_ENV
from testkit.platform import Platform
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.services import azurite_connection_string

WAIT_S = 2.0
SLACK_S = 8.0  # generous on a loaded machine, yet far below the minute a blocked read used to take
OLD_RESUME_BUDGET_S = 12.0  # the SDK used to give up resuming a stream after about 11 s
RUNNING = dict(steps=60, eval_every=30, checkpoint_every=10, batch_size=4, seq_len=16)
HEADER_DUMP = "Response headers:"  # what azure.core's HTTP logging policy writes at INFO


@pytest.fixture(scope="module")
def container(azurite_service):
    name = f"faults-{uuid.uuid4().hex[:12]}"
    connection = azurite_connection_string(azurite_service.endpoint)
    open_store(f"az://{name}/jobs", connection_string=connection).container.create_container()
    return name, connection


@pytest.fixture(scope="module")
def platform(tmp_path_factory, container):
    p = Platform(tmp_path_factory.mktemp("platform"), env={"AZURE_STORAGE_CONNECTION_STRING": container[1]})
    paths = DataDir(p.data_dir)
    settings = paths.load_settings()
    settings.max_workers_on_node = 1
    paths.save_settings(settings)
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.fixture(scope="module")
def tenant(platform):
    with platform.enroll("acme", max_workers_per_job=2) as client:
        yield client


@pytest.fixture
def stuck(tenant, container):
    """A job that can never be placed (two workers, one slot): QUEUED, silent, until cancelled."""
    handle = tenant.submit(
        Job(name="stuck", algorithm="allreduce", workers=2, checkpoint_store=f"az://{container[0]}/jobs", **RUNNING)
    )
    yield handle
    assert wait_for(lambda: _cancelled(handle)) in ("CANCELLING", "CANCELLED")  # it would block the slot's queue


def _cancelled(handle) -> str:
    """The state a cancel leaves; '' while the client has not reconnected to a restarted server."""
    try:
        return handle.cancel().state
    except errors.Unavailable:
        return ""


def _timed_wait(handle) -> tuple[type[BaseException], float]:
    start = time.monotonic()
    with pytest.raises(errors.CantataError) as caught:
        handle.wait(timeout=WAIT_S)
    return type(caught.value), time.monotonic() - start


def test_wait_times_out_while_no_event_arrives(stuck):
    kind, took = _timed_wait(stuck)
    assert kind is errors.WaitTimedOut and WAIT_S <= took < WAIT_S + SLACK_S
    assert stuck.status().state == "QUEUED"  # timing out the wait leaves the job alone


def test_wait_times_out_while_the_server_is_frozen(platform, stuck):
    platform.proc.send_signal(signal.SIGSTOP)
    try:
        kind, took = _timed_wait(stuck)
    finally:
        platform.proc.send_signal(signal.SIGCONT)
    assert kind is errors.WaitTimedOut and WAIT_S <= took < WAIT_S + SLACK_S


def test_wait_times_out_while_the_server_is_down(platform, stuck):
    platform.kill()
    try:
        kind, took = _timed_wait(stuck)
    finally:
        platform.start()
    assert kind is errors.WaitTimedOut and WAIT_S <= took < WAIT_S + SLACK_S


def test_events_give_up_after_the_resume_window(platform, stuck):
    with Client.from_profile("acme", resume_window=WAIT_S) as client:
        stream = client.events(stuck.id)
        assert next(stream).state == "QUEUED"
        platform.kill()
        start = time.monotonic()
        try:
            with pytest.raises(errors.StreamInterrupted, match=stuck.id):
                next(stream)
            took = time.monotonic() - start
        finally:
            platform.start()
    assert WAIT_S <= took < WAIT_S + SLACK_S


def test_events_resume_across_a_server_restart_without_gaps_or_duplicates(platform, tenant):
    handle = tenant.submit(Job(name="across", **RUNNING))
    seen, failures = [], []

    def follow() -> None:
        try:
            for event in handle.events():
                seen.append(event)  # noqa: PERF402 (one by one, as they arrive: the test watches the list)
        except Exception as exc:  # reported below, not lost in the thread
            failures.append(exc)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    wait_for(
        lambda: any(e.step > 0 for e in seen), timeout=JOB_TIMEOUT_S
    )  # the kill drops the stream mid-job, its cursor moved
    platform.kill()  # the job trains on; the stream is what breaks
    down = time.monotonic()
    # The fault under test is an outage longer than the SDK's old resume budget: hold it that long.
    wait_for(lambda: time.monotonic() - down > OLD_RESUME_BUDGET_S)
    platform.start()
    follower.join()
    assert not failures, failures
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    assert seen[-1].terminal and seen[-1].state == "SUCCEEDED", seen[-1].message
    assert any("server restarted" in e.message for e in seen)  # the one stream spanned the restart


def test_a_request_id_names_one_spec(tenant):
    job = Job(name="once", algorithm="allreduce", workers=2, **RUNNING)  # never placed: nothing runs
    first = tenant.submit(job)
    try:
        assert tenant.submit(job).id == first.id  # the same spec again: an idempotent retry
        with pytest.raises(errors.Conflict) as caught:
            tenant.submit(
                Job(
                    name="once",
                    algorithm="allreduce",
                    workers=2,
                    **{**RUNNING, "steps": 61},
                    request_id=job.request_id,
                )
            )
        assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert job.request_id in caught.value.message and first.id in caught.value.message
        assert [j.id for j in tenant.list() if j.name == "once"] == [first.id]
    finally:
        first.cancel()


def test_the_server_log_has_no_azure_header_dumps_unless_asked(platform, tenant, stuck):
    assert tenant.checkpoints(stuck.id) == []  # the server lists the job's Azure container
    assert HEADER_DUMP not in platform.server_log()
    platform.stop()
    platform.env[LEVEL_ENV] = "INFO"
    try:
        platform.start()
        assert tenant.checkpoints(stuck.id) == []
        assert HEADER_DUMP in platform.server_log()  # asked for: the same operation logs them
    finally:
        platform.stop()
        del platform.env[LEVEL_ENV]
        platform.start()
