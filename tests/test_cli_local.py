"""The CLI's own behaviour, without a server: what start-up loads, --version, profiles, completion, progress.

How long start-up takes is measured in benchmarks/bench_cli.py; here, what it loads.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cantata.sdk.client import Event
from cantata.sdk.profiles import Profile
from cantata.sdk.progress import ProgressLines, progress_display
from testkit.platform import cli, complete

HEAVY = ("grpc", "google.protobuf", "cryptography", "yaml", "tqdm", "numpy", "torch", "matplotlib", "boto3", "azure")
_LOADED = """
import contextlib, json, sys
from cantata.sdk.cli import main
with contextlib.redirect_stdout(None):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))
"""


def _loaded_by(*argv: str) -> list[str]:
    code = _LOADED.format(heavy=repr(HEAVY))
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_help_and_version_load_no_library():
    assert _loaded_by("--help") == []
    assert _loaded_by("--version") == []
    assert _loaded_by("jobs", "--help") == ["google.protobuf"]  # the submit flags come from the field table
    assert _loaded_by("jobs", "cancel", "--help") == []  # ... which only `jobs submit` builds


def test_commands_that_only_talk_to_the_server_load_neither_numpy_nor_torch_nor_yaml():
    for argv in (["jobs", "list", "--help"], ["data", "sources", "list", "--help"], ["server", "--help"]):
        loaded = _loaded_by(*argv)
        assert not {"numpy", "torch", "yaml", "tqdm", "matplotlib", "boto3", "azure"} & set(loaded), (argv, loaded)


def test_version_is_the_distributions():
    from importlib.metadata import version

    assert cli("--version").stdout.strip() == f"cantata {version('cantata')}"


def test_the_data_plugin_constants_agree_with_the_modules_they_spare_the_cli():
    from cantata.trainer.data import cli as data_cli
    from cantata.trainer.data.prepare import DEFAULT_SHARD_TOKENS
    from cantata.trainer.data.shards import DTYPES

    assert tuple(sorted(DTYPES)) == data_cli.TOKEN_DTYPES
    assert data_cli.DEFAULT_SHARD_TOKENS == DEFAULT_SHARD_TOKENS


@pytest.fixture
def home(tmp_path) -> dict[str, str]:
    """A CANTATA_HOME with profiles acme (approved) and beta (still pending), and the environment to use it."""
    env = {k: v for k, v in os.environ.items() if k != "CANTATA_PROFILE"}
    env["CANTATA_HOME"] = str(tmp_path)
    old = os.environ.get("CANTATA_HOME")
    os.environ["CANTATA_HOME"] = str(tmp_path)
    try:
        for name, server in (("acme", "127.0.0.1:7443"), ("beta", "10.0.0.2:7443")):
            profile = Profile.named(name)
            profile.create(server, "127.0.0.1:7444", b"ca")
        Profile.named("acme").cert.write_bytes(b"cert")
    finally:
        if old is None:
            del os.environ["CANTATA_HOME"]
        else:
            os.environ["CANTATA_HOME"] = old
    return env


def test_profile_list_and_use_set_the_default_that_cantata_profile_overrides(home):
    listed = json.loads(cli("profile", "list", "--json", env=home).stdout)
    assert [(p["name"], p["server"], p["certificate"], p["default"]) for p in listed] == [
        ("acme", "127.0.0.1:7443", True, False),
        ("beta", "10.0.0.2:7443", False, False),
    ]
    refused = cli("jobs", "list", env=home, check=False)  # no default yet: --profile is required
    assert refused.returncode == 2 and "--profile" in refused.stderr

    assert "default profile: acme" in cli("profile", "use", "acme", env=home).stdout
    assert "* acme" in cli("profile", "list", env=home).stdout
    submit_help = cli("jobs", "list", "--help", env=home).stdout
    assert "$CANTATA_PROFILE" in submit_help
    parser_default = subprocess.run(
        [sys.executable, "-c", "from cantata.sdk.cli import build_parser; "
         "print(build_parser('jobs')[0].parse_args(['jobs', 'list']).profile)"],
        capture_output=True, text=True, env=home, check=True,
    )  # fmt: skip
    assert parser_default.stdout.strip() == "acme"
    overridden = subprocess.run(
        [sys.executable, "-c", "from cantata.sdk.cli import build_parser; "
         "print(build_parser('jobs')[0].parse_args(['jobs', 'list']).profile)"],
        capture_output=True, text=True, env={**home, "CANTATA_PROFILE": "beta"}, check=True,
    )  # fmt: skip
    assert overridden.stdout.strip() == "beta"

    missing = cli("profile", "use", "nobody", env=home, check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("cantata: error: no profile 'nobody'")
    assert (Path(home["CANTATA_HOME"]) / "default-profile").read_text().strip() == "acme"  # unchanged


def test_shell_completion_completes_commands_and_flags(tmp_path):
    out = tmp_path / "completions"
    assert "jobs" in complete("cantata jo", out)
    assert "submit" in complete("cantata jobs su", out)
    assert "--grad-accum" in complete("cantata jobs submit --grad-", out)
    script = cli("completion", "bash").stdout
    assert "complete" in script and "cantata" in script


def _event(kind: str, step: int = 0, **values) -> Event:
    fields = dict(state=None, loss=None, val_loss=None, tokens_per_s=None)
    fields.update(values)
    return Event(1, "t", kind, terminal=False, step=step, total_steps=120, message="", worker=0, **fields)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    terminal, redirected = _Terminal(), io.StringIO()
    for out in (terminal, redirected):
        display = progress_display("job-1", out)
        display.update(_event("STATE", state="RUNNING"))
        for step in range(1, 121):
            display.update(_event("PROGRESS", step, loss=3.0 - step / 100, tokens_per_s=5000.0))
        display.update(_event("EVAL", 120, val_loss=1.5))
        display.update(_event("STATE", 120, state="SUCCEEDED"))
        display.close()
    assert "\r" in terminal.getvalue()
    lines = redirected.getvalue().splitlines()
    assert "\r" not in redirected.getvalue()
    assert lines[0] == "job-1: RUNNING" and lines[-1] == "job-1: SUCCEEDED"
    assert "job-1: step 120 val 1.5000" in lines
    assert "job-1: step 120/120 loss 1.8000 (5,000 tokens/s)" in lines  # the last progress, before the end
    assert len(lines) <= 5  # within one interval, the 120 progress events are one line or two


def test_plain_progress_lines_are_periodic():
    out = io.StringIO()
    display = ProgressLines("job-2", out, interval=0.0)  # every progress event is due
    for step in (1, 2, 3):
        display.update(_event("PROGRESS", step, loss=2.0, tokens_per_s=None))
    assert out.getvalue().splitlines() == [f"job-2: step {s}/120 loss 2.0000" for s in (1, 2, 3)]


def test_shell_completion_offers_the_profiles(tmp_path):
    env = {**os.environ, "CANTATA_HOME": str(tmp_path / "home")}
    for name in ("acme", "admin", "alpha"):
        Profile(name, tmp_path / "home" / "profiles" / name).create("h:1", "h:2", b"ca")
    (tmp_path / "home" / "profiles" / "half-made").mkdir()  # no profile.json: not a profile
    out = tmp_path / "completions"
    assert complete("cantata jobs list --profile a", out, env) == ["acme", "admin", "alpha"]
    assert complete("cantata profile use ad", out, env) == ["admin"]
