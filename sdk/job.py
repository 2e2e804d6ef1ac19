"""``Job``: what a tenant asks to train, validated on the client before it is sent.

Its fields, their defaults and their checks come from the job-field table
(:mod:`cantata.proto.jobfields`), so the SDK, the CLI, the server and the docs
cannot disagree about them.
"""

from __future__ import annotations

import dataclasses
import difflib
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import REQUEST_ID_RULE, valid_request_id
from cantata.sdk.errors import InvalidJob

T = TypeVar("T")


def _job_fields(cls: type[T]) -> type[T]:
    """Make ``cls`` a dataclass of every job field in the table, then ``request_id``."""
    annotations: dict[str, Any] = {}
    for f in jobfields.FIELDS:
        annotations[f.name] = f.kind | None if f.optional else f.kind
        if f.sdk_default is not jobfields.REQUIRED:
            setattr(cls, f.name, f.sdk_default)
    annotations["request_id"] = str
    cls.request_id = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)  # type: ignore[attr-defined]
    cls.__annotations__ = annotations
    return dataclasses.dataclass(cls)


@_job_fields
class Job:
    """A training job: ``Job(name=..., model=..., workers=...)`` with the fields of ``docs/job-fields.md``.

    ``request_id`` makes ``submit`` idempotent; keep it to retry safely.
    """

    if TYPE_CHECKING:  # the fields are made from the table at import time

        def __init__(self, name: str, **fields: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def validate(self) -> None:
        """Raise ``InvalidJob`` naming the first bad field (the server checks again)."""
        for field, why in jobfields.problems(self, lambda f: f.sdk_unset_ok):
            raise InvalidJob(f"{field}: {why}", field=field)
        if not isinstance(self.request_id, str) or not valid_request_id(self.request_id):
            raise InvalidJob(f"request_id: {REQUEST_ID_RULE}", field="request_id")

    def to_proto(self) -> common_pb2.JobSpec:
        fields = {f.name: getattr(self, f.name) for f in jobfields.FIELDS}
        return common_pb2.JobSpec(**{k: v for k, v in fields.items() if v is not None})  # None: the server's default

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        """Build from a mapping (a YAML job file); unknown keys are an ``InvalidJob`` naming them."""
        known = [f.name for f in jobfields.FIELDS] + ["request_id"]
        unknown = sorted(set(data) - set(known), key=str)
        if unknown:
            hints = [
                f"{key} -> {close[0]}" for key in unknown if (close := difflib.get_close_matches(str(key), known, n=1))
            ]
            hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
            raise InvalidJob(
                f"unknown field(s): {', '.join(map(str, unknown))}{hint}; the fields are listed in docs/job-fields.md",
                field=str(unknown[0]),
            )
        return cls(**data)
