"""Check the import contracts of ``[tool.importlinter]``: the layering of docs/architecture.md#layering.

import-linter finds a package's modules by walking its folder, but the
subpackages of ``cantata`` live in folders of their own (``cantata.sdk`` is
``sdk/``, see ``[tool.setuptools.package-dir]``). This links the folders into
a temporary tree under their import names and lints that tree.

    python scripts/layering.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def link_tree(target: Path, root: Path = ROOT) -> None:
    """Lay out the packages of ``root`` under ``target`` by import name, as symbolic links."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        path = target.joinpath(*package.split("."))
        if any(other.startswith(package + ".") for other in mapping):
            path.mkdir(parents=True)  # a package holding other mapped packages: link its own entries
            for entry in (root / folder).iterdir():
                (path / entry.name).symlink_to(entry)
        else:
            path.symlink_to(root / folder, target_is_directory=True)


def main() -> int:
    """Lint the imports; import-linter prints the contracts kept and broken."""
    with tempfile.TemporaryDirectory() as tree:
        link_tree(Path(tree))
        os.chdir(tree)  # lint-imports puts the working directory first on sys.path
        from importlinter.cli import lint_imports

        return lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)


if __name__ == "__main__":
    sys.exit(main())
