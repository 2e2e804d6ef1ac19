"""Who may switch on attack simulation, and its typed configuration.

Attack simulation makes chosen workers of a job behave maliciously so that
the anomaly screening can be evaluated. It is for evaluation only: only an
admin or the benchmark harness may enable it. The server must pass the
``attack`` section of every job spec through ``parse_attack_config`` with the
origin of the spec; a tenant-origin spec that carries any attack section is
refused with ``AttackNotPermitted`` (a ``PermissionError``), never silently
dropped into a running job.

This lives in ``cantata.security`` so the server can enforce it without
importing the trainer; ``cantata.trainer.attacks`` implements the attacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any


class AttackKind(str, Enum):
    SIGN_FLIP = "sign_flip"
    SCALE = "scale"
    GAUSSIAN = "gaussian"
    NAN = "nan"
    ALIE = "alie"
    IPM = "ipm"
    DISSENSUS = "dissensus"


# Attacks a real worker can mount from its own update alone; the omniscient
# ones (ALIE, IPM, dissensus) need every honest vector and run in the benchmark.
OWN_FRAME_ATTACKS = frozenset({AttackKind.SIGN_FLIP, AttackKind.SCALE, AttackKind.GAUSSIAN, AttackKind.NAN})


class SpecOrigin(Enum):
    """Who a job spec came from, as the server learned it from the caller's certificate."""

    ADMIN = "admin"
    BENCHMARK = "benchmark"
    TENANT = "tenant"


class AttackNotPermitted(PermissionError):
    """A spec from an origin that may not enable attack simulation asked for it."""


class InvalidAttackConfig(ValueError):
    """An attack section that does not parse into an ``AttackConfig``."""


@dataclass(frozen=True)
class AttackConfig:
    """Which workers attack, how, and from which round.

    ``scale`` is the factor of ``scale``; ``sigma`` the noise std of
    ``gaussian``; ``alie_z`` the z of ALIE (None: the paper's z_max for n
    workers and the Byzantine count); ``ipm_epsilon`` and
    ``dissensus_epsilon`` the epsilons of IPM and dissensus.
    """

    kind: AttackKind
    workers: frozenset[int]
    start_round: int = 0
    scale: float = 10.0
    sigma: float = 0.1
    alie_z: float | None = None
    ipm_epsilon: float = 0.1
    dissensus_epsilon: float = 1.5

    def __post_init__(self) -> None:
        if not self.workers or any(w < 0 for w in self.workers):
            raise InvalidAttackConfig("an attack needs at least one worker index, all >= 0")
        if self.start_round < 0 or self.sigma < 0 or self.ipm_epsilon < 0 or self.dissensus_epsilon < 0:
            raise InvalidAttackConfig("start_round, sigma and the epsilons must be >= 0")

    def attacks(self, worker: int, round: int) -> bool:
        return worker in self.workers and round >= self.start_round


_MAY_ATTACK = frozenset({SpecOrigin.ADMIN, SpecOrigin.BENCHMARK})
_OPTIONAL_FIELDS = {f.name: f for f in fields(AttackConfig) if f.name not in ("kind", "workers")}


def parse_attack_config(raw: Mapping[str, Any] | None, origin: SpecOrigin) -> AttackConfig | None:
    """The typed attack section of a job spec, or None when there is none.

    Raises ``AttackNotPermitted`` for a tenant-origin spec with any attack
    section, and ``InvalidAttackConfig`` for a malformed one.
    """
    if raw is None:
        return None
    if origin not in _MAY_ATTACK:
        raise AttackNotPermitted(f"a {origin.value} job spec may not enable attack simulation")
    if not isinstance(raw, Mapping):
        raise InvalidAttackConfig("the attack section must be a mapping")
    unknown = set(raw) - {"kind", "workers", *_OPTIONAL_FIELDS}
    if unknown:
        raise InvalidAttackConfig(f"unknown attack fields: {', '.join(sorted(unknown))}")
    try:
        kind = AttackKind(raw["kind"])
    except (KeyError, ValueError) as error:
        kinds = ", ".join(k.value for k in AttackKind)
        raise InvalidAttackConfig(f"attack kind must be one of {kinds}") from error
    workers = raw.get("workers")
    if not isinstance(workers, (list, tuple, set, frozenset)) or not all(
        isinstance(w, int) and not isinstance(w, bool) for w in workers
    ):
        raise InvalidAttackConfig("attack workers must be a list of worker indices")
    options: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _OPTIONAL_FIELDS:
            options[name] = _typed(name, value)
    return AttackConfig(kind=kind, workers=frozenset(workers), **options)


def _typed(name: str, value: Any) -> Any:
    if name == "start_round":
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidAttackConfig("start_round must be an integer")
        return value
    if name == "alie_z" and value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidAttackConfig(f"{name} must be a number")
    return float(value)
