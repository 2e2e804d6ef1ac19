"""How many TCP connections each listening port holds, per source address and in all (docs/security.md#floods).

Every listener of the server is bounded by the same :class:`ConnectionLimits`:
a source address (an IPv4 address, or an IPv6 /64) may hold ``per_address``
connections on a port, and the port ``total`` of them from everyone. The
listeners that accept in Python (the dashboard, ``/metrics``) ask an
:class:`Admission` at accept, before any TLS work, and close a connection
past a limit at once; the gRPC ports are held to them by grpc core (the
total, handshake and idle timeouts) and :mod:`cantata.server.network.connection_reaper`
(per address).
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of one listening port."""

    per_address: int
    total: int
    handshake_timeout_s: float  # TLS handshake (and, over HTTP, a request's head) must be done by then

    def __post_init__(self) -> None:
        if not 1 <= self.per_address <= self.total:
            raise ValueError(f"connection limits need 1 <= per address ({self.per_address}) <= total ({self.total})")
        if self.handshake_timeout_s <= 0:
            raise ValueError("handshake_timeout_s must be positive")


def source_group(host: str) -> str:
    """The address a connection from ``host`` counts under: itself for IPv4, its /64 for IPv6."""
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


class Admission:
    """Open connections per source address and in all, for a listener that accepts them itself; thread-safe."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self._open: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def admit(self, host: str) -> bool:
        """Count one more connection from ``host``; False (nothing counted) when it or the port is at its cap."""
        group = source_group(host)
        with self._lock:
            held = self._open.get(group, 0)
            if held >= self.limits.per_address or self._total >= self.limits.total:
                return False
            self._open[group] = held + 1
            self._total += 1
            return True

    def release(self, host: str) -> None:
        """A connection that :meth:`admit` counted has closed."""
        group = source_group(host)
        with self._lock:
            left = self._open[group] - 1
            if left:
                self._open[group] = left
            else:
                del self._open[group]
            self._total -= 1

    @property
    def total(self) -> int:
        with self._lock:
            return self._total
