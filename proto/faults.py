"""Evaluation only: a fault an admin plans for a queued job, to exercise its recovery policy.

The admin's ``InjectFault`` call stores the plan (JSON) with the job; the
launcher hands it to the workers in their config file, never through the
``JobSpec``, so a tenant cannot switch it on. The trainer corrupts the loss
of step ``step`` on the named processes: ``loss_spike`` multiplies it (and so
its gradients) by ``scale``, ``nonfinite`` makes it NaN. It fires ``times``
times: again each time a rollback brings training back to that step.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass

DEFAULT_SCALE = 1000.0
MAX_TIMES = 100


class FaultKind(enum.StrEnum):
    LOSS_SPIKE = "loss_spike"
    NONFINITE = "nonfinite"


class InvalidFault(ValueError):
    """The fault plan is malformed or does not fit the job."""


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    step: int
    scale: float = DEFAULT_SCALE
    times: int = 1
    workers: tuple[int, ...] = ()  # empty: every process

    def factor(self, step: int, worker: int, fired: int) -> float:
        """What this process multiplies the loss of ``step`` by, having fired ``fired`` times so far (1.0: nothing)."""
        if step != self.step or fired >= self.times or (self.workers and worker not in self.workers):
            return 1.0
        return math.nan if self.kind is FaultKind.NONFINITE else self.scale

    def to_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind.value, "workers": list(self.workers)}

    @classmethod
    def from_dict(cls, raw: dict) -> Fault:
        return cls(
            FaultKind(raw["kind"]), int(raw["step"]), float(raw["scale"]), int(raw["times"]), tuple(raw["workers"])
        )


def plan_fault(
    kind: str, step: int, scale: float, times: int, workers: list[int], *, steps: int, processes: int
) -> Fault:
    """The fault an ``InjectFault`` request asks for in a job of ``steps`` steps and ``processes`` processes.

    ``scale`` and ``times`` 0 take their defaults. Raises :class:`InvalidFault`, saying what is wrong.
    """
    try:
        fault_kind = FaultKind(kind)
    except ValueError:
        raise InvalidFault(f"unknown fault {kind!r} (known: {', '.join(FaultKind)})") from None
    if not 1 <= step <= steps:
        raise InvalidFault(f"step must be in 1..{steps} (the job's steps), not {step}")
    scale = scale or DEFAULT_SCALE
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidFault(f"scale must be a finite number > 0, not {scale}")
    times = times or 1
    if not 1 <= times <= MAX_TIMES:
        raise InvalidFault(f"times must be in 1..{MAX_TIMES}, not {times}")
    if any(not 0 <= w < processes for w in workers) or len(set(workers)) != len(workers):
        raise InvalidFault(f"workers must be distinct processes of 0..{processes - 1}")
    return Fault(fault_kind, step, scale, times, tuple(workers))
