"""The audit report: a verification verdict, then what happened, per tenant and period."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .actions import ANOMALY_ACTIONS, DENIAL_ACTIONS, Action, Outcome
from .record import AuditRecord
from .segments import read_records
from .verify import VerifyResult, verify

PLATFORM = "(platform)"
MAX_BUCKETS = 60
_BUCKET_SIZES = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(hours=1),
    timedelta(hours=6),
    timedelta(days=1),
    timedelta(days=7),
    timedelta(days=30),
)


@dataclass(frozen=True)
class TimelineBucket:
    """Activity in ``[start, start + width)``."""

    start: datetime
    records: int
    refusals: int


@dataclass(frozen=True)
class Report:
    """Everything a report shows; render it with :func:`render_report`."""

    verification: VerifyResult
    generated: datetime
    tenant: str | None
    since: datetime | None
    until: datetime | None
    total: int
    first_time: datetime | None
    last_time: datetime | None
    by_tenant: dict[str, int]
    by_action: dict[str, int]
    by_tenant_action: dict[str, dict[str, int]]
    bucket_width: timedelta
    timeline: tuple[TimelineBucket, ...]
    refusals: tuple[AuditRecord, ...]
    anomalies: tuple[AuditRecord, ...]
    approvals: tuple[AuditRecord, ...]

    @property
    def scope(self) -> str:
        """Who and which period the report covers, in words."""
        who = f"tenant {self.tenant}" if self.tenant is not None else "all tenants"
        start = f"{self.since:%Y-%m-%dT%H:%M:%SZ}" if self.since else "the beginning"
        end = f"{self.until:%Y-%m-%dT%H:%M:%SZ}" if self.until else "now"
        return f"{who}, from {start} to {end}"


def _is_refusal(record: AuditRecord) -> bool:
    return record.action in DENIAL_ACTIONS or record.outcome in (Outcome.DENIED, Outcome.REFUSED)


def _bucket_width(first: datetime, last: datetime) -> timedelta:
    span = last - first
    return next((size for size in _BUCKET_SIZES if span / size < MAX_BUCKETS), _BUCKET_SIZES[-1])


def _timeline(records: list[AuditRecord]) -> tuple[timedelta, tuple[TimelineBucket, ...]]:
    if not records:
        return _BUCKET_SIZES[0], ()
    width = _bucket_width(records[0].time, records[-1].time)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def bucket_of(record: AuditRecord) -> int:
        return (record.time - epoch) // width

    counts = Counter(bucket_of(r) for r in records)
    refusals = Counter(bucket_of(r) for r in records if _is_refusal(r))
    first, last = min(counts), max(counts)
    return width, tuple(
        TimelineBucket(epoch + index * width, counts[index], refusals[index]) for index in range(first, last + 1)
    )


def build_report(
    directory: Path,
    *,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    public_keys: Mapping[str, Ed25519PublicKey] | None = None,
    anchored: Iterable[bytes] = (),
) -> Report:
    """Verify the log in ``directory`` (see :func:`verify` for ``public_keys`` and ``anchored``), then
    summarise the records of ``tenant`` (all tenants when ``None``) with times in ``[since, until)``."""
    verification = verify(directory, public_keys=public_keys, anchored=anchored)
    records = sorted(read_records(directory, tenant=tenant, since=since, until=until), key=lambda r: r.seq)
    per_tenant_action: dict[str, Counter[str]] = {}
    for record in records:
        per_tenant_action.setdefault(record.tenant or PLATFORM, Counter())[record.action] += 1
    width, timeline = _timeline(sorted(records, key=lambda r: r.time))
    return Report(
        verification=verification,
        generated=datetime.now(UTC),
        tenant=tenant,
        since=since,
        until=until,
        total=len(records),
        first_time=min((r.time for r in records), default=None),
        last_time=max((r.time for r in records), default=None),
        by_tenant={name: sum(counts.values()) for name, counts in sorted(per_tenant_action.items())},
        by_action=dict(Counter(r.action for r in records).most_common()),
        by_tenant_action={name: dict(counts.most_common()) for name, counts in sorted(per_tenant_action.items())},
        bucket_width=width,
        timeline=timeline,
        refusals=tuple(r for r in records if _is_refusal(r)),
        anomalies=tuple(r for r in records if r.action in ANOMALY_ACTIONS),
        approvals=tuple(r for r in records if r.action == Action.TENANT_APPROVED and r.outcome == Outcome.OK),
    )
