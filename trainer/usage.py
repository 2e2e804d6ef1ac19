"""What this worker process uses of its machine, measured for each heartbeat: CPU, resident memory, GPU memory.

Cheap by design: two ``getrusage`` calls, one read of ``/proc/self/statm``
and, once the trainer has put tensors on a GPU, one call into the CUDA
allocator. Nothing is measured on the GPU before then, so a heartbeat sent
while torch is still loading does not load it.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from cantata.proto.v1 import worker_pb2

_PAGE = os.sysconf("SC_PAGE_SIZE")
MIN_WINDOW_S = 0.5  # CPU use over a shorter window than this is noise: left out


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _resident_bytes() -> float | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return float(int(statm.read().split()[1]) * _PAGE)
    except (OSError, IndexError, ValueError):  # no procfs (not Linux): leave it out
        return None


def _gpu_bytes() -> float | None:
    torch = sys.modules.get("torch")  # loaded by the trainer, never here
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return float(torch.cuda.memory_allocated())


class Usage:
    """Samples since the previous sample: :meth:`heartbeat` is the report's payload."""

    def __init__(self) -> None:
        self._cpu, self._wall = _cpu_seconds(), time.monotonic()

    def heartbeat(self) -> worker_pb2.Heartbeat:
        cpu, wall = _cpu_seconds(), time.monotonic()
        beat = worker_pb2.Heartbeat()
        if wall - self._wall >= MIN_WINDOW_S:  # the first beat, sent as the process starts, has no window yet
            beat.cpu_percent = 100.0 * (cpu - self._cpu) / (wall - self._wall)
            self._cpu, self._wall = cpu, wall
        if (resident := _resident_bytes()) is not None:
            beat.memory_bytes = resident
        if (gpu := _gpu_bytes()) is not None:
            beat.gpu_memory_bytes = gpu
        return beat
