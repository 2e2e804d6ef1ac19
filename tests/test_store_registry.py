"""The store registry (cantata.storage.uri): a scheme registered once reaches every path that opens or checks a
store, and no module outside storage/ spells a scheme."""

from __future__ import annotations

import ast
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult

import pytest
import torch

from cantata.security.keys import LocalKeyring, MasterKey
from cantata.server import telemetry
from cantata.server.jobs import jobspec
from cantata.server.workers import sandbox
from cantata.storage import uri as stores
from cantata.storage.base import BlobNotFoundError, BlobReader, BlobStore, BlobUpload, ChunkReader, StoreConfigError
from cantata.storage.outage import OutageListener
from cantata.trainer.checkpoint import JobCheckpoints
from cantata.trainer.data.errors import DataError
from cantata.trainer.data.sources import SourceCredentials

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cantata", "proto", "sdk", "server", "trainer", "security")  # storage/ is the registry's folder
# Not a blob store: torch.distributed's own file:// rendezvous (init_method) URL.
NOT_STORES = {"server/workers/rendezvous.py"}


class MemoryStore(BlobStore):
    """A toy store: objects in a dict shared by every store of one location."""

    def __init__(self, location: str, prefix: str, objects: dict[str, bytes]) -> None:
        self._location, self._prefix, self._objects = location, prefix.strip("/"), objects

    @property
    def uri(self) -> str:
        return stores.store_uri("toy", self._location, self._prefix)

    def _name(self, key: str) -> str:
        return f"{self._location}/{self._prefix}/{key}"

    def _start_upload(self, key: str) -> BlobUpload:
        return _MemoryUpload(self._objects, self._name(key))

    def get(self, key: str) -> BlobReader:
        if self._name(key) not in self._objects:
            raise BlobNotFoundError(key)
        return ChunkReader(iter([self._objects[self._name(key)]]))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        start = self._name(prefix)
        root = self._name("")
        return {name.removeprefix(root): len(data) for name, data in self._objects.items() if name.startswith(start)}

    def delete(self, key: str) -> None:
        self._objects.pop(self._name(key), None)


class _MemoryUpload(BlobUpload):
    def __init__(self, objects: dict[str, bytes], name: str) -> None:
        self._objects, self._name, self._buffer = objects, name, io.BytesIO()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._buffer.write(data)

    def commit(self) -> None:
        self._objects[self._name] = self._buffer.getvalue()

    def abort(self) -> None:
        self._buffer = io.BytesIO()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bytes]]:
    """Registers the ``toy`` scheme for one test; the objects its stores hold."""
    objects: dict[str, bytes] = {}

    def open_toy(parts: SplitResult, outages: OutageListener | None, overrides: dict[str, Any]) -> BlobStore:
        return MemoryStore(parts.netloc, parts.path, objects)

    monkeypatch.setattr(stores, "SCHEMES", dict(stores.SCHEMES))

    def toy_credentials(endpoint: str, secrets: Mapping[str, str]) -> dict[str, Any]:
        return {"endpoint": endpoint, "token": secrets["token"]}

    stores.register(
        stores.StoreScheme(
            "toy", open_toy, remote=True, label="toy", env_prefixes=("TOY_",), credentials=toy_credentials
        )
    )
    yield objects


def test_the_checkpoint_writer_saves_into_a_registered_store(toy: dict[str, bytes], tmp_path: Path) -> None:
    keyring = LocalKeyring(tmp_path / "keyring.sealed", MasterKey.create_file(tmp_path / "master.key"))
    keyring.ensure_tenant("acme")
    checkpoints = JobCheckpoints("toy://bucket/ckpt", "acme", "job-1", keyring.job_keys("acme", "job-1"), keep_last=2)
    checkpoints.begin(3, 0, None)
    state = {"w": torch.arange(4.0)}
    assert checkpoints.commit(3, 0, {"model": state}, None, []) is not None
    assert checkpoints.latest_step() == 3
    assert torch.equal(checkpoints.load(3)["model"]["w"], state["w"])
    assert toy and all(name.startswith("bucket/ckpt/acme/job-1/") for name in toy)


def test_the_server_checks_and_describes_a_registered_store(toy: dict[str, bytes], monkeypatch) -> None:
    jobspec.check_store("toy://bucket/prefix", "checkpoint_store", [])
    assert jobspec.dataset_source("toy://src@bucket/x") == "src"
    assert telemetry.store_kind("toy://bucket/prefix") == "toy"
    monkeypatch.setenv("TOY_TOKEN", "t")
    assert sandbox.store_environment("toy://bucket/prefix") == {"TOY_TOKEN": "t"}
    with pytest.raises(StoreConfigError, match="toy://"):
        stores.open_store("nope://bucket/prefix")


def test_a_data_source_of_a_registered_kind_reaches_its_store(toy: dict[str, bytes]) -> None:
    credentials = SourceCredentials.from_dict(
        {"name": "src", "kind": "toy", "endpoint": "e", "secrets": {"token": "t"}}
    )
    assert credentials.store_options() == {"endpoint": "e", "token": "t"}
    with pytest.raises(DataError, match="kind: must be one of s3, az, not 'file'"):
        SourceCredentials.from_dict({"name": "src", "kind": stores.LOCAL, "secrets": {}})


def test_a_scheme_registers_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        stores.register(stores.SCHEMES[stores.LOCAL])


def scheme_literals(source: str, schemes: tuple[str, ...]) -> list[int]:
    """Lines of ``source`` that spell a scheme: a ``name://`` string, or a ``*scheme*`` compared with a name."""
    prefixes = {f"{name}://" for name in schemes}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in prefixes:
            found.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            about_scheme = any(
                "scheme" in (s.id if isinstance(s, ast.Name) else s.attr if isinstance(s, ast.Attribute) else "")
                for s in sides
            )
            named = any(isinstance(c, ast.Constant) and c.value in schemes for s in sides for c in ast.walk(s))
            if about_scheme and named:
                found.append(node.lineno)
    return sorted(found)


def test_the_check_finds_a_scheme_spelled_out() -> None:
    code = 'if parts.scheme == "s3":\n    pass\nok = uri.startswith("file://")\nif scheme in ("x", "az"):\n    pass\n'
    assert scheme_literals(code, ("file", "s3", "az")) == [1, 3, 4]


def test_no_module_outside_the_registry_spells_a_scheme() -> None:
    schemes = tuple(stores.SCHEMES)
    spelled = {
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "_pb2" not in path.name and str(path.relative_to(ROOT)) not in NOT_STORES
        for line in scheme_literals(path.read_text(), schemes)
    }
    assert not spelled, f"ask cantata.storage.uri instead: {sorted(spelled)}"
