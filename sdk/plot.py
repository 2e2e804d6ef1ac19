"""Loss curves of a job, drawn from its events."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cantata.sdk.client import Event, JobStatus


def plot_losses(status: JobStatus, events: list[Event], out: Path) -> Path:
    """Training loss per step and validation loss at each evaluation, as a PNG."""
    train = [(e.step, e.loss) for e in events if e.kind == "PROGRESS"]
    val = [(e.step, e.val_loss) for e in events if e.kind == "EVAL"]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="training loss", linewidth=1)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title(f"{status.name} ({status.id}): {status.state.lower()}, {status.algorithm} x{status.workers}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
