"""Reading the log's line files (segments and the checkpoint file) back as lines, and segments as records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .errors import AuditLogCorrupt
from .layout import AuditLayout, LogIdentity
from .record import AuditRecord


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a segment (or, with ``segment`` 0, of the checkpoint file): its parsed JSON object,
    or why it has none."""

    segment: int
    line_no: int
    offset: int
    raw: bytes
    stored: dict | None
    error: str | None = None
    torn: bool = False

    @property
    def where(self) -> str:
        return f"segment {self.segment:08d} line {self.line_no}"


def split_lines(number: int, data: bytes, *, final: bool) -> Iterator[LogLine]:
    """The lines of one file; trailing bytes without a newline in a ``final`` file are ``torn``."""
    offset = 0
    line_no = 0
    while offset < len(data):
        line_no += 1
        end = data.find(b"\n", offset)
        if end < 0:
            error = "incomplete last line (no newline)" if final else "segment ends inside a line"
            yield LogLine(number, line_no, offset, data[offset:], None, error, torn=final)
            return
        yield _parse(number, line_no, offset, data[offset:end])
        offset = end + 1


def _parse(number: int, line_no: int, offset: int, raw: bytes) -> LogLine:
    try:
        stored = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return LogLine(number, line_no, offset, raw, None, f"not JSON ({exc.__class__.__name__})")
    if not isinstance(stored, dict):
        return LogLine(number, line_no, offset, raw, None, "not a JSON object")
    return LogLine(number, line_no, offset, raw, stored)


def read_file(path: Path) -> bytes:
    """A log file's bytes; :class:`AuditLogCorrupt` when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AuditLogCorrupt(f"cannot read {path}: {exc.strerror}") from None


def iter_lines(layout: AuditLayout) -> Iterator[LogLine]:
    """Every line of every segment, in segment order."""
    segments = layout.segments()
    for position, (number, path) in enumerate(segments):
        yield from split_lines(number, read_file(path), final=position == len(segments) - 1)


def read_records(
    directory: Path, *, tenant: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> Iterator[AuditRecord]:
    """Records in log order, filtered by tenant and by time (``since`` inclusive, ``until`` exclusive).

    This reads; it does not prove. Lines that do not parse as records are
    skipped here and reported by :func:`verify`, which callers that need
    integrity run first (as :func:`build_report` does).
    """
    layout = AuditLayout(Path(directory))
    LogIdentity.read(layout)
    for line in iter_lines(layout):
        if line.stored is None:
            continue
        try:
            record = AuditRecord.from_stored(line.stored)
        except AuditLogCorrupt:
            continue
        if tenant is not None and record.tenant != tenant:
            continue
        if since is not None and record.time < since:
            continue
        if until is not None and record.time >= until:
            continue
        yield record
