"""A model whose whole fp32 weights and AdamW state do not fit one worker trains when sharded over four.

qwen3-0.6b (596M parameters) with 3 steps of 1 x 16 tokens, through the
platform: every worker runs under the server's ``RLIMIT_AS`` of
``worker_memory_mib`` past its loaded size, 6.5 GiB, less than the 6.66 GiB of
the whole model's fp32 weights and AdamW moments (8.9 GiB with its gradients). On
``dp_shard = 4`` each rank builds the model on the meta device and holds a
quarter of it, and the job succeeds; the same job on one worker, which builds
and trains the whole model, fails as out of memory.
"""

from __future__ import annotations

from typing import Any

import pytest

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import Model
from cantata.sdk.job import Job
from cantata.server.jobs import memory
from cantata.server.jobs.jobspec import parse_job_spec
from testkit.platform import Platform

CAP_MIB = 6656  # each worker's address space past its loaded size
MODEL = Model.QWEN3_0_6B
SMALL: dict[str, Any] = dict(steps=3, batch_size=1, seq_len=16, eval_every=3, eval_batches=1, checkpoint_every=3)


def _parsed(**mesh: Any) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(name="x", model=MODEL.value, **SMALL, **mesh)
    return parse_job_spec(spec, default_store="file:///tmp/ckpt", roots=[])


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    # The node declares room for the larger of the two jobs by the admission estimate, so both are admitted
    # and the address-space cap, not the submit check, is what each worker meets.
    largest = max(memory.job_estimate(_parsed(workers=w, dp_shard=w)) for w in (1, 4))
    settings = {"worker_memory_mib": CAP_MIB, "node_memory_mib": (largest + (1 << 30)) // memory.MIB}
    p = Platform(tmp_path_factory.mktemp("platform"), settings=settings)
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def test_the_cap_holds_less_than_the_whole_model_and_its_adamw_state():
    whole = 12 * memory.parameters(MODEL)  # fp32 weights and two moments, before any gradient
    assert whole > CAP_MIB * memory.MIB > 16 * memory.parameters(MODEL) / 4


@pytest.mark.timeout(1800)
def test_a_model_too_big_for_one_worker_trains_sharded_over_four_and_fails_on_one(platform):
    with platform.enroll("acme") as client:
        sharded = client.submit(Job(name="sharded", model=MODEL.value, workers=4, dp_shard=4, **SMALL)).wait()
        assert sharded.state == "SUCCEEDED", sharded.reason
        whole = client.submit(Job(name="whole", model=MODEL.value, workers=1, **SMALL)).wait()
    assert whole.state == "FAILED"
    assert "out of memory: worker 0 exceeded its memory limit" in whole.reason, whole.reason
