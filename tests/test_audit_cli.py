"""`cantata audit verify|report` and `cantata admin audit rotate-key`, through a parser built like the CLI's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cantata.security.audit import Action, AuditLog, init_audit
from cantata.server.audit_cli import register, register_admin

ADMIN = "spiffe://cantata/admin/root"


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="cantata")
    commands = parser.add_subparsers(dest="command", required=True)
    register(commands)
    admin = commands.add_parser("admin").add_subparsers(dest="admin_command", required=True)
    register_admin(admin)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def data_dir(tmp_path) -> Path:
    init_audit(tmp_path / "audit")
    with AuditLog.open(tmp_path / "audit") as log:
        log.append(ADMIN, Action.SERVER_STARTED)
        log.append(ADMIN, Action.TENANT_APPROVED, resource="acme", tenant="acme")
        log.append("anonymous", Action.AUTH_FAILED, outcome="denied", peer="ipv4:198.51.100.4:1")
    return tmp_path


def test_verify_intact_log_exits_zero_with_summary(data_dir, capsys):
    assert cli("audit", "verify", "--data-dir", str(data_dir)) == 0
    out = capsys.readouterr().out
    assert "3/3 records valid" in out and "Verdict: INTACT" in out


def test_verify_by_log_path_with_external_public_key(data_dir, capsys):
    root = json.loads((data_dir / "audit" / "log.json").read_bytes())["root_key"]
    assert (
        cli(
            "audit",
            "verify",
            "--log",
            str(data_dir / "audit"),
            "--pubkey",
            str(data_dir / "audit" / "keys" / f"{root}.pub"),
        )
        == 0
    )


def test_verify_broken_log_names_the_break_in_one_line(data_dir, capsys):
    segment = data_dir / "audit" / "segments" / "segment-00000001.jsonl"
    segment.write_bytes(segment.read_bytes().replace(b"acme", b"acne", 1))
    assert cli("audit", "verify", "--data-dir", str(data_dir)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("cantata audit verify: audit log broken at seq 2: modified")


@pytest.mark.parametrize(
    "problem, expected",
    [
        ("no_log", "no audit log at"),
        ("missing_pubkey", "public key file not found"),
        ("bad_pubkey", "no PEM public key found"),
    ],
)
def test_verify_cannot_start_exits_two_with_a_clear_reason(data_dir, tmp_path, capsys, problem, expected):
    args = ["audit", "verify", "--data-dir", str(data_dir)]
    if problem == "no_log":
        args[-1] = str(tmp_path / "elsewhere")
    elif problem == "missing_pubkey":
        args += ["--pubkey", str(tmp_path / "absent.pem")]
    else:
        (tmp_path / "bad.pem").write_text("not a key")
        args += ["--pubkey", str(tmp_path / "bad.pem")]
    assert cli(*args) == 2
    assert expected in capsys.readouterr().err


def test_report_for_a_tenant_to_a_file(data_dir, tmp_path, capsys):
    out = tmp_path / "acme.html"
    assert (
        cli(
            "audit",
            "report",
            "--data-dir",
            str(data_dir),
            "--tenant",
            "acme",
            "--since",
            "2000-01-01",
            "--format",
            "html",
            "--out",
            str(out),
        )
        == 0
    )
    page = out.read_text()
    assert "INTACT" in page and "tenant_approved" in page and "198.51.100.4" not in page


def test_report_period_in_the_future_is_empty(data_dir, capsys):
    assert cli("audit", "report", "--data-dir", str(data_dir), "--since", "2999-01-01T00:00Z", "--format", "json") == 0
    assert json.loads(capsys.readouterr().out)["records"] == 0


def test_report_rejects_a_malformed_time(data_dir, capsys):
    with pytest.raises(SystemExit):
        cli("audit", "report", "--data-dir", str(data_dir), "--since", "yesterday")
    assert "not an ISO 8601 date or time" in capsys.readouterr().err


def test_rotate_key_then_verify(data_dir, capsys):
    before = (data_dir / "audit" / "keys" / "active").read_text().strip()
    assert cli("admin", "audit", "rotate-key", "--data-dir", str(data_dir)) == 0
    after = (data_dir / "audit" / "keys" / "active").read_text().strip()
    assert after != before and after in capsys.readouterr().out
    assert cli("audit", "verify", "--data-dir", str(data_dir)) == 0


def test_rotate_key_while_the_server_holds_the_log_is_refused(data_dir, capsys):
    with AuditLog.open(data_dir / "audit"):
        assert cli("admin", "audit", "rotate-key", "--data-dir", str(data_dir)) == 2
    assert "open in another process" in capsys.readouterr().err


def test_exit_status_through_a_real_process(data_dir):
    harness = (
        "import argparse, sys\n"
        "from cantata.server.audit_cli import register\n"
        "p = argparse.ArgumentParser(prog='cantata'); register(p.add_subparsers(required=True))\n"
        "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))\n"
    )
    intact = subprocess.run(
        [sys.executable, "-c", harness, "audit", "verify", "--data-dir", str(data_dir)], capture_output=True, text=True
    )
    assert intact.returncode == 0, intact.stderr
    (data_dir / "audit" / "checkpoints.jsonl").write_bytes(b"")
    broken = subprocess.run(
        [sys.executable, "-c", harness, "audit", "verify", "--data-dir", str(data_dir)], capture_output=True, text=True
    )
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1


def test_external_anchor_exposes_a_log_cut_with_its_checkpoints(tmp_path, capsys):
    """Cutting records and the checkpoints covering them fools a local verify, not one held against the anchor."""
    audit = tmp_path / "audit"
    init_audit(audit)
    with AuditLog.open(audit, checkpoint_every_records=10) as log:
        for i in range(50):
            log.append(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}")
    store = f"file://{tmp_path / 'anchor'}"
    assert cli("admin", "audit", "export-anchor", "--data-dir", str(tmp_path), "--store", store) == 0
    assert capsys.readouterr().out.startswith("8 new checkpoint(s) copied")
    assert cli("admin", "audit", "export-anchor", "--data-dir", str(tmp_path), "--store", store) == 0
    assert capsys.readouterr().out.startswith("0 new checkpoint(s) copied")

    segment = audit / "segments" / "segment-00000001.jsonl"
    segment.write_bytes(b"".join(segment.read_bytes().splitlines(keepends=True)[:25]))
    checkpoint_file = audit / "checkpoints.jsonl"
    kept = [line for line in checkpoint_file.read_bytes().splitlines(keepends=True) if json.loads(line)["seq"] <= 20]
    checkpoint_file.write_bytes(b"".join(kept))

    assert cli("audit", "verify", "--data-dir", str(tmp_path)) == 0
    capsys.readouterr()
    assert cli("audit", "verify", "--data-dir", str(tmp_path), "--anchor", store) == 1
    assert "audit log broken at seq 26: truncated" in capsys.readouterr().err
