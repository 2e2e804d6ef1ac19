"""Automatic recovery of single and allreduce jobs: roll back past a loss spike or a non-finite loss.

Each step's loss (averaged over the job's ranks, so every rank takes the same
decision) goes through a :class:`SpikeDetector`: a loss more than
``spike_zscore`` standard deviations above the mean of the last
``spike_window`` losses is a spike; a NaN or infinite loss is ``nonfinite``.
Either trips the job's :class:`RecoveryPolicy`, and the trainer restores the
model and the optimizer from the latest checkpoint while the data feed goes
on where it stands: the batches of the steps since that checkpoint, the
offending one among them, are never trained on again. Each rollback may scale
the learning rate down; one more than ``max_rollbacks`` fails the job
(:class:`RollbacksExhausted`). Rollbacks are counted per run of the workers:
a restarted job starts again at 0.
"""

from __future__ import annotations

import collections
import enum
import math
import statistics
from dataclasses import dataclass

from cantata.proto.jobfields import server_default

MIN_STDEV = 1e-6  # a window of equal losses: any rise above it by more than this x z is a spike
MAX_ZSCORE = 1e9  # what a report says of a spike over a flat window (the log and the wire hold finite numbers)


class Cause(enum.StrEnum):
    LOSS_SPIKE = "loss_spike"
    NONFINITE = "nonfinite"


@dataclass(frozen=True)
class Trip:
    """Why a step's loss tripped the policy."""

    cause: Cause
    loss: float
    zscore: float = 0.0  # a spike's


class SpikeDetector:
    """Flags a loss more than ``zscore`` standard deviations above the mean of the last ``window`` losses.

    Pure: it sees only the losses it is given. It says nothing until its window
    is full; a loss it flags (or a non-finite one) does not enter the window.
    """

    def __init__(self, zscore: float, window: int):
        if not (zscore > 0 and window >= 2):
            raise ValueError(f"a spike needs zscore > 0 and window >= 2, not {zscore} and {window}")
        self.zscore, self._losses = zscore, collections.deque[float](maxlen=window)

    def observe(self, loss: float) -> float | None:
        """The z-score of ``loss`` if it is a spike, else None (and ``loss`` joins the window)."""
        if not math.isfinite(loss):
            return None
        if len(self._losses) == self._losses.maxlen:
            mean = statistics.fmean(self._losses)
            z = (loss - mean) / max(statistics.pstdev(self._losses, mean), MIN_STDEV)
            if z > self.zscore:
                return min(z, MAX_ZSCORE)
        self._losses.append(loss)
        return None


class RollbacksExhausted(RuntimeError):
    """The job tripped its recovery policy once more than ``max_rollbacks`` allows (a permanent failure)."""


class NonfiniteLoss(RuntimeError):
    """A non-finite loss in a job whose policy is ``on_nonfinite: fail`` (a permanent failure)."""


@dataclass(frozen=True)
class RecoveryPolicy:
    """What a job's spec asks for (its ``on_nonfinite``, ``spike_*``, ``max_rollbacks``, ``rollback_lr_scale``)."""

    on_nonfinite: str  # warn | rollback | fail
    spike_zscore: float | None
    spike_window: int
    max_rollbacks: int
    lr_scale: float

    @classmethod
    def of(cls, spec) -> RecoveryPolicy:
        """The policy of a ``JobSpec`` whose defaults the server filled in."""
        return cls(
            on_nonfinite=spec.on_nonfinite or server_default("on_nonfinite"),
            spike_zscore=spec.spike_zscore if spec.HasField("spike_zscore") else None,
            spike_window=spec.spike_window,
            max_rollbacks=spec.max_rollbacks,
            lr_scale=spec.rollback_lr_scale
            if spec.HasField("rollback_lr_scale")
            else server_default("rollback_lr_scale"),
        )

    @property
    def active(self) -> bool:
        """Whether it ever acts on a loss (``warn`` alone only logs, as the trainer always has)."""
        return self.on_nonfinite != "warn" or self.spike_zscore is not None


class Recovery:
    """One worker run's recovery: which losses trip the policy, and how many rollbacks are left."""

    def __init__(self, policy: RecoveryPolicy):
        self.policy = policy
        self._detector = (
            SpikeDetector(policy.spike_zscore, policy.spike_window) if policy.spike_zscore is not None else None
        )
        self.rollbacks = 0
        self.lr_scale = 1.0  # the learning rate's factor now

    def check(self, step: int, loss: float) -> Trip | None:
        """Whether the loss of ``step`` (the same on every rank) calls for a rollback.

        Raises :class:`NonfiniteLoss` under ``on_nonfinite: fail``.
        """
        if not math.isfinite(loss):
            if self.policy.on_nonfinite == "fail":
                raise NonfiniteLoss(f"step {step}: the loss is {loss} (on_nonfinite: fail)")
            return Trip(Cause.NONFINITE, loss) if self.policy.on_nonfinite == "rollback" else None
        z = self._detector.observe(loss) if self._detector is not None else None
        return Trip(Cause.LOSS_SPIKE, loss, z) if z is not None else None

    def roll_back(self, step: int, trip: Trip, checkpoint: int) -> None:
        """Count a rollback from ``step`` to checkpoint ``checkpoint`` (0: none) and scale the learning rate.

        Raises :class:`RollbacksExhausted` past ``max_rollbacks``, or when there is no checkpoint to go back to.
        """
        what = f"{trip.cause} at step {step} (loss {trip.loss:.4g})"
        if self.rollbacks >= self.policy.max_rollbacks:
            raise RollbacksExhausted(f"{what}: already rolled back {self.rollbacks} times (max_rollbacks)")
        if not checkpoint:
            raise RollbacksExhausted(f"{what}: no checkpoint to roll back to yet (see checkpoint_every)")
        self.rollbacks += 1
        self.lr_scale *= self.policy.lr_scale
