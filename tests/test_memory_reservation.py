"""A real server's local executor reserves each running job's memory estimate against ``node_memory_mib``: a job
that does not fit beside the running ones stays QUEUED, saying why, until one of them ends.

Four jobs of about 7.3 GiB each on a 24 GiB node. Their estimate is real (a byte GPT's activations for 2020 x 256
tokens), their cost is not: ``worker_memory_mib`` stops each worker at its first step as out of memory, so
the jobs end on their own. They are queued while the node runs no worker at all, then the server starts again
with room for workers: its first placement pass sees all four at once.
"""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from cantata.proto.v1 import common_pb2
from cantata.sdk.client import Client
from cantata.sdk.job import Job
from cantata.server.jobs import memory
from cantata.server.jobs.jobspec import parse_job_spec
from testkit.platform import Platform
from testkit.waiting import JOB_TIMEOUT_S, wait_for

pytestmark = pytest.mark.integration

NODE_MIB = 24 * 1024
FIELDS = dict(model="gpt-tiny", steps=10, batch_size=2020, seq_len=256)


def _nanos(time: str) -> int:
    stamp = Timestamp()
    stamp.FromJsonString(time)
    return stamp.ToNanoseconds()


def test_a_job_that_does_not_fit_beside_the_running_ones_waits_until_one_ends(tmp_path):
    spec = parse_job_spec(common_pb2.JobSpec(name="x", **FIELDS), default_store="file:///tmp/c", roots=[])
    rank = memory.worker_estimate(spec)
    assert 7.2 * memory.GIB < rank < 7.4 * memory.GIB  # three fit in 24 GiB, four do not
    p = Platform(tmp_path, settings={"node_memory_mib": NODE_MIB, "worker_memory_mib": 256, "max_workers_on_node": 0})
    p.start()
    try:
        with p.enroll("acme") as client:
            handles = [client.submit(Job(name=f"big-{i}", **FIELDS)) for i in range(4)]
            wait_for(
                lambda: all("this node runs at most 0" in h.status().reason for h in handles), timeout=JOB_TIMEOUT_S
            )
        p.stop()
        settings = p.paths.load_settings()
        settings.max_workers_on_node = 8
        p.paths.save_settings(settings)
        p.start()
        with Client.from_profile("acme") as client:
            ended = [wait_for(lambda job=h.id: (s := client.get(job)).terminal and s) for h in handles]
            events = {h.id: list(client.events(h.id)) for h in handles}
    finally:
        if p.proc is not None:
            p.stop()
    assert [s.state for s in ended] == ["FAILED"] * 4, [s.reason for s in ended]
    assert all("out of memory" in s.reason for s in ended)  # each did start, and stopped at its limit
    *first, last = handles
    waits = [e.message for e in events[last.id] if e.message.startswith("waiting: waiting for")]
    free = NODE_MIB * memory.MIB - 3 * rank
    assert waits == [
        f"waiting: waiting for {memory.size(rank)} of memory ({memory.size(free)} of this node's 24.0 GiB free "
        "beside 3 running job(s))"
    ], waits
    assert not any("waiting for" in e.message for h in first for e in events[h.id])  # the first three did fit
    started = {h.id: next(_nanos(e.time) for e in events[h.id] if e.state == "STARTING") for h in handles}
    first_end = min(_nanos(e.time) for h in first for e in events[h.id] if e.terminal)
    assert started[last.id] > first_end  # placed only once one of the three had ended
    assert all(started[h.id] < first_end for h in first)  # the three had started side by side
