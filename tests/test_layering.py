"""The layering of docs/architecture.md#layering holds, and the CLI never loads torch."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import cantata.trainer.data as data

ROOT = Path(__file__).resolve().parent.parent

_CLI_IMPORTS = """
import json, sys
import cantata.sdk, cantata.sdk.cli
parser, groups = cantata.sdk.cli.build_parser()
print(json.dumps({
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
    "plugins": sorted(m for m in ("cantata.server.cli", "cantata.trainer.data.cli") if m in sys.modules),
}))
"""


def test_the_import_contracts_hold():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layering.py")], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_sdk_and_its_cli_with_every_plugin_load_no_torch():
    result = subprocess.run([sys.executable, "-c", _CLI_IMPORTS], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["plugins"] == ["cantata.server.cli", "cantata.trainer.data.cli"]
    assert loaded["torch"] == []


@pytest.mark.parametrize("name", data.__all__)
def test_the_data_package_exports_each_name_from_its_submodule(name):
    home = importlib.import_module(f"cantata.trainer.data.{data._HOMES[name]}")
    assert getattr(data, name) is getattr(home, name)


def test_the_data_package_exports_exactly_its_public_names():
    assert sorted(data._HOMES) == sorted(data.__all__)
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = data.missing


_SERVER_IMPORTS = """
import json, sys
import cantata.sdk.cli, cantata.server.app  # what `cantata server start` imports before it serves
cantata.sdk.cli.build_parser()
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def test_the_server_process_loads_no_torch():
    """The control plane lists and streams checkpoints and plans attacks without torch (a worker's import)."""
    result = subprocess.run([sys.executable, "-c", _SERVER_IMPORTS], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
