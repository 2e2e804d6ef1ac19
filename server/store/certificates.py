"""Certificates the server issued: who holds each, what it was renewed from, and which are revoked."""

from __future__ import annotations

import datetime as dt
import sqlite3

from cantata.server.cache import Cache
from cantata.server.database import Database
from cantata.server.store.base import Repository
from cantata.server.store.errors import NotFound


class Certificates(Repository):
    """The issued certificates, by hex serial."""

    tables = frozenset({"certificates"})

    def __init__(self, database: Database):
        super().__init__(database)
        # What every call's gatekeeper asks, answered from memory; emptied whenever a commit changed the table.
        self._revoked = Cache[int, bool]()
        database.on_commit_changing("certificates", self._revoked.clear)

    def record(self, serial: int, principal: str, not_after: dt.datetime, *, renewed_from: str = "") -> None:
        """Record an issued certificate; ``renewed_from`` is the hex serial of the one whose renewal made it."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO certificates (serial, principal, not_after, renewed_from) VALUES (?,?,?,?)",
                (format(serial, "x"), principal, not_after.isoformat(), renewed_from),
            )

    def revoke(self, serial: str) -> str:
        """Refuse certificate ``serial`` (hex) and every certificate renewed from it, from now on; returns its principal.

        A renewal is only as trustworthy as the certificate that asked for it: a key stolen and
        renewed before the revocation must not outlive it.
        """
        with self._tx() as db:
            row = db.execute("SELECT principal FROM certificates WHERE serial=?", (serial.lower(),)).fetchone()
            if row is None:
                raise NotFound(f"no certificate with serial {serial}")
            db.executemany(
                "UPDATE certificates SET revoked=1 WHERE serial=?", [(s,) for s in self._lineage(db, serial.lower())]
            )
            return row["principal"]

    def renewals_of(self, serial: str) -> list[str]:
        """The hex serials renewed from ``serial``, directly or through other renewals, oldest first."""
        with self.database.read() as db:
            return self._lineage(db, serial.lower())[1:]

    def _lineage(self, db: sqlite3.Connection, serial: str) -> list[str]:
        """``serial`` and every certificate renewed from it, directly or not."""
        rows = db.execute(
            "WITH RECURSIVE lineage(serial) AS (SELECT ? UNION "
            "SELECT c.serial FROM certificates c JOIN lineage l ON c.renewed_from = l.serial) "
            "SELECT l.serial FROM lineage l LEFT JOIN certificates c ON c.serial = l.serial ORDER BY c.rowid",
            (serial,),
        )
        return [r[0] for r in rows]

    def current(self, principal: str) -> tuple[str, str] | None:
        """(serial, not_after) of the newest unrevoked certificate issued to ``principal``."""
        with self.database.read() as db:
            row = db.execute(
                "SELECT serial, not_after FROM certificates WHERE principal=? AND revoked=0 "
                "ORDER BY rowid DESC LIMIT 1",
                (principal,),
            ).fetchone()
            return (row["serial"], row["not_after"]) if row else None

    def is_revoked(self, serial: int) -> bool:
        """Whether certificate ``serial`` was revoked (from memory after the first ask)."""
        return self._revoked.get(serial, self._load_revoked)

    def _load_revoked(self, serial: int) -> bool:
        with self.database.read() as db:
            row = db.execute("SELECT revoked FROM certificates WHERE serial=?", (format(serial, "x"),)).fetchone()
        return bool(row and row["revoked"])
