"""Gradient-anomaly detection: screening, robust mixing, quarantine, attack policy."""

from .aggregators import CenteredClipping, WorkerMomentum, coordinate_median, krum_scores, multi_krum, trimmed_mean
from .attack_policy import (
    AttackConfig,
    AttackKind,
    AttackNotPermitted,
    InvalidAttackConfig,
    SpecOrigin,
    parse_attack_config,
)
from .clipping import AdaptiveRadius, ClipRule, FixedRadius, clip, clipped_gossip
from .quarantine import AnomalyEvent, AnomalyKind, Quarantine, QuarantinePolicy
from .screening import (
    CheckResult,
    LayerLayout,
    RobustWindow,
    ScreeningConfig,
    ScreeningResult,
    UpdateScreener,
    Verdict,
)

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
    "Quarantine",
    "QuarantinePolicy",
    "RobustWindow",
    "ScreeningConfig",
    "ScreeningResult",
    "SpecOrigin",
    "UpdateScreener",
    "Verdict",
    "WorkerMomentum",
    "clip",
    "clipped_gossip",
    "coordinate_median",
    "krum_scores",
    "multi_krum",
    "parse_attack_config",
    "trimmed_mean",
]
