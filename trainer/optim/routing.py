"""Decide which parameters Muon updates and which AdamW updates, and how Muon sees each one.

Rule: the 2-D weight of an `nn.Linear` is a hidden matrix and goes to Muon; so
does a 3-D parameter outside convolutions (a stack of MoE expert matrices, each
orthogonalized on its own). Embeddings, the output head, norms and biases go to
AdamW. A weight tied to an embedding counts as the embedding. Name patterns
(fnmatch) override the rule.

Fused projections (qkv, gate/up) are declared by name pattern -> row counts of
their sub-matrices, given to `route_parameters` or set by the model as a
`muon_splits` attribute; Muon orthogonalizes each sub-matrix separately. Names
are the model's own, so a model wrapped by `fully_shard` or
`parallelize_module` keeps its declarations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import torch
from torch import nn

from .muon import check_splits

DEFAULT_ADAMW_PATTERNS: tuple[str, ...] = ("lm_head.*", "*.lm_head.*")
SPLITS_ATTRIBUTE = "muon_splits"


@dataclass(frozen=True)
class ParameterRouting:
    """Named parameters split between Muon and AdamW, each in model order, and the declared fused splits."""

    muon: tuple[tuple[str, nn.Parameter], ...]
    adamw: tuple[tuple[str, nn.Parameter], ...]
    splits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def route_parameters(
    model: nn.Module,
    *,
    muon_patterns: tuple[str, ...] = (),
    adamw_patterns: tuple[str, ...] = DEFAULT_ADAMW_PATTERNS,
    splits: Mapping[str, Sequence[int]] | None = None,
) -> ParameterRouting:
    """Split the trainable parameters of `model`; a Muon pattern wins over an AdamW pattern.

    `splits` (fnmatch pattern -> row counts) adds to the model's own `muon_splits`; a pattern that
    names an AdamW parameter, or row counts that do not add up, are errors.
    """
    declared = {**getattr(model, SPLITS_ATTRIBUTE, {}), **(splits or {})}
    weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    convolutions = {id(p) for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd) for p in m.parameters()}
    muon: list[tuple[str, nn.Parameter]] = []
    adamw: list[tuple[str, nn.Parameter]] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if any(fnmatchcase(name, pattern) for pattern in muon_patterns):
            if param.ndim not in (2, 3):
                raise ValueError(
                    f"pattern routes {name!r} to Muon but its shape {tuple(param.shape)} is not 2-D or 3-D"
                )
            muon.append((name, param))
        elif any(fnmatchcase(name, pattern) for pattern in adamw_patterns):
            adamw.append((name, param))
        elif _is_hidden(param, weights, embeddings, convolutions):
            muon.append((name, param))
        else:
            adamw.append((name, param))
    found: dict[str, tuple[int, ...]] = {}
    for pattern, sizes in declared.items():
        matched = [(name, param) for name, param in model.named_parameters() if fnmatchcase(name, pattern)]
        if not matched:
            raise ValueError(f"split pattern {pattern!r} names no parameter")
        for name, param in matched:
            if all(name != routed for routed, _ in muon):
                raise ValueError(f"split pattern {pattern!r} names {name!r}, which is not updated by Muon")
            found[name] = tuple(int(size) for size in sizes)
            check_splits(name, tuple(param.shape), found[name])
    return ParameterRouting(muon=tuple(muon), adamw=tuple(adamw), splits=found)


def _is_hidden(param: torch.Tensor, weights: set[int], embeddings: set[int], convolutions: set[int]) -> bool:
    if id(param) in embeddings or id(param) in convolutions:
        return False
    return (param.ndim == 2 and id(param) in weights) or param.ndim == 3
