"""Tenants' data sources: named S3 / Azure Blob credentials, sealed under the tenant's key.

The sources live in their own table of the server's one database
(:class:`~cantata.server.database.Database`), beside the main store.
Each row's secrets (the credential fields and the optional dataset key) are
one AES-256-GCM ciphertext under a fresh data key, stored as
``envelope || nonce || ciphertext``: the envelope is the data key wrapped by
the tenant's key-encryption key (``keyring.data_source_keys(tenant)``, see
:mod:`cantata.security.keys`), and the associated data binds tenant, name,
kind and endpoint, so a row copied to another tenant or source does not
open. Key rotation re-wraps the envelopes only (:meth:`DataSourceStore.rewrap`).
Names are scoped to their tenant: another tenant's source is simply not
found. Secrets leave this module only as a worker's credentials document
(``SourceCredentials.to_json()`` in :mod:`cantata.trainer.data.sources`) and
the dataset key document (``DatasetKey.to_json()``).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cantata.proto.datasource_rules import credentials_problem, dataset_key_problem
from cantata.security.keys import ENVELOPE_SIZE, KeyProvider, envelope_key_version
from cantata.security.stream_aead import DATA_KEY_SIZE, IntegrityError
from cantata.server.database import Database
from cantata.server.store.base import Repository

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
NONCE_SIZE = 12


class DataSourceError(Exception):
    """A data-source operation failed."""


class InvalidDataSource(DataSourceError, ValueError):
    """A field of a data source is missing or malformed (the message names it)."""


class DataSourceNotFound(DataSourceError, LookupError):
    """The tenant has no data source of that name."""


class DataSourceExists(DataSourceError):
    """The tenant already has a data source of that name."""


class SealedSecretsError(DataSourceError):
    """Stored secrets do not open: a key retired or from another keyring, or a modified or moved row."""


@dataclass(frozen=True)
class DataSourceSpec:
    """A validated registration: what the tenant sent, secrets included.

    The credentials and the dataset key are checked by :mod:`cantata.proto.datasource_rules`, as the SDK
    checks them; the name and the endpoint here.
    """

    name: str
    kind: str
    endpoint: str
    secrets: dict[str, str] = field(repr=False)
    dataset_key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise InvalidDataSource("name: 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit")
        refused = credentials_problem(self.kind, self.secrets)
        if refused:
            raise InvalidDataSource(refused)
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.query:
                raise InvalidDataSource("endpoint: an http(s) URL without user part or query")
        if self.kind == "az" and not self.secrets.get("connection_string") and not self.endpoint:
            raise InvalidDataSource("endpoint: the account URL is required without a connection string")
        refused = dataset_key_problem(self.dataset_key)
        if refused:
            raise InvalidDataSource(refused)


@dataclass(frozen=True)
class DataSourceRecord:
    """A stored data source as anyone may see it: no secrets."""

    tenant: str
    name: str
    kind: str
    endpoint: str
    has_dataset_key: bool
    created_at: str


class DataSourceStore(Repository):
    """Data sources on the server's database, secrets sealed under each tenant's key in ``keyring``.

    Given a path rather than the server's :class:`Database`, it opens a database of its own.
    """

    tables = frozenset({"data_sources"})

    def __init__(self, database: Database | Path, keyring: KeyProvider) -> None:
        self._keyring = keyring
        super().__init__(database if isinstance(database, Database) else Database(database))
        self._db = self.database.connection
        self._lock = self.database.lock

    def close(self) -> None:
        """Close the database (shared with every other store on it)."""
        self.database.close()

    # ---- sealing -------------------------------------------------------
    @staticmethod
    def _aad(tenant: str, name: str, kind: str, endpoint: str) -> bytes:
        return json.dumps([tenant, name, kind, endpoint]).encode()

    def _seal(self, tenant: str, spec: DataSourceSpec) -> bytes:
        document = {
            "secrets": spec.secrets,
            "dataset_key": base64.b64encode(spec.dataset_key).decode() if spec.dataset_key else None,
        }
        data_key, nonce = os.urandom(DATA_KEY_SIZE), os.urandom(NONCE_SIZE)
        envelope = self._keyring.data_source_keys(tenant).current.wrap(data_key)
        aad = self._aad(tenant, spec.name, spec.kind, spec.endpoint)
        return envelope + nonce + AESGCM(data_key).encrypt(nonce, json.dumps(document).encode(), aad)

    def _open(self, tenant: str, name: str, kind: str, endpoint: str, sealed: bytes) -> dict:
        envelope, rest = sealed[:ENVELOPE_SIZE], sealed[ENVELOPE_SIZE:]
        try:
            data_key = self._keyring.data_source_keys(tenant).unwrap(envelope)
            plaintext = AESGCM(data_key).decrypt(
                rest[:NONCE_SIZE], rest[NONCE_SIZE:], self._aad(tenant, name, kind, endpoint)
            )
        except IntegrityError as error:
            raise SealedSecretsError(f"secrets of data source {name!r} do not decrypt: {error}") from None
        except InvalidTag:
            raise SealedSecretsError(
                f"secrets of data source {name!r} do not decrypt: the row was modified or belongs to another source"
            ) from None
        return json.loads(plaintext)

    def rewrap(self, tenant: str) -> int:
        """Re-wrap every data key of the tenant's sources under its current KEK; return how many changed."""
        keys = self._keyring.data_source_keys(tenant)
        changed = 0
        with self.database.transaction() as db:
            rows = db.execute("SELECT name, sealed FROM data_sources WHERE tenant = ?", (tenant,)).fetchall()
            for name, sealed in rows:
                envelope = sealed[:ENVELOPE_SIZE]
                try:
                    if envelope_key_version(envelope) == keys.current.version:
                        continue
                    rewrapped = keys.current.wrap(keys.unwrap(envelope))
                except IntegrityError as error:
                    raise SealedSecretsError(f"secrets of data source {name!r} do not decrypt: {error}") from None
                db.execute(
                    "UPDATE data_sources SET sealed = ? WHERE tenant = ? AND name = ?",
                    (rewrapped + sealed[ENVELOPE_SIZE:], tenant, name),
                )
                changed += 1
        return changed

    def key_versions_in_use(self, tenant: str) -> set[int]:
        """The KEK versions that wrap the data keys of the tenant's sources."""
        with self._lock:
            rows = self._db.execute("SELECT sealed FROM data_sources WHERE tenant = ?", (tenant,)).fetchall()
        return {envelope_key_version(sealed[:ENVELOPE_SIZE]) for (sealed,) in rows}

    # ---- operations ----------------------------------------------------
    def register(self, tenant: str, spec: DataSourceSpec, *, replace: bool = False) -> DataSourceRecord:
        record = DataSourceRecord(
            tenant,
            spec.name,
            spec.kind,
            spec.endpoint,
            spec.dataset_key is not None,
            dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        with self._lock:
            try:
                self._db.execute(
                    f"{verb} INTO data_sources (tenant, name, kind, endpoint, has_dataset_key, sealed, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        tenant,
                        spec.name,
                        spec.kind,
                        spec.endpoint,
                        int(record.has_dataset_key),
                        self._seal(tenant, spec),
                        record.created_at,
                    ),
                )
            except sqlite3.IntegrityError:
                raise DataSourceExists(f"data source {spec.name!r} already exists") from None
        return record

    def sources(self, tenant: str) -> list[DataSourceRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT tenant, name, kind, endpoint, has_dataset_key, created_at FROM data_sources "
                "WHERE tenant = ? ORDER BY name",
                (tenant,),
            ).fetchall()
        return [DataSourceRecord(t, n, k, e, bool(h), c) for t, n, k, e, h, c in rows]

    def exists(self, tenant: str, name: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM data_sources WHERE tenant = ? AND name = ?", (tenant, name))
            return row.fetchone() is not None

    def delete(self, tenant: str, name: str) -> None:
        with self._lock:
            deleted = self._db.execute("DELETE FROM data_sources WHERE tenant = ? AND name = ?", (tenant, name))
        if deleted.rowcount == 0:
            raise DataSourceNotFound(f"data source {name!r} not found")

    def _secrets(self, tenant: str, name: str) -> tuple[DataSourceRecord, dict]:
        with self._lock:
            row = self._db.execute(
                "SELECT kind, endpoint, has_dataset_key, sealed, created_at FROM data_sources "
                "WHERE tenant = ? AND name = ?",
                (tenant, name),
            ).fetchone()
        if row is None:
            raise DataSourceNotFound(f"data source {name!r} not found")
        kind, endpoint, has_key, sealed, created_at = row
        return (
            DataSourceRecord(tenant, name, kind, endpoint, bool(has_key), created_at),
            self._open(tenant, name, kind, endpoint, sealed),
        )

    def worker_credentials(self, tenant: str, name: str) -> dict[str, Any]:
        """The credentials document a job's worker gets (what ``SourceCredentials.from_dict`` reads)."""
        record, document = self._secrets(tenant, name)
        return {"name": name, "kind": record.kind, "endpoint": record.endpoint, "secrets": document["secrets"]}

    def worker_dataset_key(self, tenant: str, name: str) -> dict[str, str] | None:
        """The tenant's dataset key registered with the source (what ``DatasetKey.from_dict`` reads), if any."""
        _, document = self._secrets(tenant, name)
        if document["dataset_key"] is None:
            return None
        return {"tenant": tenant, "key": document["dataset_key"]}
