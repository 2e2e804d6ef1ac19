"""Attack simulation, for evaluating the anomaly screening only.

A worker named in an ``AttackConfig`` replaces the vector it sends with a
malicious one. Only an admin or the benchmark harness can enable this: the
server parses a job's attack section with
``cantata.security.anomaly.parse_attack_config``, which refuses any
tenant-origin spec that carries one.

An attack maps vectors to a vector, all in one frame: updates relative to
some round-start parameters (pseudo-gradients on the complete graph).
``sign_flip``, ``scale``, ``gaussian`` and ``nan`` (``OWN_FRAME_ATTACKS``)
need only the attacker's own update, taken relative to its own round-start
parameters, as a compromised worker would do. ``alie``, ``ipm`` and
``dissensus`` model an omniscient attacker that sees the honest vectors and
crafts a vector per receiver, in the receiver's frame:

- ``sign_flip``: ``-own``;
- ``scale``: ``scale * own``;
- ``gaussian``: ``own + sigma * N(0, I)``;
- ``nan``: every entry NaN;
- ``alie`` (Baruch et al. 2019): ``mean(H) - z * std(H)`` per coordinate;
- ``ipm`` (Xie et al. 2020): ``-epsilon * mean(H)``;
- ``dissensus`` (He et al. 2022):
  ``x_i - epsilon * sum_k W_ik (x_k - x_i) / sum_{j Byzantine} W_ij``, which
  cancels receiver i's pull towards its honest neighbours and pushes it away.

``own`` is the vector the attacker would honestly have sent, ``H`` the honest
vectors it observes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

from cantata.security.anomaly.attack_policy import OWN_FRAME_ATTACKS, AttackConfig, AttackKind

__all__ = ["OWN_FRAME_ATTACKS", "AttackView", "alie_z_max", "craft"]


@dataclass(frozen=True)
class AttackView:
    """What the attacker sees when crafting its vector for one receiver.

    ``honest`` holds the observed honest vectors as rows (the receiver's own
    among them); ``honest_weights`` the receiver's mixing weight on each row
    and ``byzantine_weight`` its total weight on Byzantine peers (dissensus).
    ``workers`` and ``byzantine`` count the inputs of the receiver's aggregation
    (its own included) and the Byzantine ones among them: ALIE's n and f.
    """

    own: torch.Tensor
    honest: torch.Tensor
    receiver: torch.Tensor
    honest_weights: torch.Tensor
    byzantine_weight: float
    workers: int
    byzantine: int


def alie_z_max(workers: int, byzantine: int) -> float:
    """ALIE's z_max: ``s = floor(n/2 + 1) - m``, ``z = Phi^-1((n - s) / n)``."""
    supporters = math.floor(workers / 2 + 1) - byzantine
    return NormalDist().inv_cdf((workers - supporters) / workers)


def craft(config: AttackConfig, view: AttackView, generator: torch.Generator) -> torch.Tensor:
    """The vector a Byzantine worker sends to the receiver described by ``view``."""
    kind = config.kind
    if kind is AttackKind.SIGN_FLIP:
        return -view.own
    if kind is AttackKind.SCALE:
        return config.scale * view.own
    if kind is AttackKind.GAUSSIAN:
        noise = torch.randn(view.own.shape, generator=generator, dtype=view.own.dtype, device=generator.device)
        noise = noise.to(view.own.device)
        return view.own + config.sigma * noise
    if kind is AttackKind.NAN:
        return torch.full_like(view.own, math.nan)
    if kind is AttackKind.ALIE:
        z = alie_z_max(view.workers, view.byzantine) if config.alie_z is None else config.alie_z
        spread = view.honest.std(dim=0) if view.honest.shape[0] > 1 else torch.zeros_like(view.own)
        return view.honest.mean(dim=0) - z * spread
    if kind is AttackKind.IPM:
        return -config.ipm_epsilon * view.honest.mean(dim=0)
    if kind is AttackKind.DISSENSUS:
        if view.byzantine_weight <= 0:
            raise ValueError("dissensus needs the receiver's weight on Byzantine peers to be > 0")
        pull = (view.honest_weights.to(view.honest.dtype)[:, None] * (view.honest - view.receiver)).sum(dim=0)
        return view.receiver - config.dissensus_epsilon * pull / view.byzantine_weight
    raise ValueError(f"unknown attack kind {kind!r}")
