"""Gradient-anomaly detection: screening, robust mixing, quarantine, attack policy.

The names below are imported when first used (PEP 562), so that the control
plane, which needs only the attack policy, never imports torch through here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .attack_policy import (
        AttackConfig,
        AttackKind,
        AttackNotPermitted,
        InvalidAttackConfig,
        SpecOrigin,
        parse_attack_config,
    )
    from .clipping import AdaptiveRadius, ClipRule, FixedRadius, clip, clipped_gossip
    from .opposition import Opposition, find_opposition, opposition_from_gram
    from .quarantine import AnomalyEvent, AnomalyKind, Quarantine, QuarantinePolicy
    from .screening import (
        CheckResult,
        LayerLayout,
        RobustWindow,
        RoundScreening,
        ScreeningConfig,
        ScreeningResult,
        UpdateScreener,
        Verdict,
        make_canary,
    )

_EXPORTS = {
    "AttackConfig": "attack_policy",
    "AttackKind": "attack_policy",
    "AttackNotPermitted": "attack_policy",
    "InvalidAttackConfig": "attack_policy",
    "SpecOrigin": "attack_policy",
    "parse_attack_config": "attack_policy",
    "AdaptiveRadius": "clipping",
    "ClipRule": "clipping",
    "FixedRadius": "clipping",
    "clip": "clipping",
    "clipped_gossip": "clipping",
    "Opposition": "opposition",
    "find_opposition": "opposition",
    "opposition_from_gram": "opposition",
    "AnomalyEvent": "quarantine",
    "AnomalyKind": "quarantine",
    "Quarantine": "quarantine",
    "QuarantinePolicy": "quarantine",
    "CheckResult": "screening",
    "LayerLayout": "screening",
    "RobustWindow": "screening",
    "RoundScreening": "screening",
    "ScreeningConfig": "screening",
    "ScreeningResult": "screening",
    "UpdateScreener": "screening",
    "Verdict": "screening",
    "make_canary": "screening",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AdaptiveRadius",
    "AnomalyEvent",
    "AnomalyKind",
    "AttackConfig",
    "AttackKind",
    "AttackNotPermitted",
    "CenteredClipping",
    "CheckResult",
    "ClipRule",
    "FixedRadius",
    "InvalidAttackConfig",
    "LayerLayout",
    "Opposition",
    "Quarantine",
    "QuarantinePolicy",
    "RobustWindow",
    "RoundScreening",
    "ScreeningConfig",
    "ScreeningResult",
    "SpecOrigin",
    "UpdateScreener",
    "Verdict",
    "WorkerMomentum",
    "clip",
    "clipped_gossip",
    "coordinate_median",
    "find_opposition",
    "krum_scores",
    "make_canary",
    "multi_krum",
    "opposition_from_gram",
    "parse_attack_config",
    "trimmed_mean",
]
