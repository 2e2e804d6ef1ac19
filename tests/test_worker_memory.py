"""A rank's memory estimate from its mesh, the refusals at submit that name the cause and a fit, what a Ray bundle
asks for, and a worker past its limit stopped and reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import Model
from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.server.executors.ray import RayExecutor
from cantata.server.jobs import memory
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec
from cantata.server.store import JobRecord
from cantata.trainer.model import build_model
from cantata.trainer.optim.routing import route_parameters
from testkit.platform import Platform

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


GIB = memory.GIB
CLUSTER = [Path("/tmp")]  # shared_roots of a cluster (each rank may have a node of its own); None: one machine


@pytest.mark.parametrize("model", list(Model))
def test_the_estimates_parameter_counts_are_the_trainers(model):
    with torch.device("meta"):
        built = build_model(model.value, seed=1)
    assert memory.parameters(model) == sum(p.numel() for p in built.parameters())
    routing = route_parameters(built)  # Muon's hidden matrices are the ones tensor parallelism splits
    assert memory.parts(model).matrices == sum(p.numel() for _, p in routing.muon)


def _parse(node_memory: int, shared_roots: list | None = None, **fields) -> common_pb2.JobSpec:
    return parse_job_spec(
        common_pb2.JobSpec(name="x", steps=10, **fields),
        default_store="file:///tmp/ckpt",
        roots=[],
        node_memory=node_memory,
        shared_roots=shared_roots,
    )


def _mesh(model: str, dp_shard: int = 1, tp: int = 1, dp_replicate: int = 1, **fields) -> common_pb2.JobSpec:
    workers = dp_shard * tp * dp_replicate
    return _parse(0, model=model, workers=workers, dp_shard=dp_shard, tp=tp, dp_replicate=dp_replicate, **fields)


def test_a_ranks_state_is_divided_by_dp_shard_and_tp_and_not_by_dp_replicate():
    parts = memory.parts(Model.QWEN3_32B)
    whole = memory.rank_estimate(_mesh("qwen3-32b"))
    assert whole.state == 16 * parts.total  # fp32 weights, gradients, AdamW's two moments
    sharded = memory.rank_estimate(_mesh("qwen3-32b", dp_shard=8))
    assert sharded.state == 16 * (-(-parts.matrices // 8) + -(-(parts.root + parts.layer_rest) // 8))
    assert memory.rank_estimate(_mesh("qwen3-32b", dp_shard=8, dp_replicate=2)).state == sharded.state
    # tensor parallelism splits the projections only: embeddings, output head and norms stay whole on a tp group
    split = memory.rank_estimate(_mesh("qwen3-32b", dp_shard=4, tp=2))
    assert split.state == 16 * (parts.matrices // 8 + (parts.root + parts.layer_rest) // 4)
    assert sharded.state < split.state < memory.rank_estimate(_mesh("qwen3-32b", dp_shard=4)).state


def test_qwen3_32b_on_8_sharded_ranks_is_charged_a_fraction_of_one_worker_per_rank():
    one = memory.rank_estimate(_mesh("qwen3-32b", batch_size=1, seq_len=16))
    trainings = [
        memory.rank_estimate(_mesh("qwen3-32b", dp_shard=shards, batch_size=1, seq_len=16)).training
        for shards in (1, 2, 4, 8, 16)
    ]
    assert trainings == sorted(trainings, reverse=True) and len(set(trainings)) == 5  # falls with every doubling
    eight = memory.rank_estimate(_mesh("qwen3-32b", dp_shard=8, batch_size=1, seq_len=16))
    assert eight.total < one.total / 3  # was 8 x one worker's for the job: each rank was charged the whole model
    # No rank builds the whole model (the meta device): a rank is charged its training footprint alone.
    assert eight.total == eight.loaded + eight.training < 4 * memory.parameters(Model.QWEN3_32B)
    admitted = _parse(
        eight.total + GIB, CLUSTER, model="qwen3-32b", workers=8, dp_shard=8, batch_size=1, seq_len=16
    )  # a node with room for one rank of it: on a cluster each rank may have its own
    assert admitted.dp_shard == 8


def test_muon_keeps_one_momentum_for_the_hidden_matrices_and_adamw_two_for_the_rest():
    parts = memory.parts(Model.QWEN3_0_6B)
    adamw = memory.rank_estimate(_mesh("qwen3-0.6b", optimizer="adamw"))
    muon = memory.rank_estimate(_mesh("qwen3-0.6b", optimizer="muon"))
    assert adamw.state - muon.state == 4 * parts.matrices
    assert "params+grads+Muon/AdamW" in muon.causes() and "params+grads+AdamW" in adamw.causes()


def test_a_decentralized_rank_keeps_its_outer_copies_of_the_parameters():
    allreduce = memory.rank_estimate(_parse(0, model="qwen3-tiny", workers=2, algorithm="allreduce"))
    diloco = memory.rank_estimate(_parse(0, model="qwen3-tiny", workers=2, algorithm="diloco"))
    assert diloco.state - allreduce.state == 4 * memory.OUTER_COPIES * memory.parameters(Model.QWEN3_TINY)


def test_activations_shrink_with_checkpointing_tensor_parallelism_and_bf16_and_grow_with_the_batch():
    base = dict(batch_size=4, seq_len=512)
    plain = memory.activations(_mesh("qwen3-1.7b", dp_shard=2, **base))
    assert memory.activations(_mesh("qwen3-1.7b", dp_shard=2, batch_size=8, seq_len=512)) == 2 * plain
    logits = 4 * 512 * 4 * 3 * 151936  # fp32 logits, their float copy and gradient: checkpointing keeps them
    kept = memory.activations(_mesh("qwen3-1.7b", dp_shard=2, activation_checkpointing=True, **base)) - logits
    assert 0 < kept * 10 < plain - logits  # 28 layers' inputs and one layer recomputed, not 28 layers' activations
    assert memory.activations(_mesh("qwen3-1.7b", tp=2, **base)) < plain
    assert memory.activations(_mesh("qwen3-1.7b", dp_shard=2, mixed_precision="bf16", **base)) < plain
    assert memory.activations(_mesh("qwen3-1.7b", dp_shard=4, **base)) == plain  # data parallelism does not split


def test_the_estimate_is_within_15_percent_of_the_peak_rss_bench_memory_measured():
    measured = json.loads((Path(__file__).parents[1] / "benchmarks/results/bench_memory.json").read_text())
    assert memory.parameters(Model(measured["model"])) == measured["parameters"]
    batch, seq_len = measured["batch"]
    for row in measured["rows"]:
        spec = _mesh(measured["model"], dp_shard=row["D"], batch_size=batch, seq_len=seq_len)
        peak = max(rank["rss_before_bytes"] + rank["step_peak_bytes"] for rank in row["ranks"])
        assert 0.85 * peak < memory.worker_estimate(spec) < 1.15 * peak, (row["D"], row["path"], peak)


def test_a_refusal_names_the_cause_and_a_change_that_fits():
    node = 24 * GIB
    with pytest.raises(InvalidField) as err:
        _parse(node, CLUSTER, model="qwen3-4b", batch_size=1, seq_len=16)
    assert err.value.field == "dp_shard"
    message = str(err.value)
    assert "per rank (params+grads+AdamW 59.9 GiB" in message and "would fit in 24.0 GiB" in message, message
    assert "dp_shard=4 (workers=4)" in message, message  # the smallest that fits
    assert _parse(node, CLUSTER, model="qwen3-4b", workers=4, dp_shard=4, batch_size=1, seq_len=16)
    with pytest.raises(InvalidField, match=r"dp_shard=4 \(workers=4\) would fit"):
        _parse(node, CLUSTER, model="qwen3-4b", workers=3, dp_shard=3, batch_size=1, seq_len=16)
    with pytest.raises(InvalidField) as err:  # activations: checkpointing or a smaller batch would fit
        _parse(node, CLUSTER, model="qwen3-4b", workers=8, dp_shard=8, batch_size=16, seq_len=64)
    assert err.value.field == "batch_size" and "activation_checkpointing=true" in str(err.value)
    largest = int(str(err.value).rpartition("batch_size=")[2].split()[0])
    fields = dict(model="qwen3-4b", workers=8, dp_shard=8, seq_len=64)
    assert _parse(node, CLUSTER, batch_size=largest, **fields).batch_size == largest
    with pytest.raises(InvalidField):
        _parse(node, CLUSTER, batch_size=largest + 1, **fields)
    assert _parse(node, CLUSTER, batch_size=16, activation_checkpointing=True, **fields).activation_checkpointing


def test_a_refusal_says_so_when_nothing_fits():
    with pytest.raises(InvalidField) as err:  # the embeddings and head alone, over any dp_shard, overflow 1 GiB
        _parse(GIB, CLUSTER, model="qwen3-32b", workers=8, dp_shard=8, batch_size=1, seq_len=16)
    assert err.value.field == "model"
    assert "params+grads+AdamW" in str(err.value)
    assert "no dp_shard, batch_size or activation_checkpointing fits it in 1.0 GiB" in str(err.value)


def test_on_one_machine_all_of_a_jobs_ranks_count():
    fields = dict(model="qwen3-1.7b", workers=4, dp_shard=4, batch_size=4, seq_len=64)
    rank = memory.worker_estimate(_parse(0, **fields))
    assert _parse(rank + GIB, CLUSTER, **fields)  # a cluster: each rank on a node of its own
    with pytest.raises(InvalidField, match=r"on this node: 4 ranks of"):
        _parse(rank + GIB, None, **fields)
    assert _parse(4 * rank, None, **fields)


def test_a_ray_bundle_asks_for_one_ranks_estimate():
    spec = _parse(0, model="qwen3-4b", workers=8, dp_shard=8, batch_size=1, seq_len=16)
    job = JobRecord("j", "acme", "r", spec, common_pb2.QUEUED, "", 0, 0.0, 0.0, 0, "", "")
    bundle = RayExecutor.bundle(job)
    assert bundle["memory"] == memory.worker_estimate(spec) == memory.rank_estimate(spec).total
    one = _parse(0, model="qwen3-4b", batch_size=1, seq_len=16)
    assert bundle["memory"] < memory.worker_estimate(one) / 3  # a rank's share, not the whole model


def test_a_job_that_cannot_fit_in_the_node_is_refused_naming_batch_size():
    node = 2 << 30
    fits = _parse(node, model=Model.GPT_TINY.value, batch_size=16, seq_len=64)
    assert memory.worker_estimate(fits) < node
    with pytest.raises(InvalidField) as err:
        _parse(node, model=Model.GPT_TINY.value, batch_size=4096, seq_len=1024)
    assert err.value.field == "batch_size" and "MiB" in str(err.value)
    assert "activations 14.0 GiB" in str(err.value) and "would fit in 2.0 GiB" in str(err.value), str(err.value)
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
