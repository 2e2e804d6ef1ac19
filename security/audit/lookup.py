"""Finding individual records, as a security team's lookup asks for them: by tenant, action, request id and time.

:func:`find_records` reads; it does not prove (:func:`~.verify.verify` does).
It is built for selective questions over a large log: segments wholly before
the page's starting point are skipped by their first sequence number, and a
line is parsed only if it holds, byte for byte, the canonical JSON of every
field asked for (``"action":"job_deleted"``), which every matching record's
canonical line does; the parsed record is then checked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from .errors import AuditLogCorrupt
from .layout import AuditLayout, LogIdentity
from .record import AuditRecord, canonical
from .segments import read_file

REQUEST_ID_DETAIL = "request_id"  # the details field naming the call a record was made for


def _needle(name: str, value: str) -> bytes:
    return canonical({name: value})[1:-1]  # '"name":"value"', as a canonical line holds it


def _first_seq(path: Path) -> int | None:
    with path.open("rb") as segment:
        first = segment.readline()
    try:
        seq = json.loads(first)["seq"]
    except (ValueError, KeyError, TypeError):
        return None
    return seq if isinstance(seq, int) else None


def _segments_after(layout: AuditLayout, after: int) -> list[Path]:
    """Segment files that may hold records with a sequence number above ``after``."""
    segments = [path for _, path in layout.segments()]
    starts = [_first_seq(path) for path in segments]
    keep = 0
    for index in range(1, len(segments)):
        start = starts[index]
        if start is not None and start <= after + 1 and all(s is not None for s in starts[: index + 1]):
            keep = index  # every record before this segment's first one is at most ``after``
    return segments[keep:]


def find_records(
    directory: Path,
    *,
    tenant: str | None = None,
    action: str = "",
    request_id: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    after: int = 0,
    limit: int | None = None,
) -> Iterator[AuditRecord]:
    """Records with ``seq`` above ``after``, in log order, that match every filter given, at most ``limit``.

    ``tenant`` None means any tenant; ``since`` is inclusive, ``until`` exclusive. Lines that do not
    parse as records are skipped here and reported by ``verify``.
    """
    layout = AuditLayout(Path(directory))
    LogIdentity.read(layout)
    needles = [
        _needle(name, value)
        for name, value in (("tenant", tenant), ("action", action), (REQUEST_ID_DETAIL, request_id))
        if value
    ]
    found = 0
    for path in _segments_after(layout, after):
        for raw in read_file(path).split(b"\n"):
            if not raw or not all(needle in raw for needle in needles):
                continue
            try:
                record = AuditRecord.from_stored(json.loads(raw))
            except (ValueError, AuditLogCorrupt):  # not JSON, or not a record (torn tail included)
                continue
            if record.seq <= after or not _matches(record, tenant, action, request_id, since, until):
                continue
            yield record
            found += 1
            if limit is not None and found >= limit:
                return


def _matches(
    record: AuditRecord,
    tenant: str | None,
    action: str,
    request_id: str,
    since: datetime | None,
    until: datetime | None,
) -> bool:
    return (
        (tenant is None or record.tenant == tenant)
        and (not action or record.action == action)
        and (not request_id or record.details.get(REQUEST_ID_DETAIL) == request_id)
        and (since is None or record.time >= since)
        and (until is None or record.time < until)
    )
