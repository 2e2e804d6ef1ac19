"""A job's progress, fed by its events (step, loss, validation loss, tokens/s).

On a terminal it is a live bar (tqdm). Anywhere else (a file, a pipe, CI logs)
a bar's ``\\r`` frames would pile up, so plain lines are printed instead: one
per state change and evaluation, and a progress line at most every
``interval`` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Protocol

from cantata.sdk.client import Event

PLAIN_INTERVAL_S = 10.0


class Progress(Protocol):
    def update(self, event: Event) -> None: ...

    def close(self) -> None: ...


def progress_display(job_id: str, file: IO[str] | None = None) -> Progress:
    """A bar on a terminal, plain lines elsewhere."""
    out = file or sys.stderr
    return ProgressBar(job_id, out) if out.isatty() else ProgressLines(job_id, out)


class ProgressBar:
    def __init__(self, job_id: str, file: IO[str] | None = None):
        from tqdm import tqdm

        self._bar = tqdm(total=None, desc=job_id, unit="step", file=file or sys.stderr, dynamic_ncols=True)
        self._postfix: dict[str, str] = {}

    def update(self, event: Event) -> None:
        if event.total_steps and self._bar.total != event.total_steps:
            self._bar.total = event.total_steps
        if event.step > self._bar.n:
            self._bar.update(event.step - self._bar.n)
        if event.loss is not None:
            self._postfix["loss"] = f"{event.loss:.3f}"
        if event.tokens_per_s is not None:
            self._postfix["tok_s"] = f"{event.tokens_per_s:,.0f}"
        if event.val_loss is not None:
            self._postfix["val"] = f"{event.val_loss:.3f}"
        if event.state is not None:
            self._postfix["state"] = event.state.lower()
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


class ProgressLines:
    """Plain lines: ``JOB: step 40/120 loss 2.31 (5,120 tokens/s)``, ``JOB: RUNNING``, ``JOB: step 60 val 2.20``."""

    def __init__(self, job_id: str, file: IO[str], interval: float = PLAIN_INTERVAL_S):
        self._job_id, self._file, self._interval = job_id, file, interval
        self._last_line = -interval
        self._pending: Event | None = None
        self._total: int | None = None

    def update(self, event: Event) -> None:
        self._total = event.total_steps or self._total
        if event.state is not None:
            if self._pending is not None:  # the last progress before the job moves on
                self._say_progress()
            self._say(event.state)
        elif event.val_loss is not None:
            self._say(f"step {event.step} val {event.val_loss:.4f}")
        elif event.loss is not None:
            self._pending = event
            if time.monotonic() - self._last_line >= self._interval:
                self._say_progress()

    def close(self) -> None:
        if self._pending is not None:
            self._say_progress()

    def _say_progress(self) -> None:
        event, self._pending = self._pending, None
        assert event is not None and event.loss is not None
        total = f"/{self._total}" if self._total else ""
        rate = f" ({event.tokens_per_s:,.0f} tokens/s)" if event.tokens_per_s is not None else ""
        self._say(f"step {event.step}{total} loss {event.loss:.4f}{rate}")
        self._last_line = time.monotonic()

    def _say(self, text: str) -> None:
        print(f"{self._job_id}: {text}", file=self._file, flush=True)
