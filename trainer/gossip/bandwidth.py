"""A token bucket that caps one link's send rate, for bandwidth experiments."""

from __future__ import annotations

import threading
import time


class TokenBucket:
    """Lets ``rate`` bytes per second through, with bursts up to ``burst`` bytes."""

    def __init__(self, rate: float, burst: float | None = None):
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = rate
        self.burst = rate if burst is None else burst
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Block until ``n`` bytes may be sent (a debt beyond the burst is waited off)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait:
            time.sleep(wait)
