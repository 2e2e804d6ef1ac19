"""The package version comes from the installed distribution's metadata."""

import importlib
import importlib.metadata
import tomllib
from pathlib import Path

import pytest

import cantata

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_the_installed_distributions():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cantata.__version__ == importlib.metadata.version("cantata") == declared


def test_version_without_metadata_is_marked_unknown(monkeypatch: pytest.MonkeyPatch):
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    try:
        assert importlib.reload(cantata).__version__ == "0+unknown"
    finally:
        monkeypatch.undo()
        importlib.reload(cantata)
    assert cantata.__version__ != "0+unknown"
