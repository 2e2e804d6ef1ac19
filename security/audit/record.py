"""Audit records: their canonical encoding and the hash chain that links them.

A record is stored as one line of canonical JSON (sorted keys, no spaces,
ASCII only). Its ``hash`` is SHA-256 over ``0x00 || canonical(record without
hash)`` (the RFC 9162 leaf prefix), and the body carries ``prev``, the hash
of the record before it; the first record's ``prev`` is the log's genesis
hash, derived from the log id, so the whole chain is bound to one log.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii

from .errors import AuditLogCorrupt

LEAF_PREFIX = b"\x00"
GENESIS_DOMAIN = b"cantata-audit-genesis/1\x00"
RECORD_FIELDS = ("seq", "time", "log", "actor", "action", "resource", "tenant", "outcome", "peer", "details", "prev")


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonical(value: object) -> bytes:
    """The one byte encoding of a JSON value that hashes and signatures cover."""
    return _CANONICAL.encode(value).encode()


def body_hash(body: Mapping[str, object]) -> str:
    """Hex SHA-256 chain hash of a record body (every field but ``hash``)."""
    return hashlib.sha256(LEAF_PREFIX + canonical(body)).hexdigest()


class RecordTemplate:
    """A record's fields but its place in the chain (``seq``, ``time``, ``prev``), encoded ahead of it.

    :meth:`line` then makes the stored line and chain hash by joining bytes:
    ``canonical(body)`` of the whole body, with ``hash`` put where sorted order
    puts it (between ``details`` and ``log``), the same bytes as
    ``canonical({**body, "hash": body_hash(body)})``, so the work left for the
    log's lock is one hash. Canonical JSON of an object is its sorted members
    joined, so members encoded one by one join to the object's encoding. The
    fields that repeat from record to record (the log, actor, action, outcome,
    tenant, peer) are encoded once and remembered.
    """

    __slots__ = ("_head", "_log_to_prev", "_resource_to_seq", "_tenant_to_time")

    def __init__(
        self, *, log: str, actor: str, action: str, resource: str, tenant: str, outcome: str, peer: str, details: dict
    ):
        self._head = _head(action, actor) + (canonical(details) if details else b"{}")
        self._log_to_prev = _log_to_prev(log, outcome, peer)
        self._resource_to_seq = b',"resource":' + _text(resource) + b',"seq":'
        self._tenant_to_time = _tenant_to_time(tenant)

    def line(self, seq: int, time: str, prev: str) -> tuple[bytes, str]:
        """The stored line (newline included) and chain hash of the record at ``seq`` after ``prev``.

        ``time`` (:func:`format_time`'s) and ``prev`` (a hex hash) are ASCII that JSON does not escape.
        """
        rest = b"".join(
            (
                self._log_to_prev,
                b'"',
                prev.encode(),
                b'"',
                self._resource_to_seq,
                str(int(seq)).encode(),
                self._tenant_to_time,
                b'"',
                time.encode(),
                b'"}',
            )
        )
        chain_hash = hashlib.sha256(LEAF_PREFIX + self._head + rest).hexdigest()
        return b"".join((self._head, b',"hash":"', chain_hash.encode(), b'"', rest, b"\n")), chain_hash


def _text(value: str) -> bytes:
    """``canonical(value)`` of a string, by the escaper the canonical encoder itself uses for strings."""
    return encode_basestring_ascii(value).encode()


@functools.lru_cache(maxsize=4096)
def _head(action: str, actor: str) -> bytes:
    return b'{"action":' + _text(action) + b',"actor":' + _text(actor) + b',"details":'


@functools.lru_cache(maxsize=4096)
def _log_to_prev(log: str, outcome: str, peer: str) -> bytes:
    return b',"log":' + _text(log) + b',"outcome":' + _text(outcome) + b',"peer":' + _text(peer) + b',"prev":'


@functools.lru_cache(maxsize=4096)
def _tenant_to_time(tenant: str) -> bytes:
    return b',"tenant":' + _text(tenant) + b',"time":'


def canonical_line_hash(line: bytes, stored_hash: str) -> str:
    """The chain hash of a record from its canonical stored line (without the newline).

    Equal to :func:`body_hash` of the parsed body, without re-encoding it: in
    canonical JSON the top-level ``"hash"`` field is the last one that is not
    a scalar's value, and quotes inside strings are escaped, so cutting the
    rightmost ``,"hash":"..."`` leaves exactly ``canonical(body)``. On any other
    line it is the hash of the line's bytes as they stand, which matches the
    stored hash only where whoever wrote it computed it over those bytes.
    """
    head, _, tail = line.rpartition(b',"hash":' + canonical(stored_hash))
    return hashlib.sha256(LEAF_PREFIX + head + tail).hexdigest()


def genesis_hash(log_id: str) -> str:
    """The ``prev`` of a log's first record."""
    return hashlib.sha256(GENESIS_DOMAIN + log_id.encode()).hexdigest()


def format_time(moment: datetime) -> str:
    """UTC time with microseconds, as stored: ``2026-12-02T12:58:24.123456Z``."""
    if moment.tzinfo is UTC:
        return moment.isoformat(timespec="microseconds")[:-6] + "Z"  # without "+00:00"
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(text: str) -> datetime:
    """Inverse of :func:`format_time`; naive input is taken as UTC."""
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audited act, with its place in the hash chain."""

    seq: int
    time: datetime
    log_id: str
    actor: str
    action: str
    resource: str
    tenant: str
    outcome: str
    peer: str
    details: Mapping[str, object] = field(default_factory=dict)
    prev: str = ""
    hash: str = ""

    def body(self) -> dict[str, object]:
        """The stored fields the chain hash covers."""
        return {
            "seq": self.seq,
            "time": format_time(self.time),
            "log": self.log_id,
            "actor": self.actor,
            "action": self.action,
            "resource": self.resource,
            "tenant": self.tenant,
            "outcome": self.outcome,
            "peer": self.peer,
            "details": dict(self.details),
            "prev": self.prev,
        }

    def to_line(self) -> bytes:
        """The record's line in a segment file, newline included."""
        return canonical({**self.body(), "hash": self.hash}) + b"\n"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view for reports and tools."""
        return {**self.body(), "hash": self.hash}

    @classmethod
    def from_stored(cls, stored: Mapping[str, object]) -> AuditRecord:
        """Build a record from a parsed segment line; raises :class:`AuditLogCorrupt` on a malformed one."""
        try:
            seq, details = stored["seq"], stored["details"]
            texts = {name: stored[name] for name in RECORD_FIELDS if name not in ("seq", "details")}
            texts["hash"] = stored["hash"]
        except KeyError as missing:
            raise AuditLogCorrupt(f"record lacks field {missing}") from None
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(details, dict):
            raise AuditLogCorrupt("record has a malformed seq or details field")
        strings = {name: value for name, value in texts.items() if isinstance(value, str)}
        if len(strings) != len(texts):
            raise AuditLogCorrupt("record has a non-string field")
        try:
            moment = parse_time(strings["time"])
        except ValueError:
            raise AuditLogCorrupt(f"record has a malformed time {texts['time']!r}") from None
        return cls(
            seq=seq,
            time=moment,
            log_id=strings["log"],
            actor=strings["actor"],
            action=strings["action"],
            resource=strings["resource"],
            tenant=strings["tenant"],
            outcome=strings["outcome"],
            peer=strings["peer"],
            details=details,
            prev=strings["prev"],
            hash=strings["hash"],
        )
