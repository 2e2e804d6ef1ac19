"""Curves of one or several jobs, overlaid, from their metrics history (so a running job plots too)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cantata.sdk.client import JobStatus, MetricRow
from cantata.sdk.sweeps import SweepStatus

AXES = ("step", "time")  # time: wall-clock minutes since the job's first point
LABELS = {"loss": "training loss", "val_loss": "validation loss"}


def plot_metrics(
    jobs: Mapping[str, tuple[JobStatus, Sequence[MetricRow]]],
    names: Sequence[str],
    out: Path,
    *,
    x: str = "step",
) -> Path:
    """One panel per metric in ``names``, one line per job (worker 0's series), against step or wall-clock, as a PNG."""
    if x not in AXES:
        raise ValueError(f"x must be one of {', '.join(AXES)}, not {x!r}")
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 3.2 * len(names)), dpi=120, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for job_id, (status, rows) in jobs.items():
            series = [r for r in rows if r.name == name and r.worker == 0 and r.peer is None]
            if not series:
                continue
            start = min(r.time for r in rows)
            xs = [r.step if x == "step" else (r.time - start).total_seconds() / 60 for r in series]
            ys = [r.value if math.isfinite(r.value) else math.nan for r in series]
            style = "o-" if len(series) < 30 else "-"
            ax.plot(xs, ys, style, label=f"{status.name} ({job_id}, {status.state.lower()})", linewidth=1, markersize=3)
        ax.set_ylabel(LABELS.get(name, name))
        ax.set_xlabel("step" if x == "step" else "wall-clock minutes since the job's first report")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_parallel_coordinates(status: SweepStatus, out: Path) -> Path:
    """One line per trial across its tuned fields (each axis scaled to its range, log for a wide positive one)
    to its validation loss, coloured by that loss; a pruned trial dashed, the best one thick."""
    trials = [t for t in status.trials if t.value is not None and t.params]
    axes = [*status.fields, "val_loss"]
    fig, ax = plt.subplots(figsize=(2.2 * len(axes) + 2, 4.5), dpi=120)
    columns = []
    for name in axes:
        raw = [t.value if name == "val_loss" else _number(t.params.get(name, "")) for t in trials]
        finite = [v for v in raw if v is not None and math.isfinite(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        wide = low > 0 and high / low > 100
        scale = (lambda v: math.log10(v)) if wide else (lambda v: v)
        lo, hi = scale(low), scale(high)
        columns.append([(scale(v) - lo) / (hi - lo) if v is not None and hi > lo else 0.5 for v in raw])
        ax.annotate(f"{high:.3g}", (len(columns) - 1, 1.02), ha="center", fontsize="small")
        ax.annotate(f"{low:.3g}", (len(columns) - 1, -0.06), ha="center", fontsize="small")
    losses = [t.value for t in trials if t.value is not None]
    colours = plt.get_cmap("viridis_r")
    span = (max(losses) - min(losses)) or 1.0 if losses else 1.0
    for i, t in enumerate(trials):
        best = status.best is not None and t.number == status.best.number
        ax.plot(
            range(len(axes)),
            [column[i] for column in columns],
            "--" if t.state == "PRUNED" else "-",
            color=colours((t.value - min(losses)) / span) if t.value is not None else "grey",
            linewidth=3 if best else 1,
            label=f"best: trial {t.number}" if best else None,
        )
    ax.set_xticks(range(len(axes)), axes)
    ax.set_yticks([])
    ax.set_ylim(-0.1, 1.1)
    ax.set_title(f"{status.name} ({status.id}): {len(trials)} trials, dashed: pruned")
    if status.best is not None:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
