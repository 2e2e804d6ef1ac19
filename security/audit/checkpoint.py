"""Signed checkpoints: the audit key's statement that the chain reached a hash at a sequence number.

Checkpoints live in ``checkpoints.jsonl``, one canonical JSON line each, and
are themselves chained: ``prev`` is the SHA-256 of the previous checkpoint's
line, so one cannot be dropped, reordered or inserted unnoticed (as
CloudTrail chains its digest files). Checkpoint 0 is the genesis statement
(sequence 0, the log's genesis hash). A rotation checkpoint, signed with the
outgoing key, names the incoming key in ``next_key``, so trust flows from the
first key to every later one. ``within`` is the writer's promise that the next
checkpoint comes no more than that many records later (0 for the genesis,
since every writer signs on opening); a verifier finding more unsigned
records than the last checkpoint promised knows later checkpoints were removed.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import AuditLogCorrupt
from .keys import key_id, raw_public
from .record import canonical, format_time, parse_time

SIGNING_DOMAIN = b"cantata-audit-checkpoint/1\x00"
FIRST_PREV = ""


def line_hash(line: bytes) -> str:
    """The hash the next checkpoint's ``prev`` must carry (``line`` without its newline)."""
    return hashlib.sha256(line).hexdigest()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed (sequence, chain hash) statement."""

    index: int
    seq: int
    hash: str
    time: datetime
    log_id: str
    key_id: str
    prev: str
    within: int
    next_key: Ed25519PublicKey | None
    signature: bytes

    def body(self) -> dict[str, object]:
        """The fields the signature covers."""
        body: dict[str, object] = {
            "n": self.index,
            "seq": self.seq,
            "hash": self.hash,
            "time": format_time(self.time),
            "log": self.log_id,
            "key": self.key_id,
            "prev": self.prev,
            "within": self.within,
        }
        if self.next_key is not None:
            body["next_key"] = base64.b64encode(raw_public(self.next_key)).decode()
        return body

    def to_line(self) -> bytes:
        """The checkpoint's line, without the newline."""
        return canonical({**self.body(), "sig": base64.b64encode(self.signature).decode()})

    def signature_valid(self, public_key: Ed25519PublicKey) -> bool:
        try:
            public_key.verify(self.signature, SIGNING_DOMAIN + canonical(self.body()))
        except InvalidSignature:
            return False
        return True

    @classmethod
    def sign(
        cls,
        private_key: Ed25519PrivateKey,
        *,
        index: int,
        seq: int,
        chain_hash: str,
        time: datetime,
        log_id: str,
        prev: str,
        within: int,
        next_key: Ed25519PublicKey | None = None,
    ) -> Checkpoint:
        unsigned = cls(
            index=index,
            seq=seq,
            hash=chain_hash,
            time=time,
            log_id=log_id,
            key_id=key_id(private_key.public_key()),
            prev=prev,
            within=within,
            next_key=next_key,
            signature=b"",
        )
        signature = private_key.sign(SIGNING_DOMAIN + canonical(unsigned.body()))
        return cls(**{**{name: getattr(unsigned, name) for name in cls.__slots__}, "signature": signature})

    @classmethod
    def from_stored(cls, stored: Mapping[str, object]) -> Checkpoint:
        """Parse a checkpoint line's JSON; raises :class:`AuditLogCorrupt` when malformed."""
        try:
            numbers = (stored["n"], stored["seq"], stored["within"])
            texts = {name: stored[name] for name in ("hash", "time", "log", "key", "prev", "sig")}
            encoded_next = stored.get("next_key")
            integers = [v for v in numbers if isinstance(v, int) and not isinstance(v, bool)]
            if len(integers) != len(numbers):
                raise TypeError("n, seq and within must be integers")
            index, seq, within = integers
            strings = {name: value for name, value in texts.items() if isinstance(value, str)}
            if len(strings) != len(texts) or not isinstance(encoded_next, str | None):
                raise TypeError("text fields must be strings")
            next_key = (
                Ed25519PublicKey.from_public_bytes(base64.b64decode(encoded_next, validate=True))
                if encoded_next is not None
                else None
            )
            return cls(
                index=index,
                seq=seq,
                hash=strings["hash"],
                time=parse_time(strings["time"]),
                log_id=strings["log"],
                key_id=strings["key"],
                prev=strings["prev"],
                within=within,
                next_key=next_key,
                signature=base64.b64decode(strings["sig"], validate=True),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditLogCorrupt(f"malformed checkpoint: {exc}") from None
