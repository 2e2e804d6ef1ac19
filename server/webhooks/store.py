"""Tenants' webhook endpoints and the outbox of their deliveries, on the server's database.

An endpoint's signing secret is generated here, returned once, and stored
sealed like a data source's secrets (:mod:`cantata.server.datasource_store`):
AES-256-GCM under a fresh data key wrapped by the tenant's key-encryption key
(``keyring.webhook_keys``), the associated data binding tenant, endpoint id and
URL. Ids are looked up within the caller's tenant: another tenant's endpoint is
not found, like a missing one.

:meth:`WebhookStore.enqueue` runs inside the transaction that writes a job
event (the store's ``on_event`` hook), so a delivery exists exactly when its
event does and survives a restart. Each endpoint holds at most ``max_pending``
pending deliveries: a delivery beyond that is recorded dead at once ("queue
full"), where the tenant sees it. The deliverer (:mod:`cantata.server.webhooks.delivery`)
takes due deliveries and records every attempt.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cantata.proto.v1 import jobs_pb2
from cantata.security.keys import ENVELOPE_SIZE, KeyProvider, envelope_key_version
from cantata.security.stream_aead import DATA_KEY_SIZE, IntegrityError
from cantata.server.database import Database
from cantata.server.store import NotFound, QuotaExceeded
from cantata.server.store.base import Repository
from cantata.server.webhooks.events import EVENT_TYPES, body, event_id, event_type
from cantata.server.webhooks.targets import InvalidWebhook, parse_url

NONCE_SIZE = 12
MAX_DESCRIPTION = 200
STATES = ("pending", "delivered", "dead")


class SealedSecretError(Exception):
    """A stored signing secret does not open: a retired or foreign key, or a modified or moved row."""


@dataclass(frozen=True)
class WebhookRecord:
    """An endpoint as its tenant may see it: no secret."""

    id: str
    tenant: str
    url: str
    event_types: tuple[str, ...]  # empty: every type
    description: str
    created_at: str


@dataclass(frozen=True)
class DeliveryRecord:
    id: int
    webhook_id: str
    event_id: str
    event_type: str
    job_id: str
    state: str
    attempts: int
    last_status: int
    last_error: str
    created_at: str
    next_attempt_at: float


@dataclass(frozen=True)
class DueDelivery:
    """A pending delivery that is due, with what its attempt needs."""

    id: int
    webhook_id: str
    tenant: str
    url: str
    event_id: str
    event_type: str
    body: bytes
    attempts: int
    secret: str = field(repr=False)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def check_event_types(types: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(types))
    unknown = [t for t in chosen if t not in EVENT_TYPES]
    if unknown:
        raise InvalidWebhook(f"event_types: unknown {unknown}; known: {', '.join(EVENT_TYPES)}")
    return chosen


class WebhookStore(Repository):
    """Endpoints (secrets sealed under each tenant's key in ``keyring``) and their deliveries."""

    tables = frozenset({"webhook_endpoints", "webhook_deliveries", "webhook_attempts"})
    reads = frozenset({"jobs"})  # an event's job's tenant

    def __init__(
        self, database: Database, keyring: KeyProvider, *, max_endpoints: int = 10, max_pending: int = 1000
    ) -> None:
        super().__init__(database)
        self._keyring = keyring
        self._max_endpoints = max_endpoints
        self._max_pending = max_pending
        self.on_enqueued: Callable[[], None] = lambda: None  # the deliverer's wake-up, after the commit

    # ---- sealing -------------------------------------------------------
    @staticmethod
    def _aad(tenant: str, webhook_id: str, url: str) -> bytes:
        return json.dumps(["webhook", tenant, webhook_id, url]).encode()

    def _seal(self, tenant: str, webhook_id: str, url: str, secret: str) -> bytes:
        data_key, nonce = os.urandom(DATA_KEY_SIZE), os.urandom(NONCE_SIZE)
        envelope = self._keyring.webhook_keys(tenant).current.wrap(data_key)
        return envelope + nonce + AESGCM(data_key).encrypt(nonce, secret.encode(), self._aad(tenant, webhook_id, url))

    def _open(self, tenant: str, webhook_id: str, url: str, sealed: bytes) -> str:
        envelope, rest = sealed[:ENVELOPE_SIZE], sealed[ENVELOPE_SIZE:]
        try:
            data_key = self._keyring.webhook_keys(tenant).unwrap(envelope)
            return (
                AESGCM(data_key)
                .decrypt(rest[:NONCE_SIZE], rest[NONCE_SIZE:], self._aad(tenant, webhook_id, url))
                .decode()
            )
        except (IntegrityError, InvalidTag):
            raise SealedSecretError(f"the signing secret of webhook {webhook_id} does not decrypt") from None

    def rewrap(self, tenant: str) -> int:
        """Re-wrap the data keys of the tenant's secrets under its current KEK; return how many changed."""
        keys = self._keyring.webhook_keys(tenant)
        changed = 0
        with self.database.transaction() as db:
            rows = db.execute("SELECT id, sealed FROM webhook_endpoints WHERE tenant = ?", (tenant,)).fetchall()
            for webhook_id, sealed in rows:
                envelope = sealed[:ENVELOPE_SIZE]
                if envelope_key_version(envelope) == keys.current.version:
                    continue
                try:
                    rewrapped = keys.current.wrap(keys.unwrap(envelope))
                except IntegrityError:
                    raise SealedSecretError(f"the signing secret of webhook {webhook_id} does not decrypt") from None
                db.execute(
                    "UPDATE webhook_endpoints SET sealed = ? WHERE id = ?",
                    (rewrapped + sealed[ENVELOPE_SIZE:], webhook_id),
                )
                changed += 1
        return changed

    def key_versions_in_use(self, tenant: str) -> set[int]:
        """The KEK versions that wrap the data keys of the tenant's secrets."""
        with self.database.read() as db:
            rows = db.execute("SELECT sealed FROM webhook_endpoints WHERE tenant = ?", (tenant,)).fetchall()
        return {envelope_key_version(sealed[:ENVELOPE_SIZE]) for (sealed,) in rows}

    # ---- endpoints -----------------------------------------------------
    def add(
        self, tenant: str, url: str, event_types: Iterable[str] = (), description: str = ""
    ) -> tuple[WebhookRecord, str]:
        """Register an endpoint (``url`` checked by the caller's policy); returns it and its new secret."""
        parse_url(url)
        types = check_event_types(event_types)
        if len(description) > MAX_DESCRIPTION:
            raise InvalidWebhook(f"description: longer than {MAX_DESCRIPTION} characters")
        record = WebhookRecord(f"wh_{secrets.token_hex(8)}", tenant, url, types, description, _now())
        secret = f"whsec_{secrets.token_urlsafe(32)}"
        with self.database.transaction() as db:
            used = db.execute("SELECT COUNT(*) FROM webhook_endpoints WHERE tenant = ?", (tenant,)).fetchone()[0]
            if used >= self._max_endpoints:
                raise QuotaExceeded("webhook endpoints", self._max_endpoints, used)
            db.execute(
                "INSERT INTO webhook_endpoints (id, tenant, url, event_types, description, sealed, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    tenant,
                    url,
                    json.dumps(types),
                    description,
                    self._seal(tenant, record.id, url, secret),
                    record.created_at,
                ),
            )
        return record, secret

    def endpoints(self, tenant: str) -> list[WebhookRecord]:
        with self.database.read() as db:
            rows = db.execute(
                "SELECT id, url, event_types, description, created_at FROM webhook_endpoints "
                "WHERE tenant = ? ORDER BY created_at, id",
                (tenant,),
            ).fetchall()
        return [WebhookRecord(i, tenant, u, tuple(json.loads(t)), d, c) for i, u, t, d, c in rows]

    def remove(self, tenant: str, webhook_id: str) -> WebhookRecord:
        """Delete the tenant's endpoint and its deliveries still pending; NotFound if it has none of that id."""
        with self.database.transaction() as db:
            row = db.execute(
                "SELECT url, event_types, description, created_at FROM webhook_endpoints WHERE tenant = ? AND id = ?",
                (tenant, webhook_id),
            ).fetchone()
            if row is None:
                raise NotFound(f"webhook {webhook_id!r} not found")
            db.execute("DELETE FROM webhook_endpoints WHERE id = ?", (webhook_id,))
            db.execute("DELETE FROM webhook_deliveries WHERE endpoint_id = ? AND state = 'pending'", (webhook_id,))
        url, types, description, created_at = row
        return WebhookRecord(webhook_id, tenant, url, tuple(json.loads(types)), description, created_at)

    # ---- deliveries ----------------------------------------------------
    def enqueue(self, db: sqlite3.Connection, job_id: str, event: jobs_pb2.JobEvent) -> None:
        """Queue ``event`` for each endpoint of the job's tenant that wants it (inside the event's transaction)."""
        kind = event_type(event)
        if kind is None:
            return
        row = db.execute("SELECT tenant FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            return
        tenant = row[0]
        endpoints = db.execute("SELECT id, event_types FROM webhook_endpoints WHERE tenant = ?", (tenant,)).fetchall()
        wanted = [webhook_id for webhook_id, types in endpoints if kind in (json.loads(types) or EVENT_TYPES)]
        if not wanted:
            return
        document, now, created = body(kind, job_id, tenant, event), _now(), event.time.ToDatetime().timestamp()
        for webhook_id in wanted:
            pending = db.execute(
                "SELECT COUNT(*) FROM webhook_deliveries WHERE endpoint_id = ? AND state = 'pending'", (webhook_id,)
            ).fetchone()[0]
            state, error = ("pending", "") if pending < self._max_pending else ("dead", "queue full")
            db.execute(
                "INSERT INTO webhook_deliveries (endpoint_id, tenant, event_id, event_type, job_id, body, state, "
                "next_attempt_at, last_error, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (webhook_id, tenant, event_id(job_id, event.seq), kind, job_id, document, state, created, error, now),
            )
        self.database.after_commit(self.on_enqueued)

    def due(self, now: float, limit: int, busy: Iterable[int] = ()) -> list[DueDelivery]:
        """Up to ``limit`` pending deliveries due by ``now``, oldest first, none of ``busy``, with their secrets."""
        busy = set(busy)
        with self.database.read() as db:
            rows = db.execute(
                "SELECT d.id, d.endpoint_id, d.tenant, e.url, d.event_id, d.event_type, d.body, d.attempts, e.sealed "
                "FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id "
                "WHERE d.state = 'pending' AND d.next_attempt_at <= ? ORDER BY d.next_attempt_at, d.id LIMIT ?",
                (now, limit + len(busy)),
            ).fetchall()
        found: list[DueDelivery] = []
        for i, w, t, u, e, k, b, a, s in rows:
            if i in busy or len(found) == limit:
                continue
            try:
                found.append(DueDelivery(i, w, t, u, e, k, b, a, self._open(t, w, u, s)))
            except SealedSecretError as error:  # it can never be signed: dead, not retried for ever
                with self.database.transaction() as db:
                    db.execute(
                        "UPDATE webhook_deliveries SET state = 'dead', last_error = ? WHERE id = ?", (str(error), i)
                    )
        return found

    def next_due(self, busy: Iterable[int] = ()) -> float | None:
        """When the next pending delivery not in ``busy`` is due (a UNIX time), or None."""
        busy = tuple(busy)
        marks = ",".join("?" * len(busy))
        with self.database.read() as db:
            row = db.execute(
                "SELECT MIN(next_attempt_at) FROM webhook_deliveries WHERE state = 'pending'"
                + (f" AND id NOT IN ({marks})" if busy else ""),
                busy,
            ).fetchone()
        return row[0]

    def record_attempt(
        self, delivery_id: int, attempt: int, *, status: int, error: str, seconds: float, retry_at: float | None
    ) -> str:
        """Record an attempt and its outcome: delivered (no error), retried at ``retry_at``, else dead.

        Returns the delivery's new state.
        """
        state = "delivered" if not error else "pending" if retry_at is not None else "dead"
        with self.database.transaction() as db:
            db.execute(
                "INSERT INTO webhook_attempts (delivery_id, attempt, at, status, error, seconds) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (delivery_id, attempt, _now(), status, error, seconds),
            )
            db.execute(
                "UPDATE webhook_deliveries SET state = ?, attempts = ?, last_status = ?, last_error = ?, "
                "next_attempt_at = COALESCE(?, next_attempt_at) WHERE id = ? AND state = 'pending'",
                (state, attempt, status, error, retry_at, delivery_id),
            )
        return state

    def deliveries(self, tenant: str, webhook_id: str = "", state: str = "", limit: int = 100) -> list[DeliveryRecord]:
        """The tenant's deliveries, newest first (of one endpoint, in one state, when given)."""
        if state and state not in STATES:
            raise InvalidWebhook(f"state: one of {', '.join(STATES)}")
        where, args = ["tenant = ?"], [tenant]
        if webhook_id:
            where.append("endpoint_id = ?")
            args.append(webhook_id)
        if state:
            where.append("state = ?")
            args.append(state)
        with self.database.read() as db:
            rows = db.execute(
                "SELECT id, endpoint_id, event_id, event_type, job_id, state, attempts, last_status, last_error, "
                f"created_at, next_attempt_at FROM webhook_deliveries WHERE {' AND '.join(where)} "
                "ORDER BY id DESC LIMIT ?",
                (*args, max(1, min(limit, 1000))),
            ).fetchall()
        return [DeliveryRecord(*row) for row in rows]
