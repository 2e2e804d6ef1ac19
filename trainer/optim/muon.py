"""Muon: Nesterov momentum orthogonalized by Newton-Schulz, RMS-matched to AdamW.

The per-matrix math lives in plain functions so that the single-process
optimizer, the data-parallel owner update and the tensor-parallel host update
all run exactly the same arithmetic on a whole (never sliced) matrix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MuonConfig:
    """Hyperparameters of Muon other than the learning rate and weight decay.

    `ns_dtype` is the precision of the Newton-Schulz iteration: bfloat16 (as in
    torch.optim.Muon and most GPU recipes) or float32 (exact reproducibility).
    """

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    eps: float = 1e-7
    ns_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 1 <= self.ns_steps < 100:
            raise ValueError(f"ns_steps must be in [1, 100), got {self.ns_steps}")
        if self.ns_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"ns_dtype must be float32 or bfloat16, got {self.ns_dtype}")


def newton_schulz(matrix: Tensor, config: MuonConfig) -> Tensor:
    """Approximately orthogonalize a 2-D matrix with the quintic Newton-Schulz iteration."""
    if matrix.ndim != 2:
        raise ValueError(f"Newton-Schulz needs a 2-D matrix, got shape {tuple(matrix.shape)}")
    a, b, c = config.ns_coefficients
    x = matrix.to(config.ns_dtype)
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=config.eps)
    for _ in range(config.ns_steps):
        gram = x @ x.T
        polynomial = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, polynomial, x, beta=a)
    return x.T if tall else x


def rms_matched_lr(lr: float, shape: torch.Size | tuple[int, ...]) -> float:
    """Learning rate that gives the update AdamW's RMS: lr * 0.2 * sqrt(max(A, B)) of the full shape."""
    rows, cols = shape[0], shape[1]
    return lr * 0.2 * math.sqrt(max(rows, cols))


def orthogonalized_momentum(grad: Tensor, momentum_buffer: Tensor, config: MuonConfig) -> Tensor:
    """Advance the momentum buffer in place and return the orthogonalized (Nesterov) direction."""
    momentum_buffer.lerp_(grad, 1 - config.momentum)
    direction = grad.lerp(momentum_buffer, config.momentum) if config.nesterov else momentum_buffer
    return newton_schulz(direction, config)


def apply_update(
    param: Tensor, direction: Tensor, *, lr: float, weight_decay: float, full_shape: tuple[int, ...]
) -> None:
    """Decoupled weight decay, then step along `direction` (a whole matrix or its shard of `full_shape`)."""
    param.mul_(1 - lr * weight_decay)
    param.add_(direction.to(param.dtype), alpha=-rms_matched_lr(lr, full_shape))


def muon_update_(
    param: Tensor, grad: Tensor, momentum_buffer: Tensor, *, lr: float, weight_decay: float, config: MuonConfig
) -> None:
    """One Muon step on a whole matrix, in place."""
    direction = orthogonalized_momentum(grad, momentum_buffer, config)
    apply_update(param, direction, lr=lr, weight_decay=weight_decay, full_shape=param.shape)


class Muon(torch.optim.Optimizer):
    """Single-process Muon for 2-D hidden matrices (pair it with AdamW for the rest)."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        config: MuonConfig = MuonConfig(),
    ) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self.config = config
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon updates 2-D matrices only, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                muon_update_(
                    p,
                    p.grad,
                    state["momentum_buffer"],
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    config=self.config,
                )
        return loss
