"""Credentials of a locked Ray cluster: its token, and its nodes' TLS certificates from the platform CA."""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from pathlib import Path

from cantata.security.pki import CertificateAuthority
from cantata.server.config import DataDir, write_private


def write_token(path: Path) -> str:
    """Mint a Ray cluster token (64 hex digits) into ``path`` (0600, folder 0700); returns it."""
    token = secrets.token_hex(32)
    write_private(path, (token + "\n").encode())
    path.parent.chmod(0o700)
    return token


def write_node_certificate(paths: DataDir, node_ip: str, out: Path, *, days: int = 365) -> int:
    """Issue the certificate of the Ray node at ``node_ip`` (Ray's TLS: both ends of every call show one).

    Writes ``out/node.pem``, ``out/node.key`` (0600) and ``out/ca.pem``; returns the serial number.
    """
    ip = str(ipaddress.ip_address(node_ip))  # a ValueError names a malformed address
    ca = CertificateAuthority.load(paths.ca_cert.read_bytes(), paths.ca_key.read_bytes())
    bundle = ca.issue_bundle(
        None, lifetime=dt.timedelta(days=days), dns_names=["localhost"], ips=sorted({ip, "127.0.0.1"}), server=True
    )
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    (out / "node.pem").write_bytes(bundle.cert_pem)
    write_private(out / "node.key", bundle.key_pem)
    (out / "ca.pem").write_bytes(ca.cert_pem)
    return bundle.certificate.serial_number
