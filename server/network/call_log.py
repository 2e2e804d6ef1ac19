"""The access log: one line per call (what, who, how it ended, how long, its request id), and its metrics.

A call that ends on a thread of the pool is logged there. A stream ends on the
event loop, often together with many others (one event ending a job closes
every watcher's stream at once), so its line is handed to a thread of its own
that writes the lines of a burst once it is over (no stream ended for
:data:`LINGER_S`), stamped with the time each stream ended: a broadcast to
1,000 watchers neither waits on 1,000 log writes (about 60 ms) nor shares the
interpreter with them while it runs.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

access_log = logging.getLogger("cantata.server.access")

LINGER_S = 0.05  # lines are written once no stream ended for this long (each with the time it ended)
MAX_BATCH = 10_000  # or once this many are waiting
Observer = Callable[[str, str, float], None]  # (method, code, seconds)


def write_line(method: str, who: str, code: str, latency_ms: float, request_id: str, at: float | None = None) -> None:
    """Log one call; ``at`` (seconds since the epoch) is when it ended, if not now."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    extra = {"method": method, "principal": who, "code": code, "latency_ms": latency_ms, "request_id": request_id}
    record = access_log.makeRecord(
        access_log.name,
        logging.INFO,
        __file__,
        0,
        "%s %s %s %.1f ms request %s",
        (method, who, code, latency_ms, request_id),
        None,
        extra=extra,
    )
    if at is not None:
        record.created, record.msecs = at, (at - int(at)) * 1000
    access_log.handle(record)


class DeferredCalls:
    """Calls that ended on the event loop, logged and counted by one thread, in the order they ended."""

    def __init__(self, observe: Observer):
        self._observe = observe
        self._queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()

    def ended(self, method: str, who: str, code: str, latency_ms: float, request_id: str) -> None:
        """Log and count a call that ended now (cheap: the work happens on the thread)."""
        self._queue.put((method, who, code, latency_ms, request_id, time.time()))

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            # The rest of the burst of ends, which the event loop finishes meanwhile: writing while it runs would
            # take the interpreter from it. Written once the ends pause for LINGER_S (or MAX_BATCH of them came).
            with contextlib.suppress(queue.Empty):
                while len(batch) < MAX_BATCH:
                    batch.append(self._queue.get(timeout=LINGER_S))
            for item in batch:
                if item is None:
                    return
                method, who, code, latency_ms, request_id, at = item
                try:
                    write_line(method, who, code, latency_ms, request_id, at)
                    self._observe(method, code, latency_ms / 1000)
                except Exception:  # a line lost is logged; the thread goes on
                    logging.getLogger(__name__).exception("could not log a call to %s", method)
