"""The base install is the SDK and the CLI: a fresh venv without torch submits a job to a real server.

The wheel is built from a copy of the sources, and pip installs it with its
dependencies into a fresh venv, offline (``--no-index``): the venv holds only
the distributions the base requirements need, taken from this environment's
(their files linked in, with their metadata, so pip sees them installed). A
base requirement on anything else (torch, say) makes pip fail to resolve.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import Distribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("cantata", "proto", "sdk", "server", "trainer", "security", "storage")


def _build_wheel(work: Path) -> Path:
    source = work / "src"
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    return next(wheels.glob("cantata-*.whl"))


def base_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` without an extra: what ``pip install cantata`` brings."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    requirements = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(requirements: list[Requirement]) -> dict[str, Distribution]:
    """The installed distributions that ``requirements`` need, with their own needs, by canonical name."""
    found: dict[str, Distribution] = {}
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found[name] = dist = distribution(requirement.name)
        assert dist.version in requirement.specifier or not requirement.specifier, (requirement, dist.version)
        for text in dist.requires or []:
            needed = Requirement(text)
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                todo.append(needed)
    return found


def _link_into(dist: Distribution, site: Path) -> None:
    here = Path(sysconfig.get_paths()["purelib"])
    for file in dist.files or []:
        target = Path(str(dist.locate_file(file))).resolve()
        try:
            relative = target.relative_to(here.resolve())
        except ValueError:
            continue  # scripts and data outside site-packages
        link = site / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(target)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("light")
    wheel = _build_wheel(work)
    requirements = base_requirements(wheel)
    assert {"torch", "transformers"}.isdisjoint(canonicalize_name(r.name) for r in requirements)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in closure(requirements).values():
        _link_into(dist, site)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index"]
        + ["--find-links", str(wheel.parent), str(wheel)],
        check=True,
    )
    return venv


def _run(venv: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in (env or os.environ).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([str(venv / "bin" / "cantata"), *args], capture_output=True, text=True, env=clean, cwd=venv)
    if check and result.returncode != 0:
        raise AssertionError(f"cantata {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def test_the_base_install_has_no_torch_and_the_cli_starts(light_venv):
    python = light_venv / "bin" / "python"
    missing = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, cwd=light_venv)
    assert missing.returncode != 0 and "No module named 'torch'" in missing.stderr
    for library in ("numpy", "boto3", "azure.storage.blob", "matplotlib", "transformers"):
        assert subprocess.run([python, "-c", f"import {library}"], capture_output=True, cwd=light_venv).returncode
    assert _run(light_venv, "--help").stdout.startswith("usage: cantata")
    assert _run(light_venv, "--version").stdout.startswith("cantata ")
    assert "submit" in _run(light_venv, "jobs", "--help").stdout


def test_a_server_command_in_the_base_install_names_the_extra(light_venv, tmp_path):
    env = {**os.environ, "CANTATA_HOME": str(tmp_path / "home")}
    result = _run(light_venv, "server", "start", "--data-dir", str(tmp_path / "d"), env=env, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().endswith("pip install 'cantata[server]'"), result.stderr


def test_the_base_install_submits_and_watches_a_job_on_a_real_server(light_venv, platform):
    platform.enroll("light").close()
    submitted = _run(
        light_venv,
        "jobs",
        "submit",
        "--profile",
        "light",
        "--name",
        "from-a-light-install",
        "--steps",
        "10",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--watch",
        env=platform.env,
    )
    assert "SUCCEEDED" in submitted.stdout and "step 10/10" in submitted.stdout
