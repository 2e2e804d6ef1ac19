"""Ed25519 audit signing keys: ids, files, and trusted public-key sets.

A key id is the first 16 hex digits of SHA-256 over the raw public key, so an
id names exactly one key. Under ``keys/`` each key has ``<id>.pub`` (PEM); the
active key also has ``<id>.key`` (PKCS#8 PEM, mode 0600), deleted once the key
is rotated out so nobody can sign old history again; ``active`` names it.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import AuditKeyError
from .fsutil import fsync_directory, write_atomically, write_new_file

_PEM_PUBLIC_BLOCK = re.compile(rb"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", re.DOTALL)
_KEY_ID = re.compile(r"[0-9a-f]{16}")


def raw_public(public_key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The id that names ``public_key``."""
    return hashlib.sha256(raw_public(public_key)).hexdigest()[:16]


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    """A public key as a PEM SubjectPublicKeyInfo block."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def parse_public_keys(pem: bytes, source: str) -> dict[str, Ed25519PublicKey]:
    """Every Ed25519 public key in a PEM text, by key id."""
    keys: dict[str, Ed25519PublicKey] = {}
    for block in _PEM_PUBLIC_BLOCK.findall(pem):
        try:
            public_key = serialization.load_pem_public_key(block)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise AuditKeyError(f"{source}: unreadable public key ({exc})") from None
        if not isinstance(public_key, Ed25519PublicKey):
            raise AuditKeyError(f"{source}: holds a non-Ed25519 public key")
        keys[key_id(public_key)] = public_key
    if not keys:
        raise AuditKeyError(f"{source}: no PEM public key found")
    return keys


def load_public_keys_file(path: Path) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 public keys in a PEM file (one or more ``PUBLIC KEY`` blocks)."""
    try:
        pem = Path(path).read_bytes()
    except FileNotFoundError:
        raise AuditKeyError(f"public key file not found: {path}") from None
    except OSError as exc:
        raise AuditKeyError(f"cannot read public key file {path}: {exc.strerror}") from None
    return parse_public_keys(pem, str(path))


class KeyDirectory:
    """The ``keys/`` folder of an audit log."""

    def __init__(self, path: Path):
        self.path = path

    def create_key(self) -> tuple[str, Ed25519PrivateKey]:
        """Make a fresh key, store both halves, and return its id and private key."""
        private_key = Ed25519PrivateKey.generate()
        kid = key_id(private_key.public_key())
        write_new_file(
            self.path / f"{kid}.key",
            private_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
            mode=0o600,
        )
        write_new_file(self.path / f"{kid}.pub", public_pem(private_key.public_key()), mode=0o644)
        return kid, private_key

    def active_id(self) -> str:
        try:
            kid = (self.path / "active").read_text().strip()
        except FileNotFoundError:
            raise AuditKeyError(f"no active audit key: {self.path / 'active'} is missing") from None
        if not _KEY_ID.fullmatch(kid):
            raise AuditKeyError(f"{self.path / 'active'} does not name a key id")
        return kid

    def set_active(self, kid: str) -> None:
        write_atomically(self.path / "active", f"{kid}\n".encode())

    def private_key(self, kid: str) -> Ed25519PrivateKey:
        path = self.path / f"{kid}.key"
        try:
            pem = path.read_bytes()
        except FileNotFoundError:
            raise AuditKeyError(f"audit signing key file missing: {path}") from None
        try:
            private_key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise AuditKeyError(f"unreadable audit signing key {path}: {exc}") from None
        if not isinstance(private_key, Ed25519PrivateKey) or key_id(private_key.public_key()) != kid:
            raise AuditKeyError(f"{path} does not hold the Ed25519 key {kid}")
        return private_key

    def public_key(self, kid: str) -> Ed25519PublicKey:
        """The stored public key ``kid``; its file must hash to its id."""
        path = self.path / f"{kid}.pub"
        try:
            pem = path.read_bytes()
        except FileNotFoundError:
            raise AuditKeyError(f"audit public key file missing: {path}") from None
        keys = parse_public_keys(pem, str(path))
        if kid not in keys:
            raise AuditKeyError(f"{path} does not hold the key {kid}")
        return keys[kid]

    def destroy_private_key(self, kid: str) -> None:
        """Delete a retired private key so no one can sign with it again."""
        (self.path / f"{kid}.key").unlink(missing_ok=True)
        fsync_directory(self.path)
