"""What one distributed optimizer step cost a rank: update compute and bytes on the wire."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class StepStats:
    """Compute is this thread's CPU time in updates (robust to oversubscribed cores); bytes
    count what this rank sends under ring collectives; collective elements count what this rank
    hands to collectives (its send buffers, padding included)."""

    compute_seconds: float = 0.0
    wire_bytes: int = 0
    updated_matrices: int = 0
    collective_elements: int = 0

    def add(self, other: StepStats) -> None:
        self.compute_seconds += other.compute_seconds
        self.wire_bytes += other.wire_bytes
        self.updated_matrices += other.updated_matrices
        self.collective_elements += other.collective_elements

    @contextmanager
    def computing(self) -> Iterator[None]:
        start = time.thread_time()
        try:
            yield
        finally:
            self.compute_seconds += time.thread_time() - start


def ring_bytes(elements_per_rank: int, world_size: int, element_size: int) -> int:
    """Bytes one rank sends in a ring reduce-scatter or all-gather of `elements_per_rank` per rank."""
    return (world_size - 1) * elements_per_rank * element_size
