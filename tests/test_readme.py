"""The README's quick start runs as written, and the job.yaml it shows is the example that runs."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.platform import free_port, passable

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
QUICK_START_PORT = "7443"


def _block(marker: str, language: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```\n<!-- /{marker} -->", README, re.DOTALL)
    assert match is not None, f"README.md has no {marker} block"
    return match.group(1)


def test_the_job_yaml_the_readme_shows_is_the_single_example():
    assert _block("job.yaml", "yaml") == (ROOT / "examples" / "single.yaml").read_text()


@pytest.mark.integration
def test_the_quick_start_runs_verbatim(tmp_path):
    """In a fresh home (no profiles), from the checkout; only the port is a free one instead of 7443."""
    script = _block("quickstart", "sh").replace(QUICK_START_PORT, str(free_port()))
    passable(tmp_path)  # the home holds the server's data directory, which the workers' own uids must pass
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANTATA_")}
    env["HOME"] = str(tmp_path)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the server it starts is in its process group
    )
    try:
        out, err = process.communicate()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # a server the script left behind when it failed
    assert process.returncode == 0, f"{out}\n{err}\n{(tmp_path / 'cantata-quickstart' / 'server.log').read_text()}"
    assert "approved acme" in out and "default profile: acme" in out
    assert re.search(r"job-\S+  tiny-single\s+SUCCEEDED\s+step 60/60", out), out
    assert "eval at step 20: validation loss" in out and re.search(r"step\s+60\s", out)  # logs, then checkpoints
