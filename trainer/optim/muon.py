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

from cantata.proto.jobfields import MUON_FIELDS, server_default
from cantata.proto.vocabulary import NsDtype, Optimizer

# The job-field table's defaults of the Muon and Canzona fields, which an unset field of a spec takes.
MUON_DEFAULTS = {f.name: server_default(f.name, optimizer=Optimizer.MUON) for f in MUON_FIELDS}
NS_DTYPES = {NsDtype.FLOAT32: torch.float32, NsDtype.BFLOAT16: torch.bfloat16}


@dataclass(frozen=True)
class MuonConfig:
    """Hyperparameters of Muon other than the learning rate and weight decay.

    `ns_dtype` is the precision of the Newton-Schulz iteration: bfloat16 (as in
    torch.optim.Muon and most GPU recipes) or float32 (exact reproducibility).
    """

    momentum: float = MUON_DEFAULTS["muon_momentum"]
    nesterov: bool = True
    ns_steps: int = MUON_DEFAULTS["muon_ns_steps"]
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    eps: float = 1e-7
    ns_dtype: torch.dtype = NS_DTYPES[MUON_DEFAULTS["muon_ns_dtype"]]

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 1 <= self.ns_steps < 100:
            raise ValueError(f"ns_steps must be in [1, 100), got {self.ns_steps}")
        if self.ns_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"ns_dtype must be float32 or bfloat16, got {self.ns_dtype}")


def newton_schulz(matrix: Tensor, config: MuonConfig) -> Tensor:
    """Approximately orthogonalize a matrix, or each matrix of a [batch, rows, cols] stack, with the
    quintic Newton-Schulz iteration."""
    if matrix.ndim not in (2, 3):
        raise ValueError(f"Newton-Schulz needs a matrix or a stack of matrices, got shape {tuple(matrix.shape)}")
    a, b, c = config.ns_coefficients
    x = matrix.to(config.ns_dtype)
    tall = matrix.size(-2) > matrix.size(-1)
    if tall:
        x = x.mT
    if x.ndim == 2:
        x = x / x.norm().clamp(min=config.eps)
        for _ in range(config.ns_steps):
            gram = x @ x.T
            polynomial = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, polynomial, x, beta=a)
    else:
        x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=config.eps)
        for _ in range(config.ns_steps):
            gram = x @ x.mT
            polynomial = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, polynomial, x, beta=a)
    return x.mT if tall else x


def rms_scale(shape: torch.Size | tuple[int, ...]) -> float:
    """The factor that gives an orthogonalized update AdamW's RMS: 0.2 * sqrt(max(A, B)) of one whole matrix."""
    rows, cols = shape[-2], shape[-1]
    return 0.2 * math.sqrt(max(rows, cols))


def rms_matched_lr(lr: float, shape: torch.Size | tuple[int, ...]) -> float:
    """Learning rate that gives the update AdamW's RMS: lr * 0.2 * sqrt(max(A, B)) of the full shape."""
    return lr * rms_scale(shape)


def check_splits(name: str, shape: tuple[int, ...], splits: tuple[int, ...]) -> None:
    """A fused projection's sub-matrix row counts must be positive and add up to its rows (dim -2)."""
    if len(shape) not in (2, 3):
        raise ValueError(f"Muon updates matrices or stacks of them; {name!r} has shape {tuple(shape)}")
    if splits and (min(splits) <= 0 or sum(splits) != shape[-2]):
        raise ValueError(f"{name!r}: split sizes {splits} do not add up to its {shape[-2]} rows")


def orthogonalized(direction: Tensor, config: MuonConfig, splits: tuple[int, ...] = ()) -> Tensor:
    """Newton-Schulz of each sub-matrix (rows split by `splits`; all rows when empty), each RMS-scaled by its
    own shape: a fused qkv or gate/up projection is orthogonalized as its separate matrices."""
    blocks = direction.split(list(splits), dim=-2) if splits else (direction,)
    return torch.cat(
        [newton_schulz(block, config).to(block.dtype) * rms_scale(block.shape) for block in blocks], dim=-2
    )


def muon_direction(grad: Tensor, momentum_buffer: Tensor, config: MuonConfig, splits: tuple[int, ...] = ()) -> Tensor:
    """Advance the momentum buffer in place and return the (Nesterov) step direction, orthogonalized and
    RMS-scaled; the step is -lr times it. `grad` is the whole matrix (or stack), never a slice of it."""
    momentum_buffer.lerp_(grad, 1 - config.momentum)
    direction = grad.lerp(momentum_buffer, config.momentum) if config.nesterov else momentum_buffer
    return orthogonalized(direction, config, splits)


def apply_direction(param: Tensor, direction: Tensor, *, lr: float, weight_decay: float) -> None:
    """Decoupled weight decay, then step along `direction` (of a whole matrix, or the matching piece of it)."""
    param.mul_(1 - lr * weight_decay)
    param.add_(direction.to(param.dtype), alpha=-lr)


def muon_update_(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    lr: float,
    weight_decay: float,
    config: MuonConfig,
    splits: tuple[int, ...] = (),
) -> None:
    """One Muon step on a whole matrix (or stack of expert matrices), in place."""
    direction = muon_direction(grad, momentum_buffer, config, splits)
    apply_direction(param, direction, lr=lr, weight_decay=weight_decay)


class Muon(torch.optim.Optimizer):
    """Single-process Muon for hidden matrices (pair it with AdamW for the rest).

    A 3-D parameter is a stack of expert matrices, each orthogonalized on its own. A param group's
    "splits" option (row counts, default none) marks its parameters as fused projections whose
    sub-matrices are orthogonalized separately, e.g. {"params": [qkv], "splits": (q, k, v)}.
    """

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
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "splits": ()})
        self.config = config
        for group in self.param_groups:
            group["splits"] = tuple(group["splits"])
            for p in group["params"]:
                check_splits("parameter", tuple(p.shape), group["splits"])

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
                    splits=group["splits"],
                )
        return loss
