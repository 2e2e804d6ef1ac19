"""Quarantine of peers that keep sending rejected updates.

A peer whose updates were rejected ``rejections`` times within the last
``window`` rounds is quarantined for the rest of the job: the worker stops
mixing it in, its mixing weight goes to the worker's own value, and the worker
reports an ``AnomalyEvent`` to the server, which records it in the audit log
(``gradient_anomaly_detected`` for every rejection, ``peer_quarantined`` once).

A worker that the server restarted rejoins from the job's last checkpoint,
rounds behind its neighbours, so for a while its updates look too far off to
them although it is honest (and so may its neighbours', which mix its older
model meanwhile). So for ``window`` rounds after a restart (``grace``, given
to every peer) rejections are still rejections, and still reported, but do
not count towards quarantine. Only the server restarts a worker, a bounded
number of times, so a peer cannot buy itself this grace that way. A peer
that was late (missed a round: paused, slow, or gone a while) gets the same
grace, as lateness is no evidence of lying; what it sends is still screened,
and a rejected update is still never mixed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .screening import ScreeningResult, Verdict


class AnomalyKind(str, Enum):
    """The audit action the server records for an event."""

    ANOMALY_DETECTED = "gradient_anomaly_detected"
    PEER_QUARANTINED = "peer_quarantined"


@dataclass(frozen=True)
class AnomalyEvent:
    """What a worker reports to the server about one peer."""

    kind: AnomalyKind
    worker: int
    peer: int
    round: int
    scores: Mapping[str, float]
    rejections_in_window: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "worker": self.worker,
            "peer": self.peer,
            "round": self.round,
            "scores": dict(self.scores),
            "rejections_in_window": self.rejections_in_window,
        }


@dataclass(frozen=True)
class QuarantinePolicy:
    """Quarantine after ``rejections`` rejected updates within ``window`` rounds."""

    rejections: int = 3
    window: int = 10

    def __post_init__(self) -> None:
        if self.rejections < 1 or self.window < 1:
            raise ValueError("rejections and window must both be >= 1")


@dataclass
class Quarantine:
    """One worker's record of its peers' rejections and of who is quarantined."""

    worker: int
    policy: QuarantinePolicy = field(default_factory=QuarantinePolicy)
    quarantined: set[int] = field(default_factory=set)
    _rejected_rounds: dict[int, deque[int]] = field(default_factory=dict)
    _grace_until: dict[int, int] = field(default_factory=dict)  # peer -> first round its rejections count again

    def record(self, round: int, result: ScreeningResult) -> list[AnomalyEvent]:
        """Note one screening result; return the events it gives rise to."""
        if result.verdict is not Verdict.REJECT or result.peer in self.quarantined:
            return []
        rounds = self._rejected_rounds.setdefault(result.peer, deque())
        if round >= self._grace_until.get(result.peer, round):
            rounds.append(round)
        while rounds and rounds[0] <= round - self.policy.window:
            rounds.popleft()
        count = len(rounds)
        event = AnomalyEvent(AnomalyKind.ANOMALY_DETECTED, self.worker, result.peer, round, result.scores(), count)
        if count < self.policy.rejections:
            return [event]
        self.quarantined.add(result.peer)
        del self._rejected_rounds[result.peer]
        return [
            event,
            AnomalyEvent(AnomalyKind.PEER_QUARANTINED, self.worker, result.peer, round, result.scores(), count),
        ]

    def grace(self, peer: int, round: int) -> None:
        """``peer`` was restarted, or late, at ``round``: its rejections count from ``round + window`` on."""
        self._grace_until[peer] = round + self.policy.window
        self._rejected_rounds.pop(peer, None)

    def in_grace(self, peer: int, round: int) -> bool:
        """Whether ``peer``'s rejections at ``round`` do not count (it was restarted or late within a window)."""
        return round < self._grace_until.get(peer, round)

    def is_quarantined(self, peer: int) -> bool:
        return peer in self.quarantined

    def mixing_row(self, row: Mapping[int, float]) -> dict[int, float]:
        """A row of the mixing matrix (``{worker: weight}``, self included) with
        every quarantined peer's weight moved onto the worker itself."""
        if self.worker not in row:
            raise ValueError(f"the row must hold the worker's own weight (worker {self.worker})")
        moved = sum(weight for peer, weight in row.items() if peer in self.quarantined)
        result = {peer: weight for peer, weight in row.items() if peer not in self.quarantined}
        result[self.worker] += moved
        return result
