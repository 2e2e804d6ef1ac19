"""Connection floods against a live server, and what the server holds: shared by tests/test_floods.py and
benchmarks/bench_flood.py.

A flood comes from a loopback address of its own (``127.0.0.2`` and up, all of
``127.0.0.0/8`` is the machine's), so the test's own clients on ``127.0.0.1``
count as another source. What the server holds is read from the kernel: the
server process's socket descriptors (``/proc/PID/fd``) matched to the
connections of its network namespace (``/proc/PID/net/tcp``), by inode.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections import Counter
from dataclasses import dataclass, field

# The first bytes of a TLS ClientHello: a handshake record header and the start of the message, never finished.
PARTIAL_CLIENT_HELLO = bytes.fromhex("160301020001000200") + b"\x03\x03" + os.urandom(16)
HALF_SENT_HEAD = b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: slowloris\r\n"  # no blank line: never finished
ESTABLISHED = "01"


def server_connections(pid: int) -> Counter[tuple[int, str]]:
    """The established TCP connections process ``pid`` holds, counted by (its local port, the peer's address)."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{name}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    held: Counter[tuple[int, str]] = Counter()
    for table_name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table_name}") as table:
            next(table)
            for line in table:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if state == ESTABLISHED and inode in inodes:
                    held[(int(local.split(":")[1], 16), _address(remote.split(":")[0]))] += 1
    return held


def _address(hexadecimal: str) -> str:
    """An address of /proc/net/tcp{,6} (host-order 32-bit words); a v4-mapped IPv6 one as its IPv4 address."""
    raw = b"".join(bytes.fromhex(hexadecimal[i : i + 8])[::-1] for i in range(0, len(hexadecimal), 8))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class Flood:
    """Idle connections this process opened; ``close()`` (or the ``with`` block's end) drops them."""

    sockets: list[socket.socket] = field(default_factory=list)
    refused: int = 0  # connect() itself failed (the backlog was full)

    def __enter__(self) -> Flood:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()

    def open(self, port: int, count: int, source: str, first_bytes: bytes = b"") -> None:
        """``count`` plain TCP connections from ``source`` to ``port``, each sending ``first_bytes`` (or nothing)."""
        for _ in range(count):
            sock = socket.socket()
            sock.bind((source, 0))
            sock.settimeout(30)
            try:
                sock.connect(("127.0.0.1", port))
                if first_bytes:
                    sock.sendall(first_bytes)
            except OSError:
                sock.close()
                self.refused += 1
                continue
            self.sockets.append(sock)


def tls_client(port: int, source: str = "127.0.0.1") -> ssl.SSLSocket:
    """A TLS connection to ``port`` with its handshake done (the server's certificate is not checked: the test
    is about what an attacker, who needs none, can hold)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    return context.wrap_socket(sock)


def wait_closed(sock: socket.socket) -> bytes:
    """Block until the server closes ``sock`` (what it sent meanwhile is returned); the test's timeout bounds it."""
    sock.settimeout(None)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        pass
    return received
