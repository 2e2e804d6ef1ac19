"""Bounds on what a caller without a certificate can cost the platform.

Enrollment is open to anyone who reaches the enrollment port, so everything it
lets an anonymous caller do is bounded:

- **Pending requests**: at most ``max_pending`` in all and ``max_pending_per_address``
  from one source address (checked in the transaction that stores a new one).
- **Rate**: each source address has a token bucket (``burst`` calls, refilled
  at ``rate_per_minute``) that every enrollment call (``RequestTenancy``,
  ``GetTenancyStatus``) spends from.
- **Expiry**: a request still pending after ``pending_ttl_hours`` is deleted
  (audited as ``tenancy_expired``), so a squatted name is free again.
- **Refusal records**: :class:`RefusalDigest` counts anonymous refusals instead
  of writing one record each: per (source address, action, reason) and
  window, the first refusal is recorded at once and the rest as one record
  with their count when the window closes. Every refusal is counted, and the
  log grows by at most two records per key and window.

A source address is the caller's IP address without its port; an IPv6
address counts by its /64 network (what one host is usually given). Going
over a limit is :class:`EnrollmentLimited` (``RESOURCE_EXHAUSTED``, reason
``ENROLLMENT_LIMITED``, with which limit and when to retry).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from cantata.security.audit import AuditLogUnavailable, Outcome
from cantata.server.jobs.admission import source_group

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
MAX_TRACKED = 65_536  # source addresses with a bucket, or keys with an open refusal window, held at once
MAX_LISTED_RESOURCES = 16  # methods named in one counted refusal record


class EnrollmentLimited(Exception):
    """An enrollment call over one of the limits: ``what`` names it, ``retry_after_s`` says when to try again."""

    def __init__(self, what: str, limit: float, retry_after_s: float):
        super().__init__(f"enrollment limit reached: {what} (limit {limit:g}); retry in {retry_after_s:.0f} s")
        self.what, self.limit, self.retry_after_s = what, limit, retry_after_s


@dataclass(frozen=True)
class EnrollmentLimits:
    """The limits, as ``server.json`` sets them (see ``ServerSettings``)."""

    max_pending: int = 100
    max_pending_per_address: int = 3
    rate_per_minute: float = 10.0
    burst: int = 10
    pending_ttl_hours: float = 72.0
    refusal_window_s: float = 60.0

    def admit_pending(self, pending: int, from_source: int) -> None:
        """Refuse one more pending request when ``pending`` (in all) or ``from_source`` is at its cap."""
        retry = self.pending_ttl_hours * 3600
        if from_source >= self.max_pending_per_address:
            raise EnrollmentLimited("pending requests from this address", self.max_pending_per_address, retry)
        if pending >= self.max_pending:
            raise EnrollmentLimited("pending requests", self.max_pending, retry)

    def expired_before(self, now: dt.datetime) -> dt.datetime:
        """Requests made before this time have expired."""
        return now - dt.timedelta(hours=self.pending_ttl_hours)


def source_address(peer: str) -> str:
    """The address a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) is counted under."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    return source_group(rest.rpartition(":")[0])


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per source address; the least recently used buckets are forgotten past ``MAX_TRACKED``."""

    def __init__(self, rate_per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._rate = rate_per_minute / 60.0
        self._burst = float(burst)
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, source: str) -> None:
        """Spend one token of ``source``'s bucket, or raise :class:`EnrollmentLimited`."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.pop(source, None) or _Bucket(self._burst, now)
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
            bucket.at = now
            self._buckets[source] = bucket
            if len(self._buckets) > MAX_TRACKED:
                self._buckets.popitem(last=False)
            if bucket.tokens < 1.0:
                wait = (1.0 - bucket.tokens) / self._rate if self._rate > 0 else float("inf")
                raise EnrollmentLimited("requests per minute from this address", self._rate * 60, wait)
            bucket.tokens -= 1.0


@dataclass
class _Window:
    start: float
    first: str
    last: str
    actor: str
    tenant: str
    outcome: str
    count: int = 0  # refusals after the first, not yet recorded
    resources: set[str] = field(default_factory=set)


class RefusalDigest:
    """An audit sink that counts anonymous refusals per (source address, action, reason) and window.

    Records of an authenticated actor pass straight through: a certificate
    holder is accountable and revocable, so each of its refusals stays a
    record of its own, unless the caller marks one ``counted`` (a refusal a
    certificate holder can repeat cheaply, such as a login link past its
    limits), which is counted per (actor, action, reason) the same way.
    ``close()`` records every open window's count.
    """

    def __init__(
        self,
        append: Callable[..., object],
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._append = append
        self._window = window_s
        self._clock = clock
        self._open: dict[tuple[str, str, str], _Window] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._flusher = threading.Thread(target=self._run, name="refusal-digest", daemon=True)
        self._flusher.start()

    def append(
        self,
        actor: str,
        action: str,
        *,
        resource: str = "",
        tenant: str = "",
        outcome: str = Outcome.OK,
        details: dict | None = None,
        peer: str = "",
        counted: bool = False,
    ) -> object:
        if actor != ANONYMOUS and not counted:
            return self._append(
                actor, action, resource=resource, tenant=tenant, outcome=outcome, details=details, peer=peer
            )
        reason = str((details or {}).get("reason", ""))
        source = source_address(peer) if actor == ANONYMOUS else actor
        key = (source, str(action), reason)
        now, stamp = self._clock(), dt.datetime.now(dt.UTC).isoformat()
        with self._lock:
            self._flush_due(now)
            window = self._open.get(key)
            if window is None and len(self._open) >= MAX_TRACKED:
                key = ("*", str(action), reason)  # too many sources at once: count them together
                window = self._open.get(key)
            if window is not None:
                window.count += 1
                window.last = stamp
                if len(window.resources) < MAX_LISTED_RESOURCES:
                    window.resources.add(resource)
                return None
            self._open[key] = _Window(now, stamp, stamp, actor, tenant, str(outcome), resources={resource})
        return self._append(  # the first refusal of a window is recorded at once, as it happened
            actor,
            action,
            resource=resource,
            tenant=tenant,
            outcome=outcome,
            details={**(details or {}), "count": 1, "window_s": self._window},
            peer=peer,
        )

    def flush(self) -> None:
        """Record the counts of every open window now."""
        with self._lock:
            self._flush_due(float("inf"))

    def close(self) -> None:
        self._closed.set()
        self._flusher.join()
        self.flush()

    def _run(self) -> None:
        while not self._closed.wait(min(self._window, 1.0)):
            with self._lock:
                self._flush_due(self._clock())

    def _flush_due(self, now: float) -> None:
        """Close the windows older than the window length (all of them with ``now`` = inf); lock held."""
        due = [key for key, window in self._open.items() if now - window.start >= self._window]
        for key in due:
            window = self._open.pop(key)
            if window.count:
                self._record(key, window)

    def _record(self, key: tuple[str, str, str], window: _Window) -> None:
        source, action, reason = key
        details = {
            "reason": reason,
            "count": window.count,
            "repeated": True,  # these followed the window's first refusal, which has its own record
            "first": window.first,
            "last": window.last,
            "window_s": self._window,
            "resources": sorted(window.resources),
        }
        anonymous = window.actor == ANONYMOUS
        with contextlib.suppress(AuditLogUnavailable):  # logged by the audit log; the refusals stood regardless
            self._append(
                window.actor if source != "*" else ANONYMOUS,  # past MAX_TRACKED keys: counted together
                action,
                resource=sorted(window.resources)[0] if len(window.resources) == 1 else "*",
                tenant=window.tenant if source != "*" else "",
                outcome=window.outcome,
                details=details,
                peer=source if anonymous and source != "*" else "",
            )
