"""A decentralized job's quorum (``min_workers``) on a server that never restarts dead workers."""

from __future__ import annotations

import pytest

from cantata.sdk.job import Job
from testkit.platform import Platform
from tests.test_decentralized_jobs import SMALL, kill_after_round_4


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    settings = p.paths.load_settings()
    settings.max_worker_restarts = 0  # a dead worker stays dead: only the quorum decides
    p.paths.save_settings(settings)
    p.start()
    yield p
    p.stop()


def test_a_job_goes_on_while_min_workers_are_alive(tenant):
    handle = tenant.submit(
        Job(name="quorate", algorithm="gasloc", min_workers=2, **{**SMALL, "workers": 3, "steps": 150})
    )
    kill_after_round_4(handle, worker=1)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert any("continuing with 2 of 3 worker processes" in e.message for e in handle.events())


def test_a_job_fails_once_fewer_than_min_workers_are_alive(tenant):
    handle = tenant.submit(
        Job(name="strict", algorithm="gasloc", min_workers=3, **{**SMALL, "workers": 3, "steps": 100_000})
    )  # ends only by the kill
    kill_after_round_4(handle, worker=1)
    status = handle.wait()
    assert status.state == "FAILED"
    assert "worker 1 exited with code -9" in status.reason and "min_workers=3" in status.reason


def test_a_diloco_ring_goes_on_without_a_dead_worker_and_its_rounds_say_so(tenant):
    handle = tenant.submit(
        Job(name="ring-quorate", algorithm="diloco", min_workers=2, **{**SMALL, "workers": 3, "steps": 150})
    )
    kill_after_round_4(handle, worker=1)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    rounds = [e.message for e in handle.events() if e.kind == "ROUND"]
    # the all-reduce's ring is workers 0 and 2 from then on, and their rounds name worker 1 skipped, not summed
    assert any("exchanged with [2], skipped [1]" in m for m in rounds), rounds
    assert any("exchanged with [0], skipped [1]" in m for m in rounds), rounds
