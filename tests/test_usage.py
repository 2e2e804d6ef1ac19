"""What a worker's heartbeat says of its machine use: memory at once, CPU once a window has passed."""

from __future__ import annotations

import time

from cantata.trainer.usage import MIN_WINDOW_S, Usage


def test_a_heartbeat_carries_memory_at_once_and_cpu_use_over_a_window():
    usage = Usage()
    first = usage.heartbeat()
    assert first.memory_bytes > 2**20  # this interpreter's resident set
    assert not first.HasField("cpu_percent")  # no window yet: no CPU figure rather than noise
    end = time.monotonic() + MIN_WINDOW_S * 1.5
    while time.monotonic() < end:  # busy: the process uses CPU in the window
        pass
    second = usage.heartbeat()
    assert second.HasField("cpu_percent") and second.cpu_percent > 0
    assert not usage.heartbeat().HasField("cpu_percent")  # the next window starts at that beat
