"""Server TLS credentials that follow their files: rotation without a restart.

gRPC asks the fetcher for a configuration on every new handshake; when the
server certificate, its key or the trust bundle changed on disk, the new files
are used from the next connection on. Connections already open keep theirs.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import grpc

from cantata.security.pki import CertificateAuthority
from cantata.server.config import DataDir, write_private


class RotatingCredentials:
    def __init__(self, cert: Path, key: Path, trust: Path, *, require_client_auth: bool):
        self._files = (cert, key, trust)
        self._require = require_client_auth
        self._lock = threading.Lock()
        self._stamp = self._mtimes()

    def _mtimes(self) -> tuple[int, ...]:
        return tuple(f.stat().st_mtime_ns for f in self._files)

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        cert, key, trust = (f.read_bytes() for f in self._files)
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=trust if self._require else None
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return None
            self._stamp = stamp
            return self._configuration()

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(), self._fetch, require_client_authentication=self._require
        )


def rotate_server_certificate(paths: DataDir, dns_names: list[str], ips: list[str]) -> int:
    """Issue a fresh server certificate and key in place; returns the new serial."""
    ca = CertificateAuthority.load(paths.ca_cert.read_bytes(), paths.ca_key.read_bytes())
    bundle = ca.issue_bundle(None, lifetime=dt.timedelta(days=365), dns_names=dns_names, ips=ips, server=True)
    write_private(paths.server_key.with_suffix(".key.new"), bundle.key_pem)
    paths.server_cert.with_suffix(".pem.new").write_bytes(bundle.cert_pem)
    paths.server_key.with_suffix(".key.new").replace(paths.server_key)
    paths.server_cert.with_suffix(".pem.new").replace(paths.server_cert)
    return bundle.certificate.serial_number
