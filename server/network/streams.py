"""How many streams each principal holds open, against a cap (``max_streams_per_principal`` in ``server.json``).

An open stream costs the server memory (its call, its subscription) but no
thread; the cap keeps one principal from holding so many that everyone else
pays. A call past it is refused with ``RESOURCE_EXHAUSTED``.
"""

from __future__ import annotations

import threading


class StreamCounter:
    """Open streams per principal, each counted from its start to its end."""

    def __init__(self, cap: int):
        if cap < 1:
            raise ValueError("max_streams_per_principal must be at least 1")
        self.cap = cap
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, who: str) -> bool:
        """Count one more open stream of ``who``; False (nothing counted) if it holds ``cap`` already."""
        with self._lock:
            held = self._open.get(who, 0)
            if held >= self.cap:
                return False
            self._open[who] = held + 1
            return True

    def release(self, who: str) -> None:
        """One stream of ``who`` ended (one that :meth:`acquire` counted)."""
        with self._lock:
            left = self._open[who] - 1
            if left:
                self._open[who] = left
            else:
                del self._open[who]

    def held(self, who: str) -> int:
        with self._lock:
            return self._open.get(who, 0)
