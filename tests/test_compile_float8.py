"""The ``compile`` and ``float8`` job fields, and AdamW's multi-tensor step, on the CPU.

A compiled job (each decoder layer through inductor) trains like the eager one
on a 2-rank FSDP2 mesh of real gloo processes, each building the job's
``Trainer`` as a worker does; float8 is refused for a job that would train on
the CPU, at submit and at the worker; both fields travel through the SDK's
``Job`` and the CLI's YAML and flags.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.sdk.cli import _job_from_args, build_parser
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec
from cantata.trainer import loop
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data import Utf8Policy, open_feed
from cantata.trainer.float8 import Float8Unsupported, check_float8_device
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.process_exit import exit_without_finalizing
from cantata.trainer.worker import permanent

STEPS = 5
MODEL = "llama-tiny"


def _spec(**fields) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(name="speed", model=MODEL, steps=STEPS, batch_size=2, seq_len=32, **fields)
    jobfields.fill_defaults(spec)
    return spec


def _config(spec: common_pb2.JobSpec, rank: int, port: int, scratch: Path) -> WorkerConfig:
    spec.checkpoint_store = scratch.as_uri()  # opened by the Trainer, never written here
    return WorkerConfig(
        job_id="speed",
        tenant="t",
        worker=rank,
        workers=spec.workers,
        attempt=0,
        server="",
        ca=scratch,
        cert=scratch,
        key=scratch,
        rendezvous=f"tcp://127.0.0.1:{port}",
        threads=1,
        spec=spec,
        checkpoint_keys=None,  # type: ignore[arg-type]  # nothing is saved here
        dataset_access=None,  # type: ignore[arg-type]  # the built-in corpus needs none
    )


def _losses(trainer: loop.Trainer, rank: int, world: int) -> list[float]:
    """``STEPS`` of the trainer's own step on this rank's batches of the built-in corpus."""
    spec = trainer.spec
    feed = open_feed(
        spec.dataset,
        batch_size=spec.batch_size,
        seq_len=trainer.seq_len,
        seed=spec.seed,
        rank=rank,
        world=world,
        access=None,  # type: ignore[arg-type]
        utf8_policy=Utf8Policy.SKIP,
        on_event=lambda event: None,
    )
    schedule = loop.Schedule.of(spec)
    return [
        loop.train_step(trainer.model, trainer.optimizer, feed, step, schedule.lr(step), accumulate=1, trace=False)
        for step in range(1, STEPS + 1)
    ]


def _rank(rank: int, world: int, port: int, scratch: str) -> None:
    losses = {}
    strategy = None
    for compiled in (False, True):
        spec = _spec(algorithm="allreduce", workers=world, dp_shard=world, compile=compiled)
        cfg = _config(spec, rank, port, Path(scratch))
        torch.set_num_threads(1)
        strategy = strategy or loop.AllReduce(cfg)
        trainer = loop.Trainer(cfg, None, threading.Event(), strategy)  # type: ignore[arg-type]  # no server
        losses[compiled] = _losses(trainer, rank, world)
        if compiled:
            assert all(layer._compiled_call_impl is not None for layer in trainer.model.layers)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    Path(scratch, f"rank{rank}.json").write_text(
        json.dumps({"losses": losses[False], "compiled": losses[True], "graphs": graphs})
    )
    assert strategy is not None
    strategy.close()
    exit_without_finalizing()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_compiled_mesh_job_trains_like_the_eager_one(tmp_path: Path, monkeypatch):
    """Inductor on each layer, FSDP2 over 2 gloo ranks: the same losses to 1e-4 over 5 steps."""
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no pool of compile processes on a 2-core machine
    mp.spawn(_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["graphs"] == 1  # one graph for every layer: regional compilation, no recompiles
        assert report["compiled"] == pytest.approx(report["losses"], abs=1e-4)
        assert report["losses"][-1] < report["losses"][0]


def test_adamw_steps_every_tensor_at_once_on_the_cpu_like_the_per_tensor_loop():
    torch.manual_seed(0)
    stacked, looped = build_model(MODEL, 3), build_model(MODEL, 3)
    optimizer = build_optimizer(stacked, "adamw", lr=1e-2, weight_decay=0.1)
    assert optimizer.adamw.defaults["foreach"] is True and not optimizer.adamw.defaults["fused"]
    groups = [
        {"params": [p for p in looped.parameters() if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in looped.parameters() if p.ndim < 2], "weight_decay": 0.0},
    ]
    reference = torch.optim.AdamW(groups, lr=1e-2, foreach=False)
    batches = torch.randint(0, 512, (STEPS, 4, 33))
    for batch in batches:
        for model, step in ((stacked, optimizer.step), (looped, reference.step)):
            model(batch[:, :-1], batch[:, 1:])[1].backward()
            step()
            model.zero_grad()
    for (name, a), b in zip(stacked.named_parameters(), looped.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
        assert not torch.equal(a, build_model(MODEL, 3).get_parameter(name)), name  # it did train


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(), "gpus_per_worker 0 trains on the CPU"),
        (dict(gpus_per_worker=1, algorithm="gasloc", workers=2), "gasloc workers train on the CPU"),
        (dict(gpus_per_worker=1, algorithm="allreduce", workers=2, dp_shard=2), "mesh job"),
    ],
)
def test_float8_is_refused_at_submit_for_a_job_that_would_train_on_the_cpu(fields, words):
    spec = common_pb2.JobSpec(name="f8", model=MODEL, steps=10, float8=True, **fields)
    with pytest.raises(InvalidField, match=words) as caught:
        parse_job_spec(spec, default_store="file:///tmp/ckpt", roots=[Path("/tmp")])
    assert caught.value.field == "float8"


def test_float8_on_one_gpu_passes_submit():
    spec = common_pb2.JobSpec(name="f8", model=MODEL, steps=10, float8=True, compile=True, gpus_per_worker=1)
    parsed = parse_job_spec(spec, default_store="file:///tmp/ckpt", roots=[Path("/tmp")])
    assert parsed.float8 and parsed.compile


def test_a_worker_without_float8_tensor_cores_fails_permanently_before_building_the_model(tmp_path: Path):
    with pytest.raises(Float8Unsupported, match="this worker trains on the cpu"):
        check_float8_device(torch.device("cpu"))
    cfg = _config(_spec(float8=True, gpus_per_worker=1), 0, _free_port(), tmp_path)  # no GPU here: the CPU
    strategy = loop.AllReduce(cfg)
    with pytest.raises(Float8Unsupported) as caught:
        loop.Trainer(cfg, None, threading.Event(), strategy)  # type: ignore[arg-type]
    assert permanent(caught.value)  # restarting the job would not help


def _submit_parser() -> argparse.ArgumentParser:
    parser, _ = build_parser()
    jobs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["jobs"]
    return next(a for a in jobs._actions if isinstance(a, argparse._SubParsersAction)).choices["submit"]


def test_compile_and_float8_travel_through_the_sdk_job_and_the_cli_yaml(tmp_path: Path):
    proto = Job(name="j", compile=True, float8=True, gpus_per_worker=1).to_proto()
    assert proto.compile and proto.float8
    assert not Job(name="j").to_proto().compile and not Job(name="j").to_proto().float8
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"name": "j", "compile": True, "float8": True, "gpus_per_worker": 1}))
    parser = _submit_parser()
    from_file = _job_from_args(parser.parse_args(["--profile", "p", str(job_file)]))
    assert (from_file.compile, from_file.float8) == (True, True)
    overridden = _job_from_args(parser.parse_args(["--profile", "p", str(job_file), "--no-compile"]))
    assert (overridden.compile, overridden.float8) == (False, True)
    flags = _job_from_args(parser.parse_args(["--profile", "p", "--name", "j", "--compile", "--float8"]))
    assert flags.to_proto().compile and flags.to_proto().float8
