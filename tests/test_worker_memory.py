"""A job's memory is checked at submit against the node, and a worker past its limit is stopped and reported."""

from __future__ import annotations

import pytest
import torch

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import Model
from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.server import memory
from cantata.server.jobspec import InvalidField, parse_job_spec
from cantata.trainer.model import build_model
from tests.platform import Platform

NODE_MIB = 4096
WORKER_MIB = 256  # what a worker may allocate once loaded


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    settings = p.paths.load_settings()
    settings.node_memory_mib, settings.worker_memory_mib = NODE_MIB, WORKER_MIB
    p.paths.save_settings(settings)
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.mark.parametrize("model", list(Model))
def test_the_estimates_parameter_counts_are_the_trainers(model):
    with torch.device("meta"):
        built = build_model(model.value, seed=1)
    assert memory.parameters(model) == sum(p.numel() for p in built.parameters())


def _parse(node_memory: int, **fields) -> common_pb2.JobSpec:
    return parse_job_spec(
        common_pb2.JobSpec(name="x", steps=10, **fields),
        default_store="file:///tmp/ckpt",
        roots=[],
        node_memory=node_memory,
    )


def test_a_job_that_cannot_fit_in_the_node_is_refused_naming_batch_size():
    node = 2 << 30
    fits = _parse(node, model=Model.GPT_TINY.value, batch_size=16, seq_len=64)
    assert memory.worker_estimate(fits) < node
    with pytest.raises(InvalidField) as err:
        _parse(node, model=Model.GPT_TINY.value, batch_size=4096, seq_len=1024)
    assert err.value.field == "batch_size" and "MiB" in str(err.value)
    with pytest.raises(InvalidField) as err:  # each worker counts: what fits once may not fit four times
        _parse(node, algorithm="allreduce", workers=4, model=Model.GPT_SMALL.value, batch_size=64, seq_len=256)
    assert err.value.field == "batch_size"
    assert memory.worker_estimate(_parse(0, batch_size=1, seq_len=1)) >= memory.LOADED_BYTES


def test_a_gpu_worker_gets_no_address_space_cap_since_cuda_reserves_the_devices_memory_at_start():
    cpu = _parse(0, model=Model.GPT_TINY.value, batch_size=16, seq_len=64)
    gpu = _parse(0, model=Model.GPT_TINY.value, batch_size=16, seq_len=64, gpus_per_worker=1)
    assert memory.runtime_budget(cpu, 0) > memory.HEADROOM_BYTES
    assert memory.runtime_budget(cpu, 512) == 512 * memory.MIB
    assert memory.runtime_budget(gpu, 0) == 0
    assert memory.runtime_budget(gpu, 512) == 0


def test_the_server_refuses_a_job_bigger_than_the_node(platform):
    with platform.enroll("acme") as client:
        with pytest.raises(errors.InvalidJob) as err:
            client.submit(Job(name="huge", model="gpt-tiny", steps=10, batch_size=4096, seq_len=1024))
        assert err.value.field == "batch_size"
        assert client.list() == []


def test_a_worker_past_its_memory_limit_fails_the_job_as_out_of_memory_without_a_restart(platform):
    with platform.enroll("globex") as client:
        # About 850 MiB of activations a step: accepted by the node, far past the worker's 256 MiB.
        handle = client.submit(Job(name="greedy", model="gpt-tiny", steps=20, batch_size=256, seq_len=256))
        status = handle.wait()
    assert status.state == "FAILED"
    assert "out of memory: worker 0 exceeded its memory limit" in status.reason, status.reason
    assert status.reason.endswith("not restarted: the error is permanent"), status.reason
