"""Run mypy over every package under its import name.

``pyproject.toml`` maps folders to import names (``cantata.sdk`` is ``sdk/``),
which mypy cannot follow through the editable install's import hook. This
lists each module of the mapping with its path and import name, and those of
the test kit and the tests (imported by their folders' names), and hands that
list to mypy, configured by ``[tool.mypy]``; generated ``*_pb2`` modules are
read from their ``.pyi`` stubs. Extra arguments go to mypy.

    python scripts/typecheck.py [MYPY-OPTIONS]
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


ROOT_PACKAGES = ("testkit", "tests")  # imported from the repository root by their folders' names


def sources(root: Path = ROOT) -> list[BuildSource]:
    """One source per module of ``[tool.setuptools.package-dir]`` and of ``ROOT_PACKAGES``, stubs preferred."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    packages = {**config["tool"]["setuptools"]["package-dir"], **{name: name for name in ROOT_PACKAGES}}
    found = []
    for package, folder in packages.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if not all(part.isidentifier() for part in parts):
                continue
            if path.with_suffix(".pyi").exists():
                path = path.with_suffix(".pyi")
            name = ".".join([package, *parts[:-1]] if parts[-1] == "__init__" else [package, *parts])
            found.append(BuildSource(str(path.relative_to(root)), name))
    return found


def main(argv: list[str]) -> int:
    """Type-check the packages; print mypy's messages; 1 if there were errors."""
    os.chdir(ROOT)  # the sources' paths, and so mypy's messages, are relative to the repository
    modules = sources()
    _, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml"), *argv, *(s.path for s in modules if s.path)]
    )
    try:
        messages = build.build(modules, options).errors
    except CompileError as blocker:
        messages = blocker.messages
    for message in messages:
        print(message)
    errors = sum(": error:" in m for m in messages)
    print(f"mypy: {errors} errors in {len(modules)} modules", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
