"""Where an audit log keeps its files, and the log's identity.

<dir>/log.json            identity: format, log id, root key id, creation time
<dir>/segments/segment-00000001.jsonl ...   records, rotated by size
<dir>/checkpoints.jsonl   signed checkpoints
<dir>/keys/               signing keys (see keys.py)
<dir>/quarantine/         torn tails cut off by crash recovery, kept as evidence
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .errors import AuditLogCorrupt, AuditLogNotFound
from .keys import KeyDirectory
from .record import canonical, format_time, parse_time

FORMAT = "cantata-audit/1"
_SEGMENT_NAME = re.compile(r"segment-([0-9]{8})\.jsonl")


@dataclass(frozen=True)
class AuditLayout:
    """The files of the audit log rooted at ``root``."""

    root: Path

    @property
    def identity_path(self) -> Path:
        return self.root / "log.json"

    @property
    def segments_dir(self) -> Path:
        return self.root / "segments"

    @property
    def checkpoints_path(self) -> Path:
        return self.root / "checkpoints.jsonl"

    @property
    def keys(self) -> KeyDirectory:
        return KeyDirectory(self.root / "keys")

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def lock_path(self) -> Path:
        return self.root / ".writer.lock"

    def segment_path(self, number: int) -> Path:
        return self.segments_dir / f"segment-{number:08d}.jsonl"

    def segments(self) -> list[tuple[int, Path]]:
        """Segment files present, by number."""
        if not self.segments_dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.segments_dir.iterdir() if (m := _SEGMENT_NAME.fullmatch(p.name))]
        return sorted(found)


@dataclass(frozen=True)
class LogIdentity:
    """What ``log.json`` states: the log id every record and checkpoint carries, and the first key."""

    log_id: str
    root_key_id: str
    created: datetime

    def to_bytes(self) -> bytes:
        return (
            canonical(
                {
                    "format": FORMAT,
                    "log": self.log_id,
                    "root_key": self.root_key_id,
                    "created": format_time(self.created),
                }
            )
            + b"\n"
        )

    @classmethod
    def read(cls, layout: AuditLayout) -> LogIdentity:
        """Read ``log.json``; :class:`AuditLogNotFound` when there is no log, :class:`AuditLogCorrupt` when unreadable."""
        path = layout.identity_path
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise AuditLogNotFound(f"no audit log at {layout.root} ({path.name} missing)") from None
        try:
            stored = json.loads(text)
            if stored.get("format") != FORMAT:
                raise ValueError(f"format is {stored.get('format')!r}, expected {FORMAT!r}")
            return cls(
                log_id=str(stored["log"]), root_key_id=str(stored["root_key"]), created=parse_time(stored["created"])
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AuditLogCorrupt(f"{path} is not a valid audit log identity: {exc}") from None
