"""Checking, at open, every record after the last signed checkpoint.

The writer trusts what the last checkpoint signed and proves the rest before
it appends: the record at the checkpoint's sequence number carries the signed
hash, and every later record is whole, canonical, of this log, numbered one
after the other and chained to the one before. Only an incomplete last line of
the last segment (a write a crash or a full disk cut short) is let through, as
``torn``, for the writer to quarantine; anything else refuses the open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .errors import AuditLogCorrupt
from .layout import AuditLayout
from .record import canonical, canonical_line_hash, genesis_hash
from .segments import LogLine, read_file, split_lines

_ADVICE = "run `cantata audit verify`"


class Unsigned(NamedTuple):
    """What a server reconciles its acts with, of one record after the last signed checkpoint."""

    action: str
    resource: str
    tenant: str
    outcome: str


@dataclass(frozen=True)
class Tail:
    """Where the chain ends: the last record's sequence number and hash, the segment to append to, and any torn bytes."""

    seq: int
    head: str
    segment_number: int
    segment_size: int
    torn: tuple[Path, LogLine] | None
    unsigned: dict[int, Unsigned]  # seq -> each record after the checkpoint


def _seq_of(line: LogLine) -> int | None:
    seq = line.stored.get("seq") if line.stored is not None else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _segments_since(layout: AuditLayout, signed_seq: int) -> list[tuple[int, Path, list[LogLine]]]:
    """The last segments, back to the one holding record ``signed_seq`` (or the first), with their lines."""
    segments = layout.segments()
    found: list[tuple[int, Path, list[LogLine]]] = []
    for position, (number, path) in enumerate(reversed(segments)):
        lines = list(split_lines(number, read_file(path), final=position == 0))
        found.insert(0, (number, path, lines))
        first = next((seq for line in lines if (seq := _seq_of(line)) is not None), None)
        if first is not None and first <= signed_seq:
            break
    return found


def check_tail(layout: AuditLayout, log_id: str, signed_seq: int, signed_hash: str) -> Tail:
    """Prove the records after checkpoint (``signed_seq``, ``signed_hash``); :class:`AuditLogCorrupt` if any is not."""
    found = _segments_since(layout, signed_seq)
    seq, head = 0, genesis_hash(log_id)
    reached = signed_seq == 0
    torn: tuple[Path, LogLine] | None = None
    unsigned: dict[int, Unsigned] = {}
    for _number, path, lines in found:
        for line in lines:
            line_seq = _seq_of(line)
            if not reached and line_seq != signed_seq:
                continue  # history the checkpoint vouches for; `audit verify` proves it
            if line.torn:
                torn = (path, line)
                continue
            where = f"{path} line {line.line_no}"
            stored = line.stored
            if stored is None or line_seq is None or not isinstance(stored.get("hash"), str):
                raise AuditLogCorrupt(f"{where}: not an audit record ({line.error or 'fields missing'}); {_ADVICE}")
            if canonical(stored) != line.raw or canonical_line_hash(line.raw, stored["hash"]) != stored["hash"]:
                raise AuditLogCorrupt(f"{where}: record {line_seq} does not match its hash; {_ADVICE}")
            if stored.get("log") != log_id:
                raise AuditLogCorrupt(f"{where}: record {line_seq} belongs to another log; {_ADVICE}")
            if not reached:
                if stored["hash"] != signed_hash:
                    raise AuditLogCorrupt(
                        f"{where}: record {line_seq} differs from what the last checkpoint signed; {_ADVICE}"
                    )
                reached = True
            elif line_seq != seq + 1 or stored.get("prev") != head:
                raise AuditLogCorrupt(
                    f"{where}: record {line_seq} does not follow record {seq} in the chain; {_ADVICE}"
                )
            else:
                unsigned[line_seq] = Unsigned(
                    *(str(stored.get(field, "")) for field in ("action", "resource", "tenant", "outcome"))
                )
            seq, head = line_seq, stored["hash"]
    if seq < signed_seq:
        raise AuditLogCorrupt(
            f"{layout.root}: the log ends at record {seq} but the last checkpoint signed records up to "
            f"{signed_seq}; records were removed; {_ADVICE}"
        )
    number, path = found[-1][:2] if found else (1, layout.segment_path(1))
    size = torn[1].offset if torn is not None else (path.stat().st_size if path.exists() else 0)
    return Tail(seq, head, number, size, torn, unsigned)
