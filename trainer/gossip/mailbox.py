"""One worker's gossip state: its own payload for the current round, and what peers sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import torch

from .chunks import Assembly


class Mailbox:
    """Thread-safe hand-over between ``GossipNode.exchange`` and the links serving it.

    Posting round r forgets everything of earlier rounds, so a late peer can
    neither fetch a stale payload nor slip one into a later round.

    Receive buffers are recycled: the buffers behind the payloads handed out
    by ``collect`` are reused once the next round is posted (fresh memory costs
    page faults that take longer than the copy into it). Buffers of payloads
    that never completed are not reused, as a late stream may still write them.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._round = -1
        self._outgoing: torch.Tensor | None = None
        self._assemblies: dict[int, Assembly] = {}
        self._delivered: dict[int, Assembly] = {}
        self._handed_out: list[bytearray] = []
        self._spare: list[bytearray] = []

    def post(self, round: int, payload: torch.Tensor) -> None:
        with self._cond:
            if round <= self._round:
                raise ValueError(f"round {round} is not after round {self._round}")
            size = payload.numel() * payload.element_size()
            self._spare = [b for b in self._spare + self._handed_out if len(b) == size]
            self._handed_out = []
            self._round = round
            self._outgoing = payload
            self._assemblies = {}
            self._delivered = {}
            self._cond.notify_all()

    def outgoing(self, round: int, timeout: float) -> torch.Tensor | None:
        """Our payload for ``round``, waiting up to ``timeout`` s for it to be posted."""
        with self._cond:
            self._cond.wait_for(lambda: self._round >= round, timeout=timeout)
            return self._outgoing if self._round == round else None

    def assembly(self, round: int, peer: int) -> Assembly | None:
        """Where ``peer``'s payload for ``round`` is put together; None if the round is not current."""
        with self._cond:
            outgoing = self._outgoing
            if round != self._round or outgoing is None:
                return None
            if peer not in self._assemblies:
                size = outgoing.numel() * outgoing.element_size()
                buffer = self._spare.pop() if self._spare else bytearray(size)
                self._assemblies[peer] = Assembly(round, peer, buffer)
            return self._assemblies[peer]

    def deliver(self, assembly: Assembly) -> None:
        """Record a complete payload, if its round is still current."""
        with self._cond:
            if assembly.round == self._round and self._assemblies.get(assembly.sender) is assembly:
                self._delivered[assembly.sender] = assembly
                self._cond.notify_all()

    def collect(self, round: int, peers: Iterable[int], deadline: float) -> dict[int, torch.Tensor]:
        """The peers' payloads for ``round``, once all arrived or ``deadline`` (monotonic) passed.

        The tensors are views of receive buffers that the next round reuses.
        """
        wanted = set(peers)
        with self._cond:
            self._cond.wait_for(
                lambda: self._round != round or wanted <= self._delivered.keys(),
                timeout=max(0.0, deadline - time.monotonic()),
            )
            if self._round != round:
                return {}
            received = {p: self._delivered.pop(p) for p in wanted & self._delivered.keys()}
            self._handed_out.extend(a.buffer for a in received.values())
            self._assemblies = {}  # late stripes can no longer complete a payload for this round
            return {p: a.tensor() for p, a in received.items()}
