"""Serving the dashboard: uvicorn over TLS, on the control plane's event loop.

The dashboard runs on the same loop as the gRPC server, because the job
broadcast delivers there: a browser following a job waits on that loop as a
``WatchJob`` stream does, holding no thread. The socket is bound here, before
uvicorn starts, and its configuration (the certificate) loaded, so that a
port in use or an unreadable key is an exception of ``start()``.
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import Future
from pathlib import Path

import uvicorn

GRACE_SECONDS = 1  # open event streams get this long to end when the server stops


def public_url(listen: str, port: int, configured: str) -> str:
    """The dashboard's base URL in login links: ``dashboard_url`` if set, else from the listen address."""
    if configured:
        return configured.rstrip("/")
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 (a wildcard listen is reached through a name)
        host = "localhost"
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class DashboardServer:
    """uvicorn serving ``app`` with the server's certificate; ``start()`` returns the bound port, then ``stop()``."""

    def __init__(self, app, listen: str, certificate: Path, key: Path):
        host, _, port = listen.rpartition(":")
        self._address = (host.strip("[]") or "127.0.0.1", int(port))
        self._config = uvicorn.Config(
            app,
            ssl_certfile=str(certificate),
            ssl_keyfile=str(key),
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            proxy_headers=False,  # the peer address in audit records is the connection's, never a header's
            timeout_graceful_shutdown=GRACE_SECONDS,
        )
        self._server = uvicorn.Server(self._config)
        self._running: Future | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> int:
        self._config.load()  # here, so that a bad certificate raises here (uvicorn would exit the process)
        family = socket.AF_INET6 if ":" in self._address[0] else socket.AF_INET
        sock = socket.create_server(self._address, family=family, reuse_port=False)
        self._running = asyncio.run_coroutine_threadsafe(self._server.serve(sockets=[sock]), loop)
        return sock.getsockname()[1]

    def stop(self) -> None:
        """Stop accepting, end open streams after ``GRACE_SECONDS`` and wait for uvicorn to finish."""
        if self._running is None:
            return
        self._server.should_exit = True
        self._running.result()
        self._running = None
