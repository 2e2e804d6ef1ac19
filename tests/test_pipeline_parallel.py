"""Pipeline parallelism on CPU gloo processes: a 2-stage job trains like the unpipelined one, and its rules.

Real jobs through the trainer (:func:`cantata.trainer.loop.train`): specs
checked as at submit, the built-in corpus, sealed DCP checkpoints in a
``file://`` store; only the control plane's report sink is stood in for. Two
gloo processes run a ``pp`` 2 job with 1F1B, then one with interleaved 1F1B
(four stages), then try to resume the first job's checkpoint with the second's
layout; the test process runs the same job unpipelined. Four processes run
a pipeline of FSDP2-sharded stages (pp 2 x dp_shard 2) against the dp_shard 2 job.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from cantata.proto import jobrules
from cantata.proto.v1 import common_pb2
from cantata.security.keys import JobKeys, LocalKeyring, MasterKey
from cantata.server.jobs.jobspec import InvalidField, resumed_spec
from cantata.trainer import loop
from cantata.trainer.config import WorkerConfig
from cantata.trainer.pipeline import PipelineLayoutError, stage_units
from cantata.trainer.process_exit import exit_without_finalizing

pytestmark = pytest.mark.integration  # two gloo processes, three jobs each

STEPS = 5


class Reports:
    """The control plane's report sink, stood in for: the losses the lead reports, by step."""

    stop_requested = False

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self.val_loss: float | None = None

    def progress(self, step: int, loss: float, *args, **figures) -> None:
        self.losses[step] = loss

    def eval(self, step: int, val_loss: float) -> None:
        self.val_loss = val_loss

    def checkpoint(self, *args, **figures) -> None:
        pass

    def message(self, text: str) -> None:
        pass


def _spec(**fields) -> common_pb2.JobSpec:
    base = {"name": "pp", "model": "llama-tiny", "steps": STEPS, "batch_size": 4, "seq_len": 32, "lr": 1e-2}
    # a constant learning rate: the first STEPS steps of a longer job are those of a job of STEPS
    constant = {"lr_schedule": "constant", "warmup_steps": 0, "grad_clip": 1.0}
    return jobrules.checked(common_pb2.JobSpec(**{**base, **constant, **fields}))


def _config(spec: common_pb2.JobSpec, rank: int, port: int, job: str, scratch: Path, keys: str) -> WorkerConfig:
    spec.checkpoint_store = (scratch / "store").as_uri()
    return WorkerConfig(
        job_id=job,
        tenant="tenant",
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
        checkpoint_keys=JobKeys.from_json(keys),
        dataset_access=None,  # type: ignore[arg-type]  # the built-in corpus needs none
    )


def _job(spec: common_pb2.JobSpec, rank: int, port: int, job: str, scratch: Path, keys: str) -> dict:
    reports = Reports()
    cfg = _config(spec, rank, port, job, scratch, keys)
    val_loss = loop.train(cfg, reports, threading.Event())  # type: ignore[arg-type]  # the stand-in sink
    return {"losses": [reports.losses.get(s) for s in range(1, spec.steps + 1)], "val_loss": val_loss}  # the lead's


def _ranks(rank: int, ports: list[int], scratch: str, keys: str) -> None:
    out = Path(scratch)
    result: dict[str, Any] = {
        "1f1b": _job(_spec(workers=2, pp=2), rank, ports[0], "one", out, keys),
        "interleaved": _job(_spec(workers=2, pp=2, pp_schedule="interleaved-1f1b"), rank, ports[1], "two", out, keys),
        "flat": _job(_spec(workers=2, dp_shard=2), rank, ports[3], "flat", out, keys),  # FSDP2 alone
        "tp": _job(_spec(workers=2, tp=2), rank, ports[5], "tp", out, keys),  # tensor parallelism alone
    }
    try:  # job "one"'s checkpoint (2 stages) resumed by a pipeline of 4 stages
        _job(_spec(workers=2, pp=2, pp_schedule="interleaved-1f1b", steps=STEPS + 1), rank, ports[2], "one", out, keys)
        result["refused"] = ""
    except PipelineLayoutError as error:
        result["refused"] = str(error)
    result["resumed"] = _job(_spec(workers=2, pp=2, steps=STEPS + 1), rank, ports[4], "one", out, keys)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def _four_ranks(rank: int, ports: list[int], scratch: str, keys: str) -> None:
    out = Path(scratch)
    result = {
        "dp_shard": _job(_spec(workers=4, pp=2, dp_shard=2), rank, ports[0], "pp-dp", out, keys),
        "tp": _job(_spec(workers=4, pp=2, tp=2, pp_schedule="interleaved-1f1b"), rank, ports[1], "pp-tp", out, keys),
    }
    (out / f"four{rank}.json").write_text(json.dumps(result))
    exit_without_finalizing()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> tuple[Path, str]:
    """A directory for the jobs' stores and results, and the jobs' checkpoint keys."""
    path = tmp_path_factory.mktemp("pp")
    ring = LocalKeyring(path / "keyring", MasterKey(bytes(range(32))))
    ring.ensure_tenant("tenant")
    return path, ring.job_keys("tenant", "job").to_json()


@pytest.fixture(scope="module")
def two_ranks(scratch) -> list[dict]:
    """What each of the two processes' jobs gave (see ``_ranks``)."""
    path, keys = scratch
    ports = [_free_port() for _ in range(6)]
    mp.start_processes(_ranks, args=(ports, str(path), keys), nprocs=2, start_method="spawn")
    return [json.loads((path / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_pipelined_jobs_train_like_the_unpipelined_one_and_refuse_another_layout(scratch, two_ranks):
    path, keys = scratch
    reference = _job(_spec(workers=1, steps=STEPS + 1), 0, _free_port(), "reference", path, keys)
    for rank, result in enumerate(two_ranks):
        if rank == 0:  # the lead reports the loss the last stage broadcast
            for schedule in ("1f1b", "interleaved"):
                assert result[schedule]["losses"] == pytest.approx(reference["losses"][:STEPS], abs=1e-5), schedule
            assert result["resumed"]["losses"][:STEPS] == [None] * STEPS  # resumed at STEPS from the checkpoint
            assert result["resumed"]["losses"][STEPS] == pytest.approx(reference["losses"][STEPS], abs=1e-5)
        assert result["interleaved"]["val_loss"] == pytest.approx(result["1f1b"]["val_loss"], abs=1e-5)
        assert result["resumed"]["val_loss"] == pytest.approx(reference["val_loss"], abs=1e-5)
        assert "pp 2 with 2 stages" in result["refused"] and "pp 2 with 4 stages" in result["refused"]
    assert reference["losses"][-1] < reference["losses"][0]


def test_stages_share_out_the_embedding_layers_and_head():
    assert stage_units(2, 2) == [range(0, 2), range(2, 4)]
    assert stage_units(2, 4) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    assert stage_units(32, 4) == [range(0, 9), range(9, 18), range(18, 26), range(26, 34)]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"model": "qwen3-tiny"}, "pp", "ties its output head"),
        ({"model": "gpt-tiny"}, "pp", "use a decoder"),
        ({"dp_replicate": 2, "workers": 4}, "pp", "composes with dp_shard and tp, not yet with dp_replicate"),
        ({"tp": 4, "workers": 8}, "tp", "must divide llama-tiny's 2 key/value heads"),
        ({"dp_shard": 2, "workers": 2}, "workers", "x pp = 4 ranks, so the job needs workers = 4"),
        ({"workers": 3}, "workers", "needs workers = 2"),
        ({"pp": 3, "workers": 3, "pp_schedule": "interleaved-1f1b"}, "pp", "6 stages, more than llama-tiny's 2"),
        ({"pp_microbatches": 3}, "pp_microbatches", "must divide batch_size (4)"),
        ({"pp": 4, "workers": 4, "pp_microbatches": 2}, "pp_microbatches", "at least pp (4)"),
        ({"pp_schedule": "interleaved-1f1b", "pp_microbatches": 1}, "pp_microbatches", "a multiple of pp"),
        ({"grad_accum": 2}, "grad_accum", "take grad_accum's place"),
        ({"optimizer": "muon"}, "optimizer", "muon on a pipeline"),
        ({"compile": True}, "compile", "not supported yet"),
        ({"pp": 1, "workers": 1, "pp_microbatches": 2}, "pp_microbatches", "only with pp > 1"),
        ({"pp_schedule": "gpipe"}, "pp_schedule", "gpipe"),
    ],
)
def test_a_bad_pipeline_is_refused_at_submit(fields, field, message):
    with pytest.raises(jobrules.InvalidField, match=re.escape(message)) as refused:
        _spec(**{"pp": 2, "workers": 2, **fields})
    assert refused.value.field == field


def test_a_pipeline_job_resumes_on_its_own_pp_degree_only():
    spec = _spec(pp=2, workers=2)
    with pytest.raises(InvalidField, match="pp"):
        resumed_spec(spec, {"pp": 4, "workers": 4})
    assert resumed_spec(spec, {"steps": STEPS + 5}).pp == 2


def test_pipelines_of_fsdp2_and_tensor_parallel_stages_train_like_those_jobs(scratch, two_ranks):
    """pp 2 x dp_shard 2 against dp_shard 2, interleaved pp 2 x tp 2 against tp 2: four processes each."""
    path, keys = scratch
    mp.start_processes(
        _four_ranks, args=([_free_port(), _free_port()], str(path), keys), nprocs=4, start_method="spawn"
    )
    piped = json.loads((path / "four0.json").read_text())
    for dim, alone in (("dp_shard", two_ranks[0]["flat"]), ("tp", two_ranks[0]["tp"])):
        assert piped[dim]["losses"] == pytest.approx(alone["losses"], abs=1e-5), dim
        assert piped[dim]["val_loss"] == pytest.approx(alone["val_loss"], abs=1e-5), dim
        assert alone["losses"][-1] < alone["losses"][0]
