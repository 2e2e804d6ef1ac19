"""A terminal progress bar fed by job events (step, loss, validation loss, tokens/s)."""

from __future__ import annotations

import sys

from tqdm import tqdm

from cantata.sdk.client import Event


class ProgressBar:
    def __init__(self, job_id: str, file=None):
        self._bar = tqdm(total=None, desc=job_id, unit="step", file=file or sys.stderr, dynamic_ncols=True)
        self._postfix: dict[str, str] = {}

    def update(self, event: Event) -> None:
        if event.total_steps and self._bar.total != event.total_steps:
            self._bar.total = event.total_steps
        if event.step > self._bar.n:
            self._bar.update(event.step - self._bar.n)
        if event.kind == "PROGRESS":
            self._postfix.update(loss=f"{event.loss:.3f}", tok_s=f"{event.tokens_per_s:,.0f}")
        elif event.kind == "EVAL":
            self._postfix["val"] = f"{event.val_loss:.3f}"
        elif event.kind == "STATE":
            self._postfix["state"] = event.state.lower()
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
