"""A real gasloc job whose worker 2 is paused in each of its rounds is reported as a straggler, once.

Worker 2's process is SIGSTOPped for a few seconds right after each of its
round reports, so each of its next rounds holds the pause (its peers' waits
for it fall in their exchanges, which their paces leave out). After the
server's ``straggler_reports`` slow rounds in a row, the job gets one
straggler event and ``cantata_job_stragglers`` reads 1; once worker 2 runs
freely again its next round ends the episode with a second event.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from testkit.platform import Platform, cli, free_port
from tests.test_decentralized_outcome import _pid_of
from tests.test_metrics import samples, value

SLOW = 2
PAUSE_S = 4.0  # in each round of 5 steps: over 0.8 s a step
JOB = dict(workers=3, local_steps=5, steps=300, batch_size=8, seq_len=32, checkpoint_every=100)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"), settings={"metrics_listen": f"127.0.0.1:{free_port()}"})
    p.start()
    yield p
    p.stop()


def test_a_worker_slowed_in_every_window_is_reported_once_and_cleared(platform, tenant):
    settings = platform.paths.load_settings()
    cli("admin", "scrapers", "add", "prom", "--json", env=platform.env)
    handle = tenant.submit(Job(name="straggler", algorithm="gasloc", topology="ring", **JOB))
    events = handle.events()
    labels = {"tenant": "acme", "job_id": handle.id}
    try:
        first = next((e for e in events if e.kind == "ROUND" and e.worker == SLOW), None)
        assert first is not None, (handle.status(), [e.message for e in handle.events()][-8:])
        pid = _pid_of(handle, SLOW)
        flagged, gauge = None, None
        for _ in range(settings.straggler_reports + 4):  # the event comes one window later; a peer may hiccup
            os.kill(pid, signal.SIGSTOP)
            if flagged is not None:  # read while it is stopped: no free window can end the episode meanwhile
                gauge = value(samples(platform, Profile.named("prom")), "cantata_job_stragglers", **labels)
                os.kill(pid, signal.SIGCONT)
                break
            time.sleep(PAUSE_S)  # the fault itself: the length of the pause, not a wait for something
            os.kill(pid, signal.SIGCONT)
            for event in events:
                assert not event.terminal, event
                if "straggler" in event.message:
                    flagged = event
                if event.kind == "ROUND" and event.worker == SLOW:
                    break
        assert flagged is not None, "no straggler event"
        assert flagged.kind == "MESSAGE" and flagged.worker == SLOW
        assert flagged.message.startswith(f"worker {SLOW} is a straggler: step time ")
        assert f"for {settings.straggler_reports} reports" in flagged.message
        assert gauge == 1

        cleared = next(e for e in events if "straggler" in e.message or e.terminal)  # it runs freely again
        assert cleared.message.startswith(f"worker {SLOW} is no longer a straggler"), cleared
        assert value(samples(platform, Profile.named("prom")), "cantata_job_stragglers", **labels) == 0
    finally:
        handle.cancel()
    messages = [e.message for e in handle.events() if "straggler" in e.message]
    assert len(messages) == 2, messages  # one event each way: not one per report
