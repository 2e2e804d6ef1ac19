"""The worker launch contract: the 0600 JSON file a worker process starts from, written by either executor.

:class:`WorkerLaunch` is what the server tells one worker process (who it is,
where the server and its peers are, the job's spec, its files); its
:class:`WorkerSecrets` (the job's derived checkpoint keys and its data
sources' credentials, from the secrets broker) sit at the top level of the
same file, each secret a JSON object of its own that the trainer parses into
its type (``JobKeys``, ``SourceCredentials``, ``DatasetKey``). The server
builds a launch once (:mod:`cantata.server.executors.plan`) and the worker
parses it once (:meth:`WorkerLaunch.load`): a field that is unknown, missing
or of the wrong type is a :class:`LaunchError`, never a default.

Torch-free, and importing nothing of ours but the job spec: the server and
the trainer both import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from cantata.proto.v1 import common_pb2

T = typing.TypeVar("T")
Document = dict[str, Any]  # a JSON object: a secret document, an attack or fault plan


class LaunchError(ValueError):
    """A worker launch document that breaks the contract; ``field`` names where (dotted), ``""``: the whole."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class DataSecrets:
    """Where the job's ``file://`` datasets may be, and the credentials of the data sources it names."""

    roots: tuple[str, ...]  # the tenant's folders of the server's dataset roots
    credentials: Document | None = field(default=None, repr=False)  # the dataset's source
    dataset_key: Document | None = field(default=None, repr=False)  # the tenant's shard key, if it encrypts
    init_credentials: Document | None = field(default=None, repr=False)  # the init_from's source


@dataclass(frozen=True)
class WorkerSecrets:
    """What only the job's workers may hold, released by the secrets broker for one launch."""

    checkpoint_keys: Document = field(repr=False)  # the job's derived checkpoint keys (JobKeys.to_dict)
    data: DataSecrets

    def to_dict(self) -> Document:
        return dataclasses.asdict(self) | {"data": _data_dict(self.data)}

    @classmethod
    def from_dict(cls, raw: object) -> WorkerSecrets:
        return _decode(cls, raw, "")


@dataclass(frozen=True)
class WorkerLaunch:
    """One worker process's launch: everything it starts from, secrets included."""

    job_id: str
    tenant: str
    worker: int  # its process index
    workers: int  # the job's workers (decentralized: worker groups)
    attempt: int
    server: str  # where it reports (host:port)
    ca: str  # files on its node: the platform CA, its certificate and key
    cert: str
    key: str
    rendezvous: str  # its torch.distributed group's rendezvous
    threads: int  # compute threads
    spec: common_pb2.JobSpec
    secrets: WorkerSecrets = field(repr=False)
    attack: Document | None = None  # evaluation only: set by an admin, never by the tenant
    fault: Document | None = None  # evaluation only, likewise: a planned loss fault (cantata.proto.faults)
    gossip_host: str = "127.0.0.1"  # the address its gossip endpoint binds (named in its certificate)
    store_env: dict[str, str] = field(default_factory=dict, repr=False)  # to reach the checkpoint store

    def to_dict(self) -> Document:
        """The file's JSON object: the launch's fields, and the secrets' at the same level."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "secrets"}
        fields["spec"] = json_format.MessageToDict(self.spec, preserving_proto_field_name=True)
        return fields | self.secrets.to_dict()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, raw: object) -> WorkerLaunch:
        if not isinstance(raw, dict):
            raise LaunchError("a worker launch is a JSON object")
        secret_names = {f.name for f in dataclasses.fields(WorkerSecrets)}
        secrets = {k: v for k, v in raw.items() if k in secret_names}
        rest = {k: v for k, v in raw.items() if k not in secret_names}
        return _decode(cls, rest, "", secrets=_decode(WorkerSecrets, secrets, ""))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerLaunch:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise LaunchError(f"a worker launch is not JSON: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def load(cls, path: Path) -> WorkerLaunch:
        """The launch in the file at ``path`` (a worker parses its own once, at start)."""
        return cls.from_json(Path(path).read_bytes())


def _data_dict(data: DataSecrets) -> Document:
    return dataclasses.asdict(data) | {"roots": list(data.roots)}


def _decode(cls: type[T], raw: object, where: str, **given: Any) -> T:
    """An instance of the dataclass ``cls`` from the JSON object ``raw`` and the fields ``given`` decoded already:
    every field known, present or defaulted, and of its type."""
    if not isinstance(raw, dict):
        raise LaunchError(f"{where or 'the launch'} is not a JSON object", where)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for name in raw:
        if name not in fields or name in given:
            close = difflib.get_close_matches(name, [known for known in fields if known not in given], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise LaunchError(f"unknown field {_path(where, name)!r} in a worker launch{hint}", _path(where, name))
    hints = typing.get_type_hints(cls)
    values = dict(given)
    for name, f in fields.items():
        if name in given:
            continue
        if name in raw:
            values[name] = _value(hints[name], raw[name], _path(where, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise LaunchError(f"a worker launch lacks field {_path(where, name)!r}", _path(where, name))
    return cls(**values)


def _value(hint: Any, value: object, where: str) -> Any:
    """``value`` as the type ``hint`` says, or a :class:`LaunchError` naming ``where``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [arg for arg in args if arg is not type(None)]
        args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _decode(hint, value, where)  # type: ignore[arg-type]
    if hint is common_pb2.JobSpec:
        if not isinstance(value, dict):
            raise LaunchError(f"{where} is not a JSON object", where)
        try:
            return json_format.ParseDict(value, common_pb2.JobSpec())
        except json_format.ParseError as exc:
            raise LaunchError(f"{where}: {exc}", where) from exc
    origin = typing.get_origin(hint) or hint
    if origin is tuple and isinstance(value, list):
        return tuple(_value(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
    if origin is dict and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _value(args[1], v, f"{where}.{k}") for k, v in value.items()} if args[1] is not Any else value
    if hint is Any or (isinstance(value, origin) and not (origin is int and isinstance(value, bool))):
        return value
    raise LaunchError(f"{where} is {type(value).__name__}, not {getattr(hint, '__name__', hint)}", where)


def _path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
