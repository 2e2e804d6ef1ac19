"""Cost models of whole-matrix optimizer updates, used to balance ownership."""

from __future__ import annotations


def newton_schulz_flops(shape: tuple[int, int], ns_steps: int = 5) -> float:
    """Muon's Newton-Schulz cost: ns_steps * 4 * max(m, n) * min(m, n)^2 FLOPs."""
    rows, cols = shape
    large, small = max(rows, cols), min(rows, cols)
    return float(ns_steps * 4 * large * small * small)


def soap_flops(shape: tuple[int, int], precondition_frequency: int = 10) -> float:
    """SOAP's cost per step: 2r^2c + 2c^2r, plus ~7.3(r^3 + c^3) amortized over the preconditioning frequency."""
    rows, cols = shape
    per_step = 2 * rows * rows * cols + 2 * cols * cols * rows
    eigenbasis = 7.3 * (rows**3 + cols**3) / precondition_frequency
    return float(per_step + eigenbasis)


COST_UNITS = ("flops", "numel")


def update_cost(
    shape: tuple[int, ...], *, unit: str = "flops", splits: tuple[int, ...] = (), ns_steps: int = 5
) -> float:
    """What one Muon update of a parameter weighs for the partitioner.

    "flops" counts Newton-Schulz FLOPs of each sub-matrix (a fused projection's parts and a stack's
    experts run separately); "numel" counts elements, as the authors' partitioner does.
    """
    if unit not in COST_UNITS:
        raise ValueError(f"cost unit must be one of {COST_UNITS}, got {unit!r}")
    batch = shape[0] if len(shape) == 3 else 1
    rows, cols = shape[-2], shape[-1]
    if unit == "numel":
        return float(batch * rows * cols)
    return float(batch * sum(newton_schulz_flops((part, cols), ns_steps) for part in (splits or (rows,))))
