"""The audit log as the server's parts write to it: a record made while serving a call names the call's request id.

Every reply carries a request id (:mod:`cantata.server.auth` makes one per
call and sends it as a trailer and in error details); a record appended while
that call runs gets it as ``details.request_id``, so a security team can go
from what a client saw to what was recorded (``cantata audit events
--request-id``). Acts no call caused (the scheduler, retention) carry none.
Putting it in ``details`` leaves the record format, and so the verification
of logs written before it, unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from cantata.security.audit import REQUEST_ID_DETAIL, AuditEntry, AuditLog, AuditRecord
from cantata.server.database import Database

Observer = Callable[[Sequence[str], float, bool], None]  # (actions, seconds, written)


class RequestAudit:
    """:class:`AuditLog`'s writing methods, adding the current call's request id to each record's details.

    ``observe(actions, seconds, written)`` is told of every append (the server's Prometheus metrics).
    """

    def __init__(
        self, log: AuditLog, request_id: Callable[[], str], database: Database, observe: Observer | None = None
    ):
        self._log = log
        self._request_id = request_id
        self._database = database
        self._observe: Observer = observe or (lambda actions, seconds, written: None)

    def _details(self, details: dict | None) -> dict | None:
        rid = self._request_id()
        if not rid or (details and REQUEST_ID_DETAIL in details):
            return details
        return {**(details or {}), REQUEST_ID_DETAIL: rid}

    def append(
        self,
        actor: str,
        action: str,
        *,
        resource: str = "",
        tenant: str = "",
        outcome: str = "ok",
        details: dict | None = None,
        peer: str = "",
    ) -> AuditRecord:
        started, written = time.monotonic(), False
        try:
            record = self._log.append(
                actor,
                action,
                resource=resource,
                tenant=tenant,
                outcome=outcome,
                details=self._details(details),
                peer=peer,
            )
            written = True
            return record
        finally:
            self._observe((action,), time.monotonic() - started, written)

    def append_alongside_commit(
        self,
        actor: str,
        action: str,
        *,
        undo: Callable[[], None],
        resource: str = "",
        tenant: str = "",
        outcome: str = "ok",
        details: dict | None = None,
        peer: str = "",
    ) -> AuditRecord:
        """Write the record now; this thread's open transaction returns once it and the commit are both durable.

        The record's sync and the commit's run side by side (one sync's time), each shared with concurrent
        calls (group commit), and neither under the database's lock. If the record's sync fails, ``undo``
        reverses the commit and the transaction raises; a crash between the two is reconciled on start
        (:meth:`~cantata.server.store.Store.undo_unrecorded`), so no act stands without its record. Use it
        for the last step of a transaction's body: nothing in the body may act outside the database after it.
        """
        entry = AuditEntry(actor, action, resource, tenant, outcome, self._details(details), peer)
        started = time.monotonic()
        records, durable = self._log.write_all([entry])
        self._observe((action,), time.monotonic() - started, True)  # written; its sync runs beside the commit's
        self._database.alongside_commit(durable, undo)
        return records[0]

    def append_all(self, entries: Sequence[AuditEntry]) -> list[AuditRecord]:
        started, written = time.monotonic(), False
        try:
            records = self._log.append_all([dataclasses.replace(e, details=self._details(e.details)) for e in entries])
            written = True
            return records
        finally:
            self._observe([e.action for e in entries], time.monotonic() - started, written)

    def require_writable(self) -> None:
        self._log.require_writable()

    def probe(self) -> str | None:
        return self._log.probe()
