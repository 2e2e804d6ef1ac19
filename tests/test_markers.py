"""tests/conftest.py marks what starts servers, workers, moto or Azurite as ``integration``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import INTEGRATION_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import json, sys
import pytest

class Probe:
    def pytest_collection_finish(self, session):
        marks = {}
        for item in session.items:
            timeout = item.get_closest_marker("timeout")
            marks[item.nodeid] = [bool(item.get_closest_marker("integration")), timeout and timeout.args[0]]
        print("MARKS " + json.dumps(marks))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Probe()]))
"""


def _marks(*paths: str) -> dict[str, list]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *paths], capture_output=True, text=True, cwd=ROOT, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("MARKS ")]
    return json.loads(line.removeprefix("MARKS "))


def test_server_and_remote_store_tests_are_integration_with_a_higher_ceiling():
    marks = _marks("tests/test_server_faults.py", "tests/test_storage.py", "tests/test_canzona_plan.py")
    integration = [True, INTEGRATION_TIMEOUT_S]
    unit = [False, None]
    faults = [m for nodeid, m in marks.items() if nodeid.startswith("tests/test_server_faults.py")]
    plans = [m for nodeid, m in marks.items() if nodeid.startswith("tests/test_canzona_plan.py")]
    assert faults and all(m == integration for m in faults)
    assert plans and all(m == unit for m in plans)
    stream = "tests/test_storage.py::test_put_and_get_stream"
    assert marks[f"{stream}[s3]"] == marks[f"{stream}[azure]"] == integration
    assert marks[f"{stream}[local]"] == marks["tests/test_storage.py::test_open_store_parses_uris"] == unit
