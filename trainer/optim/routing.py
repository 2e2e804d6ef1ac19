"""Decide which parameters Muon updates and which AdamW updates.

Rule: the 2-D weight of an `nn.Linear` is a hidden matrix and goes to Muon;
embeddings, the output head, norms and biases go to AdamW. A weight tied to an
embedding counts as the embedding. Name patterns (fnmatch) override the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch
from torch import nn

DEFAULT_ADAMW_PATTERNS: tuple[str, ...] = ("lm_head.*", "*.lm_head.*")


@dataclass(frozen=True)
class ParameterRouting:
    """Named parameters split between Muon and AdamW, each in model order."""

    muon: tuple[tuple[str, nn.Parameter], ...]
    adamw: tuple[tuple[str, nn.Parameter], ...]


def route_parameters(
    model: nn.Module,
    *,
    muon_patterns: tuple[str, ...] = (),
    adamw_patterns: tuple[str, ...] = DEFAULT_ADAMW_PATTERNS,
) -> ParameterRouting:
    """Split the trainable parameters of `model`; a Muon pattern wins over an AdamW pattern."""
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    muon: list[tuple[str, nn.Parameter]] = []
    adamw: list[tuple[str, nn.Parameter]] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if any(fnmatchcase(name, pattern) for pattern in muon_patterns):
            if param.ndim != 2:
                raise ValueError(f"pattern routes {name!r} to Muon but its shape {tuple(param.shape)} is not 2-D")
            muon.append((name, param))
        elif any(fnmatchcase(name, pattern) for pattern in adamw_patterns):
            adamw.append((name, param))
        elif _is_hidden_matrix(param, linear_weights, embedding_weights):
            muon.append((name, param))
        else:
            adamw.append((name, param))
    return ParameterRouting(muon=tuple(muon), adamw=tuple(adamw))


def _is_hidden_matrix(param: torch.Tensor, linear_weights: set[int], embedding_weights: set[int]) -> bool:
    return param.ndim == 2 and id(param) in linear_weights and id(param) not in embedding_weights
