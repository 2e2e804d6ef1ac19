"""``GET /metrics`` over TLS, for a Prometheus scraper holding a certificate the admin issued for it.

The listener (``metrics_listen`` in ``server.json``; off when empty) speaks
HTTPS with the server's certificate and asks every client for one signed by
the platform CA. Only a certificate whose URI SAN names a scraper
(``spiffe://cantata/scraper/<name>``, from ``cantata admin scrapers add``)
and that is not revoked gets the exposition text; no certificate is ``401``,
any other principal (an admin, a tenant, a worker) or a revoked scraper is
``403``, and each refusal is audited (anonymous ones are counted) and counted
in ``cantata_refused_calls_total``. Connections are counted at accept by an
:class:`~cantata.server.jobs.admission.Admission` (per source address and in
all; one past a cap is closed before any TLS work); each runs in its own
thread, and its TLS handshake and request head must be done within the
handshake timeout, so a slow client holds up nobody else and a slowloris one
is cut off. Like the gRPC listener, it follows the certificate files: a
rotated server certificate is used from the next connection on.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cantata.security.audit import Action, AuditLogUnavailable
from cantata.security.pki import certificate_principal
from cantata.server.jobs.admission import Admission, ConnectionLimits

SCRAPER = "scraper"

log = logging.getLogger(__name__)


class MetricsEndpoint:
    """Serves ``registry`` at ``/metrics`` on ``listen`` to scrapers only; ``start()`` returns the bound port."""

    def __init__(
        self,
        listen: str,
        cert: Path,
        key: Path,
        trust: Path,
        registry: CollectorRegistry,
        *,
        limits: ConnectionLimits,
        is_revoked: Callable[[int], bool],
        audit: Callable[..., object],
        refused: Callable[[str], None],
    ):
        host, _, port = listen.rpartition(":")
        self._address = (host.strip("[]"), int(port))
        self._files = (cert, key, trust)
        self._registry = registry
        self.limits = limits
        self.admission = Admission(limits)
        self._is_revoked = is_revoked
        self._audit = audit
        self._refused = refused
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] = ()
        self._context: ssl.SSLContext | None = None
        self._server: _Server | None = None

    def tls_context(self) -> ssl.SSLContext:
        """The server side's TLS settings, rebuilt when a certificate file changed."""
        with self._lock:
            stamp = tuple(f.stat().st_mtime_ns for f in self._files)
            if self._context is None or stamp != self._stamp:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(self._files[0], self._files[1])
                context.load_verify_locations(cafile=str(self._files[2]))
                context.verify_mode = ssl.CERT_OPTIONAL  # so that a caller without one gets a clear 401
                self._context, self._stamp = context, stamp
            return self._context

    def start(self) -> int:
        self._server = _Server(self._address, _Handler, self)
        threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True).start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def refusal(self, certificate: x509.Certificate | None) -> tuple[int, str] | None:
        """The HTTP status and reason for refusing this peer, or None for a live scraper."""
        if certificate is None:
            return 401, "no_certificate"
        principal = certificate_principal(certificate)
        if principal is None or principal.role != SCRAPER:
            return 403, "not_a_scraper"
        if self._is_revoked(certificate.serial_number):
            return 403, "revoked"
        return None

    def refuse(self, certificate: x509.Certificate | None, reason: str, address: str) -> None:
        self._refused(reason)
        principal = certificate_principal(certificate) if certificate is not None else None
        action = Action.AUTH_FAILED if reason in ("no_certificate", "revoked") else Action.AUTHZ_DENIED
        with contextlib.suppress(AuditLogUnavailable):  # refused either way
            self._audit(
                principal.uri if principal else "anonymous",
                action,
                resource="/metrics",
                tenant=principal.name if principal and principal.role == "tenant" else "",
                outcome="denied",
                details={"reason": reason},
                peer=address,
            )

    def exposition(self) -> bytes:
        return generate_latest(self._registry)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type, endpoint: MetricsEndpoint):
        self.endpoint = endpoint
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._head = threading.local()  # this connection's deadline, in its own thread
        super().__init__(address, handler)

    def verify_request(self, request, client_address) -> bool:
        """Counted at accept: one past a cap is closed before any TLS work."""
        return self.endpoint.admission.admit(client_address[0])

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.endpoint.admission.release(client_address[0])

    def finish_request(self, request, client_address) -> None:
        """Shake hands in this connection's thread, then serve it (a failed handshake is a refusal); the handshake
        and the request's head must be done within the handshake timeout, or the connection is shut down."""
        timeout = self.endpoint.limits.handshake_timeout_s
        request.settimeout(timeout)
        current = [request]  # the socket to shut down when late: the plain one, then the TLS one that took its fd
        deadline = threading.Timer(timeout, lambda: _shut_down(current[0]))
        deadline.daemon = True
        self._head.deadline = deadline
        deadline.start()
        try:
            current[0] = self.endpoint.tls_context().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            deadline.cancel()
            log.debug("metrics: handshake with %s failed: %s", client_address[0], exc)
            self.endpoint.refuse(None, "handshake", f"{client_address[0]}:{client_address[1]}")
            return
        try:
            super().finish_request(current[0], client_address)
        finally:
            deadline.cancel()
            current[0].close()

    def head_received(self) -> None:
        """The request's head is in: no deadline for the rest (called in the connection's thread)."""
        self._head.deadline.cancel()


def _shut_down(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        socket.socket.shutdown(connection, socket.SHUT_RDWR)  # the plain socket's: safe from another thread


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "cantata-metrics"
    sys_version = ""

    def parse_request(self) -> bool:
        try:
            return super().parse_request()
        finally:
            self.server.head_received()

    def do_GET(self) -> None:
        endpoint = self.server.endpoint
        der = self.connection.getpeercert(binary_form=True)
        certificate = x509.load_der_x509_certificate(der) if der else None
        refusal = endpoint.refusal(certificate)
        if refusal is not None:
            code, reason = refusal
            endpoint.refuse(certificate, reason, f"{self.client_address[0]}:{self.client_address[1]}")
            self._reply(code, f"refused: {reason}\n".encode(), "text/plain; charset=utf-8")
            return
        if self.path.split("?", 1)[0] != "/metrics":
            self._reply(404, b"not found: the one path is /metrics\n", "text/plain; charset=utf-8")
            return
        self._reply(200, endpoint.exposition(), CONTENT_TYPE_LATEST)

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("metrics: %s " + format, self.client_address[0], *args)
