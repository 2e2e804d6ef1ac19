"""Key-encryption keys: the :class:`KeyProvider` interface and the local keyring.

Key hierarchy::

    master key (file or $CANTATA_MASTER_KEY)
      └ keyring file (AES-256-GCM; holds each tenant's versioned KEKs)
          └ job key = HKDF-SHA256(tenant KEK vN, info = tenant, job)     (JobKey)
              └ data key of each sealed object, wrapped with AES-256-GCM

The keyring file is one AES-GCM ciphertext under the master key, written
atomically with mode 0600: it never holds a key in plaintext, and any change
to it is detected when it is opened.

Handing keys to a worker: the server calls ``keyring.job_keys(tenant,
job_id)`` and writes ``JobKeys.to_json()`` into the worker's 0600 config
file; the worker rebuilds it with ``JobKeys.from_json`` and seals with
``job_keys.current``. The worker so holds only keys derived for its own job:
it can neither read the tenant's other jobs nor learn the tenant's KEK.

Data-source secrets: the server seals each tenant's stored data-source
credentials under ``keyring.data_source_keys(tenant)``, derived like a job
key but for a scope no job id can take, so no worker's job keys open them.

Rotation: ``rotate(tenant)`` adds a new KEK version that becomes current; the
server then re-wraps existing objects' data keys
(:func:`cantata.security.sealed_checkpoint.rewrap_checkpoints`, bodies
untouched, and the data-source rows) and retires the versions nothing uses any more
(:meth:`LocalKeyring.retire_unused`), which destroys their key material.

Only :class:`LocalKeyring` ships; cloud key services (AWS KMS, Azure Key
Vault) are meant to plug in behind :class:`KeyProvider`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import struct
import tempfile
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cantata.security.stream_aead import DATA_KEY_SIZE, IntegrityError

MASTER_KEY_ENV = "CANTATA_MASTER_KEY"
KEY_SIZE = 32
NONCE_SIZE = 12
ENVELOPE_SIZE = 4 + NONCE_SIZE + DATA_KEY_SIZE + 16
_KEYRING_MAGIC = b"CNKR\x01"
_JOB_KEY_INFO = b"cantata/job-kek/v1\x00"
_WRAP_LABEL = b"cantata/dek-wrap/v1\x00"
DATA_SOURCES_SCOPE = "@data-sources"  # job ids are "job-<hex>": none can derive this scope's keys
WEBHOOKS_SCOPE = "@webhooks"  # the same for the signing secrets of the tenant's webhook endpoints


class KeyringError(Exception):
    """A keyring operation failed."""


class MasterKeyError(KeyringError):
    """The master key is missing or not 32 base64-encoded bytes."""


class KeyringCorruptError(KeyringError):
    """The keyring file does not decrypt under the master key (wrong key or modified)."""


class UnknownTenantError(KeyringError, LookupError):
    """The tenant has no key-encryption key."""


class UnknownKeyVersionError(IntegrityError):
    """A data key is wrapped under a KEK version that is not available (retired or never issued)."""


class KeyUnwrapError(IntegrityError):
    """A wrapped data key is malformed or was not wrapped by this key."""


class MasterKey:
    """The 256-bit key that encrypts the keyring file."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_SIZE:
            raise MasterKeyError(f"the master key must be {KEY_SIZE} bytes, not {len(key)}")
        self._aead = AESGCM(key)

    @classmethod
    def parse(cls, text: str) -> MasterKey:
        """Decode the base64 text form used in key files and the environment."""
        try:
            return cls(base64.b64decode(text.strip(), validate=True))
        except binascii.Error:
            raise MasterKeyError("the master key is not valid base64") from None

    @classmethod
    def from_env(cls, variable: str = MASTER_KEY_ENV) -> MasterKey:
        text = os.environ.get(variable)
        if not text:
            raise MasterKeyError(f"${variable} is not set")
        return cls.parse(text)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> MasterKey:
        try:
            return cls.parse(Path(path).read_text())
        except FileNotFoundError:
            raise MasterKeyError(f"master key file {path} does not exist") from None

    @classmethod
    def create_file(cls, path: str | os.PathLike[str]) -> MasterKey:
        """Generate a master key into a new file with mode 0600."""
        key = os.urandom(KEY_SIZE)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(base64.b64encode(key).decode() + "\n")
        return cls(key)

    def seal(self, plaintext: bytes) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        return _KEYRING_MAGIC + nonce + self._aead.encrypt(nonce, plaintext, _KEYRING_MAGIC)

    def open(self, sealed: bytes) -> bytes:
        header = len(_KEYRING_MAGIC)
        if sealed[:header] != _KEYRING_MAGIC:
            raise KeyringCorruptError("not a Cantata keyring file")
        try:
            return self._aead.decrypt(
                sealed[header : header + NONCE_SIZE], sealed[header + NONCE_SIZE :], _KEYRING_MAGIC
            )
        except InvalidTag:
            raise KeyringCorruptError("the keyring does not decrypt: wrong master key or modified file") from None

    def __repr__(self) -> str:
        return "MasterKey(<hidden>)"


def envelope_key_version(envelope: bytes) -> int:
    """The KEK version a key envelope was wrapped under."""
    if len(envelope) != ENVELOPE_SIZE:
        raise KeyUnwrapError(f"key envelope has {len(envelope)} bytes, expected {ENVELOPE_SIZE}")
    return struct.unpack_from(">I", envelope)[0]


@dataclass(frozen=True)
class JobKey:
    """One version of a job's wrapping key: wraps and unwraps data keys."""

    tenant: str
    job_id: str
    version: int
    secret: bytes = field(repr=False)

    def _aad(self) -> bytes:
        parts = (self.tenant.encode(), self.job_id.encode())
        return _WRAP_LABEL + b"".join(struct.pack(">H", len(p)) + p for p in parts) + struct.pack(">I", self.version)

    def wrap(self, data_key: bytes) -> bytes:
        """Envelope: u32 version || nonce || AES-GCM(data key)."""
        nonce = os.urandom(NONCE_SIZE)
        return struct.pack(">I", self.version) + nonce + AESGCM(self.secret).encrypt(nonce, data_key, self._aad())

    def unwrap(self, envelope: bytes) -> bytes:
        if envelope_key_version(envelope) != self.version:
            raise KeyUnwrapError(f"envelope names KEK version {envelope_key_version(envelope)}, not {self.version}")
        nonce, wrapped = envelope[4 : 4 + NONCE_SIZE], envelope[4 + NONCE_SIZE :]
        try:
            return AESGCM(self.secret).decrypt(nonce, wrapped, self._aad())
        except InvalidTag:
            raise KeyUnwrapError(
                f"data key does not unwrap under {self.tenant}/{self.job_id} KEK v{self.version}"
            ) from None


@dataclass(frozen=True)
class JobKeys:
    """The wrapping keys a job may use: ``current`` seals; any held version unwraps."""

    tenant: str
    job_id: str
    keys: dict[int, JobKey]

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyringError(f"no active key for {self.tenant}/{self.job_id}")

    @property
    def current(self) -> JobKey:
        return self.keys[max(self.keys)]

    @property
    def versions(self) -> list[int]:
        return sorted(self.keys)

    def unwrap(self, envelope: bytes) -> bytes:
        version = envelope_key_version(envelope)
        key = self.keys.get(version)
        if key is None:
            raise UnknownKeyVersionError(
                f"data key is wrapped under KEK v{version}; {self.tenant}/{self.job_id} holds {self.versions}"
            )
        return key.unwrap(envelope)

    def to_dict(self) -> dict[str, Any]:
        """The document a worker's private (0600) config holds; ``from_dict`` reads it back."""
        secrets = {str(v): base64.b64encode(k.secret).decode() for v, k in self.keys.items()}
        return {"tenant": self.tenant, "job_id": self.job_id, "keys": secrets}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> JobKeys:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise KeyringError(f"invalid job keys document: {error}") from None
        return cls.from_dict(document)

    @classmethod
    def from_dict(cls, document: Any) -> JobKeys:
        try:
            tenant, job_id = str(document["tenant"]), str(document["job_id"])
            keys = {
                int(v): JobKey(tenant, job_id, int(v), base64.b64decode(secret, validate=True))
                for v, secret in document["keys"].items()
            }
        except (ValueError, KeyError, TypeError, binascii.Error) as error:
            raise KeyringError(f"invalid job keys document: {error}") from None
        if any(len(key.secret) != KEY_SIZE for key in keys.values()):
            raise KeyringError("invalid job keys document: wrong key length")
        return cls(tenant, job_id, keys)


@dataclass(frozen=True)
class KeyVersion:
    """Public facts about one KEK version (never its material)."""

    version: int
    created_at: str
    retired_at: str | None

    @property
    def active(self) -> bool:
        return self.retired_at is None


class KeyProvider(ABC):
    """Holds tenants' key-encryption keys and derives job keys from them."""

    @abstractmethod
    def ensure_tenant(self, tenant: str) -> int:
        """Create the tenant's first KEK if it has none; return the current version."""

    @abstractmethod
    def job_keys(self, tenant: str, job_id: str) -> JobKeys:
        """The job's wrapping keys for every active KEK version of its tenant."""

    @abstractmethod
    def rotate(self, tenant: str) -> int:
        """Add a new KEK version, make it current and return it."""

    @abstractmethod
    def retire(self, tenant: str, version: int) -> None:
        """Destroy a non-current KEK version; data keys wrapped under it become unreadable."""

    @abstractmethod
    def versions(self, tenant: str) -> list[KeyVersion]:
        """Every KEK version the tenant has had, oldest first."""

    def data_source_keys(self, tenant: str) -> JobKeys:
        """The wrapping keys of the tenant's data-source secrets (every active KEK version)."""
        return self.job_keys(tenant, DATA_SOURCES_SCOPE)

    def webhook_keys(self, tenant: str) -> JobKeys:
        """The wrapping keys of the tenant's webhook signing secrets (every active KEK version)."""
        return self.job_keys(tenant, WEBHOOKS_SCOPE)

    def retire_unused(self, tenant: str, in_use: set[int]) -> list[int]:
        """Retire every active, non-current version not in ``in_use``; return them."""
        active = [v.version for v in self.versions(tenant) if v.active]
        retired = [version for version in active[:-1] if version not in in_use]
        for version in retired:
            self.retire(tenant, version)
        return retired


class _VersionEntry(TypedDict):
    """One KEK version as the keyring file stores it; ``key`` is None once retired."""

    key: str | None
    created_at: str
    retired_at: str | None


class LocalKeyring(KeyProvider):
    """Tenants' KEKs in one file, encrypted under a :class:`MasterKey`."""

    def __init__(self, path: str | os.PathLike[str], master_key: MasterKey) -> None:
        self._path = Path(path)
        self._master_key = master_key
        self._lock = threading.Lock()
        self._tenants: dict[str, dict[int, _VersionEntry]] = self._load()

    def _load(self) -> dict[str, dict[int, _VersionEntry]]:
        try:
            sealed = self._path.read_bytes()
        except FileNotFoundError:
            return {}
        document = json.loads(self._master_key.open(sealed))
        return {tenant: {int(v): entry for v, entry in versions.items()} for tenant, versions in document.items()}

    def _save(self) -> None:
        plaintext = json.dumps(self._tenants, sort_keys=True).encode()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temp_name = tempfile.mkstemp(dir=self._path.parent, prefix=".keyring-")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(self._master_key.seal(plaintext))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp_name, self._path)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise

    def _versions_of(self, tenant: str) -> dict[int, _VersionEntry]:
        versions = self._tenants.get(tenant)
        if not versions:
            raise UnknownTenantError(f"tenant {tenant!r} has no key-encryption key")
        return versions

    def ensure_tenant(self, tenant: str) -> int:
        with self._lock:
            if tenant in self._tenants:
                return max(self._tenants[tenant])
            return self._add_version(tenant)

    def job_keys(self, tenant: str, job_id: str) -> JobKeys:
        with self._lock:
            active = {v: e["key"] for v, e in self._versions_of(tenant).items() if e["key"] is not None}
        keys = {
            v: JobKey(tenant, job_id, v, _derive_job_key(base64.b64decode(k), tenant, job_id))
            for v, k in active.items()
        }
        return JobKeys(tenant, job_id, keys)

    def rotate(self, tenant: str) -> int:
        with self._lock:
            return self._add_version(tenant)

    def _add_version(self, tenant: str) -> int:
        versions = self._tenants.setdefault(tenant, {})
        version = max(versions, default=0) + 1
        versions[version] = {
            "key": base64.b64encode(os.urandom(KEY_SIZE)).decode(),
            "created_at": _now(),
            "retired_at": None,
        }
        self._save()
        return version

    def retire(self, tenant: str, version: int) -> None:
        with self._lock:
            versions = self._versions_of(tenant)
            if version not in versions:
                raise KeyringError(f"tenant {tenant!r} has no KEK version {version}")
            if version == max(versions):
                raise KeyringError(f"KEK v{version} is {tenant!r}'s current version; rotate before retiring it")
            if versions[version]["key"] is not None:
                versions[version]["key"], versions[version]["retired_at"] = None, _now()
                self._save()

    def versions(self, tenant: str) -> list[KeyVersion]:
        with self._lock:
            entries = self._versions_of(tenant)
            return [KeyVersion(v, e["created_at"], e["retired_at"]) for v, e in sorted(entries.items())]


def _derive_job_key(tenant_key: bytes, tenant: str, job_id: str) -> bytes:
    info = _JOB_KEY_INFO + json.dumps([tenant, job_id]).encode()
    return HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=None, info=info).derive(tenant_key)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
