"""Holding each source address to its share of the gRPC ports, which grpcio cannot do itself.

grpc core bounds a port's connections in all (``grpc.max_allowed_incoming_connections``),
their handshakes and their idleness, but it accepts in C and has no per-peer
limit, and grpcio offers no hook at accept. The accepted sockets are this
process's file descriptors, though: :class:`ConnectionReaper` looks at them
(``/proc/self/fd``) a few times a second, groups the connections to the gRPC
ports by source address (:func:`cantata.server.jobs.admission.source_group`), and
shuts down, with ``shutdown(2)`` on a duplicate of the descriptor, the newest
connections of any address past ``per_address``; grpc then sees the
connection end and closes it. Older connections of that address (the ones it
had before the flood) are kept. Between two sweeps an address can hold more,
up to grpc's total for the port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Collection

from cantata.server.jobs.admission import source_group

SWEEP_SECONDS = 0.25
LOG_EVERY_S = 60.0  # at most one warning line per this long, however many connections are shed

log = logging.getLogger(__name__)


class ConnectionReaper:
    """Sheds the newest connections of a source address holding more than ``per_address`` on one of ``ports``."""

    def __init__(self, ports: Collection[int], per_address: int, interval_s: float = SWEEP_SECONDS):
        self._ports = frozenset(ports)
        self._per_address = per_address
        self._interval = interval_s
        self._sweeps = 0
        self._first_seen: dict[int, int] = {}  # socket inode -> the sweep that first saw it (older = kept)
        self._shed = 0
        self._logged_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep()
            except OSError:  # out of descriptors itself: the next sweep tries again
                log.exception("connection sweep failed")

    def sweep(self) -> int:
        """One pass: shed what is over the caps now; returns how many connections it shut down."""
        self._sweeps += 1
        held: dict[tuple[int, str], list[tuple[int, int, socket.socket]]] = {}
        duplicates: list[socket.socket] = []
        try:
            for name in os.listdir("/proc/self/fd"):
                try:
                    if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                        continue
                    sock = socket.socket(fileno=os.dup(int(name)))
                except (OSError, ValueError):  # closed meanwhile, or not a socket we can read
                    continue
                duplicates.append(sock)
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                try:
                    port, peer = sock.getsockname()[1], sock.getpeername()[0]
                except OSError:  # a listener, or a connection that ended
                    continue
                if port not in self._ports:
                    continue
                inode = os.fstat(sock.fileno()).st_ino
                seen = self._first_seen.setdefault(inode, self._sweeps)
                held.setdefault((port, source_group(peer)), []).append((seen, inode, sock))
            live = {inode for group in held.values() for _, inode, _ in group}
            self._first_seen = {inode: seen for inode, seen in self._first_seen.items() if inode in live}
            shed = 0
            for (port, group), connections in held.items():
                for _, _, sock in sorted(connections, key=lambda c: c[:2])[self._per_address :]:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                        shed += 1
                if len(connections) > self._per_address:
                    self._warn(port, group, len(connections))
            self._shed += shed
            return shed
        finally:
            for sock in duplicates:
                sock.close()

    def _warn(self, port: int, group: str, count: int) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "%s held %d connections on port %d, past its %d: shed the newest (%d shed since start)",
                group,
                count,
                port,
                self._per_address,
                self._shed,
            )
