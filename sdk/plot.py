"""Curves of one or several jobs, overlaid, from their metrics history (so a running job plots too)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cantata.sdk.client import JobStatus, MetricRow

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
