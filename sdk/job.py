"""``Job``: what a tenant asks to train, validated on the client before it is sent.

Its fields, their types and defaults come from the job-field table
(:mod:`cantata.proto.jobfields`, generated into :mod:`cantata.sdk.job_fields`,
so that mypy and IDEs know them), its checks from the table and from the
cross-field rules the server runs too (:mod:`cantata.proto.jobrules`): the SDK,
the CLI, the server and the docs cannot disagree about them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cantata.proto import jobfields, jobrules
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import REQUEST_ID_RULE, valid_request_id
from cantata.sdk.errors import InvalidJob
from cantata.sdk.job_fields import JobFields

KNOWN = (*(f.name for f in jobfields.FIELDS), "request_id")


def _refuse_unknown(keys: Iterable[object]) -> None:
    """Raise ``InvalidJob`` naming the keys that are no job field, with the nearest field of each."""
    unknown = sorted(set(keys) - set(KNOWN), key=str)
    if not unknown:
        return
    hints = [f"{key} -> {close[0]}" for key in unknown if (close := difflib.get_close_matches(str(key), KNOWN, n=1))]
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    raise InvalidJob(
        f"unknown field(s): {', '.join(map(str, unknown))}{hint}; the fields are listed in docs/job-fields.md",
        field=str(unknown[0]),
    )


class Job(JobFields):
    """A training job: ``Job(name=..., model=..., workers=...)`` with the fields of ``docs/job-fields.md``.

    ``request_id`` makes ``submit`` idempotent; keep it to retry safely. An
    unknown keyword (``Job(**fields)`` from a file) is an ``InvalidJob`` naming it.
    """

    if not TYPE_CHECKING:  # type checkers see the generated dataclass __init__, with every field typed

        def __init__(self, *args: Any, **fields: Any) -> None:
            _refuse_unknown(fields)
            super().__init__(*args, **fields)

    def validate(self) -> None:
        """Raise ``InvalidJob`` naming the first bad field: the server's checks but those of its roots and sources."""
        for field, why in jobfields.problems(self, lambda f: f.sdk_unset_ok):
            raise InvalidJob(f"{field}: {why}", field=field)
        if not isinstance(self.request_id, str) or not valid_request_id(self.request_id):
            raise InvalidJob(f"request_id: {REQUEST_ID_RULE}", field="request_id")
        try:
            jobrules.check_sources(jobrules.checked(self.to_proto()))
        except jobrules.InvalidField as refused:
            raise InvalidJob(str(refused), field=refused.field) from None

    def to_proto(self) -> common_pb2.JobSpec:
        fields = {f.name: getattr(self, f.name) for f in jobfields.FIELDS}
        return common_pb2.JobSpec(**{k: v for k, v in fields.items() if v is not None})  # None: the server's default

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        """Build from a mapping (a YAML job file); unknown keys are an ``InvalidJob`` naming them."""
        _refuse_unknown(data)
        return cls(**data)
