"""Where a worker trains: on the GPU its ``CUDA_VISIBLE_DEVICES`` names, or on the CPU.

A job with ``gpus_per_worker`` gets its devices from the executor (the local
executor's share of the node's GPUs, or Ray's): its worker trains on
``cuda`` under bf16 autocast, and its ``torch.distributed`` groups use NCCL,
since every rank of a job asks for the same GPUs. Without a GPU (or with
``gpus_per_worker`` 0) it trains on the CPU in fp32 over gloo. Checkpoints
are device-independent: they are read back onto the CPU
(:func:`cantata.security.sealed_checkpoint`), then copied into the model
wherever it lives, so a GPU job resumes on the CPU and back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Device:
    kind: str  # "cuda" or "cpu"

    @property
    def torch(self) -> torch.device:
        return torch.device(self.kind)

    @property
    def backend(self) -> str:
        """The ``torch.distributed`` backend of a group whose ranks all train here."""
        return "nccl" if self.kind == "cuda" else "gloo"

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on a GPU; nothing on the CPU (fp32, as before)."""
        if self.kind == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()


def pick_device(gpus_per_worker: int) -> Device:
    """``cuda`` (the first of the worker's visible GPUs) if the job asked for GPUs and torch sees one, else ``cpu``."""
    if gpus_per_worker > 0 and torch.cuda.is_available():
        torch.cuda.set_device(0)  # the first device CUDA_VISIBLE_DEVICES names
        return Device("cuda")
    return Device("cpu")
