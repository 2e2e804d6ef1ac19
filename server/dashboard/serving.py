"""Serving the dashboard: uvicorn over TLS, on the control plane's event loop, behind an accept-side limit.

The dashboard runs on the same loop as the gRPC server, because the job
broadcast delivers there: a browser following a job waits on that loop as a
``WatchJob`` stream does, holding no thread. So that a flood of connections
cannot starve that loop (nor take the process's descriptors), the dashboard
accepts its connections itself rather than through uvicorn's server:

- each accepted connection is first counted by an :class:`Admission`
  (``max_connections_per_address``, ``http_max_connections``); one past a cap
  is closed before any TLS work;
- its TLS handshake must finish within ``handshake_timeout_s``;
- the head of each request (request line and headers, at most
  ``MAX_HEAD_BYTES``) must arrive within ``handshake_timeout_s`` of the
  connection or of the previous response, so a slowloris client is closed;
- an idle keep-alive connection is closed after ``KEEP_ALIVE_SECONDS``.

The socket is bound here, before uvicorn starts, and its configuration (the
certificate) loaded, so that a port in use or an unreadable key is an
exception of ``start()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from concurrent.futures import Future
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from cantata.server.jobs.admission import Admission, ConnectionLimits

GRACE_SECONDS = 1  # open event streams get this long to end when the server stops
KEEP_ALIVE_SECONDS = 5  # an idle connection between requests is closed after this long
MAX_HEAD_BYTES = 16 * 1024  # a request line and headers larger than this are refused (431)
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close(2) resets the connection and frees it at once
ACCEPT_RETRY_SECONDS = 0.1  # after accept(2) failed (out of descriptors), try again this much later

log = logging.getLogger(__name__)


def public_url(listen: str, port: int, configured: str) -> str:
    """The dashboard's base URL in login links: ``dashboard_url`` if set, else from the listen address."""
    if configured:
        return configured.rstrip("/")
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 (a wildcard listen is reached through a name)
        host = "localhost"
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class _BoundedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on each request's head, telling when the connection ends."""

    def __init__(self, *args, head_timeout_s: float, ended, **kwargs):
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s
        self._ended = ended
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_deadline is not None and self._in_request():
            self._head_deadline.cancel()
            self._head_deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        try:
            super().connection_lost(exc)
        finally:
            self._ended()

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _await_head(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self._head_timeout_s, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_deadline = None
        if not self._in_request():
            self.transport.close()


class _Once:
    """A callable that calls ``action`` on its first call only."""

    def __init__(self, action):
        self._action = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


class DashboardServer:
    """uvicorn serving ``app`` with the server's certificate; ``start()`` returns the bound port, then ``stop()``."""

    def __init__(self, app, listen: str, certificate: Path, key: Path, limits: ConnectionLimits):
        host, _, port = listen.rpartition(":")
        self._address = (host.strip("[]") or "127.0.0.1", int(port))
        self._limits = limits
        self.admission = Admission(limits)
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
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        self._server = uvicorn.Server(self._config)
        self._running: Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting: asyncio.Task | None = None
        self._handshakes: set[asyncio.Task] = set()

    def start(self, loop: asyncio.AbstractEventLoop) -> int:
        self._config.load()  # here, so that a bad certificate raises here (uvicorn would exit the process)
        family = socket.AF_INET6 if ":" in self._address[0] else socket.AF_INET
        sock = socket.create_server(self._address, family=family, reuse_port=False, backlog=1024)
        sock.setblocking(False)
        self._loop = loop
        self._running = asyncio.run_coroutine_threadsafe(self._serve(sock), loop)
        return sock.getsockname()[1]

    def stop(self) -> None:
        """Stop accepting, end open streams after ``GRACE_SECONDS`` and wait for uvicorn to finish."""
        if self._running is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._stop_accepting)
        self._server.should_exit = True
        self._running.result()
        self._running = None

    def _stop_accepting(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()

    async def _serve(self, listener: socket.socket) -> None:
        # uvicorn serves no socket of its own (sockets=[]): it runs the application and the shutdown.
        self._accepting = asyncio.ensure_future(self._accept(listener))
        try:
            await self._server.serve(sockets=[])
        finally:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            listener.close()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, address = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: the caps keep it rare; never spin on it
                log.warning("dashboard: accept failed: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            if not self.admission.admit(address[0]):
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
                connection.close()  # past a cap: reset at once, before any TLS work
                continue
            handshake = loop.create_task(self._open(connection, address[0]))
            self._handshakes.add(handshake)  # held until done: the loop keeps only weak references to tasks
            handshake.add_done_callback(self._handshakes.discard)

    async def _open(self, connection: socket.socket, host: str) -> None:
        """Shake hands (within the timeout) and hand the connection to uvicorn; counted until it closes."""
        ended = _Once(lambda: self.admission.release(host))
        opened = False
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _BoundedProtocol(
                    config=self._config,
                    server_state=self._server.server_state,
                    app_state={},  # lifespan is off: no state to share
                    head_timeout_s=self._limits.handshake_timeout_s,
                    ended=ended,
                ),
                connection,
                ssl=self._config.ssl,
                ssl_handshake_timeout=self._limits.handshake_timeout_s,
            )
            opened = True
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("dashboard: handshake with %s failed: %s", host, exc)
        finally:
            if not opened:
                connection.close()
                ended()
