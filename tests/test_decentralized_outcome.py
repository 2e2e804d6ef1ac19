"""A decentralized job ends in the consensus it really reached: a paused peer is waited out, not quarantined,
and a final average short of ``min_workers`` fails the job with the reason."""

from __future__ import annotations

import os
import re
import signal

import pytest

from cantata.sdk.job import Job
from tests.platform import Platform
from tests.test_decentralized_jobs import SMALL, _worker_of
from tests.test_jobs import _pids_of

# a fixed round deadline, so that a pause of a few rounds is surely longer than a gossip timeout
PAUSED = dict(SMALL, steps=150, round_deadline_s=2.0)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    settings = p.paths.load_settings()
    settings.worker_heartbeat_timeout_s = 600.0  # a stopped worker is left to its peers, not killed as hung
    p.paths.save_settings(settings)
    p.start()
    yield p
    p.stop()


def _pid_of(handle, worker: int) -> int:
    pids = [pid for pid in _pids_of(handle.id) if _worker_of(pid) == worker]
    assert pids, f"worker {worker} is not running: {handle.status()}"
    return pids[0]


def test_an_honest_worker_paused_past_the_gossip_timeout_is_not_quarantined_and_the_job_succeeds(tenant):
    handle = tenant.submit(Job(name="paused", algorithm="gasloc", **PAUSED))
    events = handle.events()
    next(e for e in events if e.kind == "ROUND" and e.worker == 2 and e.step >= 15)  # round 15: it gossiped a while
    paused = _pid_of(handle, 2)
    os.kill(paused, signal.SIGSTOP)
    try:
        # its ring neighbours time out on it round after round: each skips it six times
        skips = {1: 0, 3: 0}
        for event in events:
            if event.kind == "ROUND" and event.worker in skips and re.search(r"skipped \[[^]]*\b2\b", event.message):
                skips[event.worker] += 1
                if min(skips.values()) >= 6:
                    break
    finally:
        os.kill(paused, signal.SIGCONT)
    status = handle.wait()
    messages = [e.message for e in handle.events()]
    assert status.state == "SUCCEEDED", (status.reason, [m for m in messages if not m.startswith("round ")])
    assert not any("quarantined" in m for m in messages), [m for m in messages if "quarantin" in m]
    assert not any("final average failed" in m for m in messages), messages
    # every worker holds the same consensus of all 4
    held = [m for m in messages if "holds the consensus of 4 workers" in m]
    assert len(held) == 4 and len({m.split("(parameters ")[1].split(")")[0] for m in held}) == 1, held


def test_a_final_average_short_of_min_workers_fails_the_job_with_the_reason(tenant):
    handle = tenant.submit(Job(name="short", algorithm="gasloc", min_workers=4, **PAUSED))
    events = handle.events()
    next(e for e in events if e.kind == "ROUND" and e.worker == 2 and e.step >= 20)  # its round 20
    hung = _pid_of(handle, 2)
    os.kill(hung, signal.SIGSTOP)  # it hangs until the others are done: their final average leaves it out
    try:
        status = handle.wait()
    finally:
        os.kill(hung, signal.SIGKILL)
    assert status.state == "FAILED", status.reason
    # the others' ring either left it out (and so fell short) or broke on workers still waiting for it
    short = r"the final average reached [123] of 4 worker groups \(with worker groups \[[0-9, ]*\]\), fewer than min_workers=4"
    broken = r"the final average failed \(the ring \[[0-9, ]+\] failed at step \d+: no chunk from worker \d\)"
    assert re.search(
        rf"worker [013] exited with code 1: ConsensusFailed: worker [013]: ({short}|{broken})", status.reason
    )
    assert status.reason.endswith("not restarted: the error is permanent"), status.reason
