"""The ``cantata`` CLI as a user runs it: real subprocesses against a real server."""

from __future__ import annotations

import json
import shutil

from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from testkit.platform import cli, complete, free_port


def test_enroll_approve_submit_watch_and_list_through_the_cli(platform):
    env = platform.env
    request = cli(
        "tenant",
        "request",
        "cli-co",
        "--server",
        platform.address,
        "--ca-file",
        str(platform.data_dir / "ca.pem"),
        "--enroll-server",
        platform.enroll_address,
        "--json",
        env=env,
    )
    fingerprint = json.loads(request.stdout)["fingerprint"]
    listed = cli("admin", "tenants", "list", "--status", "pending", env=env).stdout
    assert "cli-co" in listed and fingerprint in listed

    wrong = cli("admin", "tenants", "approve", "cli-co", "--fingerprint", "sha256:" + "f" * 64, env=env, check=False)
    assert wrong.returncode != 0
    assert wrong.stderr.count("\n") == 1 and "fingerprint mismatch" in wrong.stderr

    assert (
        "approved cli-co" in cli("admin", "tenants", "approve", "cli-co", "--fingerprint", fingerprint, env=env).stdout
    )
    assert "certificate installed" in cli("tenant", "status", "cli-co", env=env).stdout

    submitted = cli(
        "jobs",
        "submit",
        "--profile",
        "cli-co",
        "--name",
        "cli-job",
        "--steps",
        "40",
        "--eval-every",
        "20",
        "--checkpoint-every",
        "20",
        "--batch-size",
        "8",
        "--seq-len",
        "32",
        "--watch",
        env=env,
    )
    assert "SUCCEEDED" in submitted.stdout
    assert "step" in submitted.stderr  # progress goes to stderr: plain lines, as it is not a terminal
    assert "\r" not in submitted.stderr and submitted.stderr.rstrip().endswith(": SUCCEEDED")
    jobs = json.loads(cli("jobs", "list", "--profile", "cli-co", "--json", env=env).stdout)
    assert [j["name"] for j in jobs] == ["cli-job"] and jobs[0]["state"] == "SUCCEEDED"
    ckpts = json.loads(cli("checkpoints", "list", jobs[0]["id"], "--profile", "cli-co", "--json", env=env).stdout)
    assert [c["step"] for c in ckpts] == [20, 40]
    logs = cli("jobs", "logs", jobs[0]["id"], "--profile", "cli-co", env=env).stdout.splitlines()
    assert any(line.startswith("[0] ") and "worker 0: finished" in line for line in logs), logs
    for expected in ("step 40/40 loss", "eval at step 20: validation loss", "checkpoint at step 40 sealed"):
        assert any(line.startswith("[0] ") and expected in line for line in logs), (expected, logs)


def test_cli_errors_are_one_line_and_non_zero(platform):
    result = cli("jobs", "status", "job-doesnotexist", "--profile", "admin", env=platform.env, check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cantata: error:")


def test_invalid_job_file_is_refused_before_sending(platform, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: x\nsteps: 10\nflavour: spicy\n")
    result = cli("jobs", "submit", str(job_file), "--profile", "admin", env=platform.env, check=False)
    assert result.returncode != 0 and "unknown field(s): flavour" in result.stderr


def test_help_on_every_level():
    for args in ([], ["jobs"], ["admin", "tenants"], ["server"], ["tenant"], ["checkpoints"], ["audit"]):
        result = cli(*args, "--help")
        assert result.stdout.startswith("usage: cantata")


def test_an_admin_command_under_a_tenant_profile_says_to_use_the_admin_one(platform):
    with platform.enroll("hint-co"):
        pass
    result = cli("admin", "tenants", "list", "--profile", "hint-co", env=platform.env, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("cantata: error: PermissionDenied")
    assert "needs an admin's profile, not 'hint-co': run it with --profile admin" in lines[0]
    tenant_command = cli("jobs", "status", "job-nope", "--profile", "hint-co", env=platform.env, check=False)
    assert "--profile admin" not in tenant_command.stderr  # a tenant's own command: no such advice


def test_a_server_that_does_not_answer_is_named_with_the_profile_that_tried_it(platform):
    gone = Profile.named("gone")
    admin = Profile.named("admin")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    gone.create(address, address, admin.ca.read_bytes())
    shutil.copy(admin.cert, gone.cert)
    shutil.copy(admin.key, gone.key)
    result = cli("jobs", "list", "--profile", "gone", env=platform.env, check=False)  # refused: fails at once
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("cantata: error: Unavailable")
    assert f"could not reach the Cantata server at {address} (profile gone): " in lines[0]
    assert lines[0].endswith("Is the server running, and is that its address?")


def test_submit_dry_run_is_checked_by_the_server_and_submits_nothing(platform, tmp_path):
    with platform.enroll("dry-co") as client:
        job_file = tmp_path / "job.yaml"
        job_file.write_text("name: dry\nsteps: 30\nbatch_size: 4\n")
        env = {**platform.env, "CANTATA_PROFILE": "dry-co"}
        shown = json.loads(cli("jobs", "submit", str(job_file), "--dry-run", "--json", env=env).stdout)
        assert shown["name"] == "dry" and shown["steps"] == 30 and shown["batch_size"] == 4
        assert shown["checkpoint_store"].startswith("file://")  # the server's default, filled in by the server
        text = cli("jobs", "submit", str(job_file), "--dry-run", env=env).stdout
        assert text.startswith("# would run (nothing submitted)") and 'algorithm: "single"' in text

        unknown_source = cli(
            "jobs", "submit", str(job_file), "--dataset", "s3://nobody@bucket/shards", "--dry-run", env=env, check=False
        )
        assert unknown_source.returncode == 1 and "data source 'nobody' not found" in unknown_source.stderr
        cli("admin", "tenants", "set-quota", "dry-co", "--max-steps", "20", env=platform.env)
        over = cli("jobs", "submit", str(job_file), "--dry-run", env=env, check=False)
        assert over.returncode == 1 and "QuotaExceeded" in over.stderr and "steps per job" in over.stderr
        assert client.list() == []  # nothing was submitted


GRPC_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "E0000 00:00:1733512345.123456   40213 ssl_transport_security.cc:1659] Handshake failed with error SSL_ERROR_SSL",
    "I1206 19:20:01.000123456   40213 ev_epoll1_linux.cc:359] grpc epoll fd: 7",
)


def test_grpc_internal_log_lines_stay_out_of_a_tenants_job_logs(platform):
    with platform.enroll("logs-co") as client:
        handle = client.submit(Job(name="logged", steps=10, batch_size=2, seq_len=16, eval_every=10))
        assert handle.wait().state == "SUCCEEDED"
    log = platform.data_dir / "jobs" / handle.id / "worker-0.log"
    with log.open("a") as f:  # as gRPC's C core writes them to the worker's stderr
        f.write("\n".join(GRPC_LINES) + "\nworker 0: a line of its own after them\n")
    env = {**platform.env, "CANTATA_PROFILE": "logs-co"}
    shown = cli("jobs", "logs", handle.id, env=env).stdout
    assert "step 10/10 loss" in shown and "a line of its own after them" in shown
    assert not any(line in shown for line in GRPC_LINES)
    assert all(line in log.read_text() for line in GRPC_LINES)  # the operator's file keeps them


def test_shell_completion_offers_the_profiles_job_ids_from_the_server(platform, tmp_path):
    with platform.enroll("complete-co") as client:
        ids = sorted(client.submit(Job(name=f"c{i}", steps=4, batch_size=2, seq_len=16)).id for i in range(2))
    env = {**platform.env, "CANTATA_PROFILE": "complete-co"}
    out = tmp_path / "completions"
    assert sorted(complete("cantata jobs status job-", out, env)) == ids
    prefix = ids[0][:-1]
    assert complete(f"cantata jobs logs {prefix}", out, env) == [i for i in ids if i.startswith(prefix)]
    assert complete("cantata jobs status job-", out, {**env, "CANTATA_PROFILE": "admin"}) == []  # none of its own
