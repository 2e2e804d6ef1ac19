"""A TCP proxy on loopback whose faults a test switches: pass, reset, stall or refuse connections.

It forwards bytes between clients and one upstream (moto, Azurite). ``reset``
answers new connections with a TCP reset and cuts the open ones; ``stall``
holds every byte, on new and open connections, until the mode changes;
``refuse`` stops listening, so connecting fails as with a service that is
down. ``set(mode, for_seconds=N)`` returns to ``pass`` after N seconds: the
length of the outage, not a wait of the test.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Literal

Mode = Literal["pass", "reset", "stall", "refuse"]
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._mode: Mode = "pass"
        self._open: set[socket.socket] = set()
        self._timer: threading.Timer | None = None
        self._closed = False
        self.resets = 0  # connections answered or cut with a reset
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._acceptor.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> Mode:
        return self._mode

    def set(self, mode: Mode, for_seconds: float | None = None) -> None:
        """Switch to ``mode`` (for ``for_seconds``, then back to ``pass``)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._mode = mode
            if mode in ("reset", "refuse"):
                for sock in list(self._open):
                    self._reset(sock)
            if mode == "stall":
                self._flowing.clear()
            else:
                self._flowing.set()
            if for_seconds is not None:
                self._timer = threading.Timer(for_seconds, self.set, ("pass",))
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            self._flowing.set()
            for sock in list(self._open):
                self._reset(sock)
        self._acceptor.join()

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        listener.settimeout(0.05)
        return listener

    def _accept(self) -> None:
        listener: socket.socket | None = self._listener
        while not self._closed:
            if self._mode == "refuse":
                if listener is not None:
                    listener.close()
                    listener = None
                self._flowing.wait(0.05)
                continue
            if listener is None:
                listener = self._listen(self.port)
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            self._serve(client)
        if listener is not None:
            listener.close()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            if self._mode in ("reset", "refuse"):  # refuse: it was in the backlog as listening stopped
                self._reset(client)
                return
            self._open.add(client)
        threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._flowing.wait()
        try:
            upstream = socket.create_connection(self._upstream, timeout=10)
        except OSError:
            self._reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass  # the other side went away, or a fault cut the connection
        for sock in (source, sink):
            self._forget(sock)

    def _reset(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
        self.resets += 1
        self._forget(sock)

    def _forget(self, sock: socket.socket) -> None:
        """Close ``sock``; SHUT_RD first wakes a pump blocked reading it (it sends nothing on the wire)."""
        self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)
        sock.close()
