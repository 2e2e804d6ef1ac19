"""Jobs through the real CLI against a real server whose workers log JSON lines.

Training settings run in the worker (its log shows the learning rate, the
clipped norm, evaluations and checkpoints), ``jobs logs`` of a finished job and
``jobs logs -f`` of a running one, ``--json`` output with state names and
nulls, a reader that stops early, a dataset too small for its validation, and
an example job file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cantata.logformat import LOG_FORMAT_ENV
from cantata.proto.vocabulary import LrSchedule
from cantata.trainer.loop import Schedule
from testkit.platform import Platform, cli, readable

ROOT = Path(__file__).resolve().parents[1]
TENANT = "logs-co"


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"), env={LOG_FORMAT_ENV: "json"})
    p.start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def env(platform) -> dict[str, str]:
    """The environment of a tenant's shell: its profile is the default."""
    platform.enroll(TENANT).close()
    return {**platform.env, "CANTATA_PROFILE": TENANT}


def _submit(env, *args: str) -> str:
    return json.loads(cli("jobs", "submit", *args, "--json", env=env).stdout)["id"]


def _events(env, job_id: str) -> list[dict]:
    """Every event of the job, to its end (``jobs watch --json``: one object per line)."""
    out = cli("jobs", "watch", job_id, "--json", env=env, check=False).stdout
    return [json.loads(line) for line in out.splitlines()]


def _records(env, job_id: str) -> list[dict]:
    rows = [json.loads(line) for line in cli("jobs", "logs", job_id, "--json", env=env).stdout.splitlines()]
    return [row["record"] | {"worker": row["worker"]} for row in rows if row["record"] is not None]


def test_training_settings_run_in_the_worker_and_its_log_shows_them(env, tmp_path):
    settings = dict(warmup_steps=5, lr_schedule="linear", min_lr_ratio=0.2, lr=0.004, grad_clip=0.5, grad_accum=2)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        yaml.safe_dump(
            dict(name="settings", steps=40, batch_size=4, seq_len=32, eval_every=10, eval_batches=2)
            | dict(checkpoint_every=10, keep_last=2, weight_decay=0.05, trace_samples=True)
            | settings
        )
    )
    job_id = _submit(env, str(job_file))
    events = _events(env, job_id)
    assert events[-1]["state"] == "SUCCEEDED" and events[-1]["terminal"]
    for event in events:  # absent values are null, never JOB_STATE_UNSPECIFIED or 0.0
        assert (event["state"] is None) == (event["kind"] != "STATE"), event
        assert (event["loss"] is None) == (event["kind"] != "PROGRESS"), event
        assert (event["val_loss"] is None) == (event["kind"] != "EVAL"), event

    steps = [c["step"] for c in json.loads(cli("checkpoints", "list", job_id, "--json", env=env).stdout)]
    assert steps == [30, 40]  # keep_last=2: the checkpoints of steps 10 and 20 were deleted from the store

    records = _records(env, job_id)
    schedule = Schedule(0.004, 40, 5, LrSchedule.LINEAR, 0.2)
    stepped = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in stepped] == list(range(1, 41))
    for r in stepped:
        assert r["lr"] == pytest.approx(schedule.lr(r["step"])), r
        assert r["grad_norm"] > 0 and r["job"] == job_id and r["level"] == "INFO"
    assert stepped[-1]["lr"] == pytest.approx(0.004 * 0.2)
    assert [r["step"] for r in records if r["event"] == "eval"] == [10, 20, 30, 40]
    assert [(r["step"], r["keep_last"]) for r in records if r["event"] == "checkpoint"] == [
        (s, 2) for s in (10, 20, 30, 40)
    ]
    assert records[0]["event"] == "started" and records[-1]["event"] == "finished"
    plain = cli("jobs", "logs", job_id, env=env).stdout.splitlines()
    assert sum(line.startswith("[0] samples step=1 ") for line in plain) == 2  # two micro-batches per step


def test_logs_follow_a_running_job_and_watch_json_stops_quietly_when_its_reader_does(env):
    job_id = _submit(
        env, "--name", "long", "--steps", "5000", "--batch-size", "2", "--seq-len", "16", "--eval-every", "5000"
    )
    command = [sys.executable, "-m", "cantata.sdk.cli"]
    follow = subprocess.Popen(
        [*command, "jobs", "logs", job_id, "--follow", "--json"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert follow.stdout is not None
        for line in follow.stdout:  # the test's timeout bounds the wait
            record = json.loads(line)["record"]
            if record and record["event"] == "step":
                break
        status = json.loads(cli("jobs", "status", job_id, "--json", env=env).stdout)
        assert status["state"] == "RUNNING" and status["val_loss"] is None  # ... while it runs

        watch = subprocess.Popen(
            [*command, "jobs", "watch", job_id, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert watch.stdout is not None and watch.stderr is not None
        assert json.loads(watch.stdout.readline())["kind"] == "STATE"
        watch.stdout.close()  # like `| head -1`
        assert watch.wait() == 141 and watch.stderr.read() == ""  # no BrokenPipe traceback

        cli("jobs", "cancel", job_id, env=env)
        rest = [json.loads(line) for line in follow.stdout]
        assert follow.wait() == 0  # the stream ends with the job
        assert rest[-1]["record"]["event"] == "stopped", rest[-3:]
    finally:
        follow.kill()


def test_a_dataset_too_small_for_the_validation_split_fails_at_start(platform, env, tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    (text / "small.txt").write_text("def f(x):\n    return x + 1\n" * 700)  # 19,600 bytes
    shards = platform.tenant_dir(TENANT, "datasets") / "small"
    cli("data", "prepare", str(text), "--out", str(shards), env=env)
    readable(shards)
    submitted = cli(
        "jobs",
        "submit",
        "--name",
        "too-small",
        "--dataset",
        shards.as_uri(),
        "--steps",
        "60",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--eval-batches",
        "50",
        "--watch",
        "--json",
        env=env,
        check=False,
    )
    assert submitted.returncode == 1
    status = json.loads(submitted.stdout)
    assert status["state"] == "FAILED" and status["step"] == 0
    assert (status["loss"], status["val_loss"]) == (None, None)
    reason = status["reason"]
    assert "too small for the job's validation" in reason and "eval_batches=50 x batch_size=4 needs 200" in reason
    assert "not restarted: the error is permanent" in reason
    assert not [e for e in _events(env, status["id"]) if e["kind"] == "PROGRESS"]


def test_an_example_job_file_runs(env):
    submitted = cli(
        "jobs",
        "submit",
        str(ROOT / "examples" / "single.yaml"),
        "--steps",
        "20",
        "--warmup-steps",
        "2",
        "--eval-every",
        "10",
        "--checkpoint-every",
        "10",
        "--watch",
        env=env,
    )
    assert "tiny-single" in submitted.stdout and "SUCCEEDED" in submitted.stdout
