"""What every benchmark shares: interleaved trials, medians, machine information and its results file.

A benchmark named ``NAME`` writes ``benchmarks/results/bench_NAME.json`` (and its
plot beside it) through ``write_results``, which adds the benchmark's name and
the machine it ran on. Quick runs write to a temporary folder unless ``--out``
says otherwise, so they never replace the committed full-mode results.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

RESULTS = Path(__file__).resolve().parent / "results"

K = TypeVar("K")
T = TypeVar("T")


def machine() -> dict:
    """The machine and software the numbers were measured on, and its load when asked."""
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        info["torch"] = importlib.metadata.version("torch")
    return info


def interleave(
    cases: Mapping[K, Callable[[int], T]],
    trials: int,
    *,
    warmup: int = 0,
    after_trial: Callable[[int], None] | None = None,
) -> dict[K, list[T]]:
    """Run every case once per trial, all cases in each trial, so a burst of load hits them alike.

    The order alternates (forward in even trials, backward in odd ones), so no
    case always runs first. A case is called with the trial number; the
    ``warmup`` untimed rounds before the trials get -warmup..-1 and are not
    kept. ``after_trial`` is called with each trial number once it is done.
    """
    names = list(cases)
    for trial in range(-warmup, 0):
        for name in names:
            cases[name](trial)
    samples: dict[K, list[T]] = {name: [] for name in names}
    for trial in range(trials):
        for name in names if trial % 2 == 0 else reversed(names):
            samples[name].append(cases[name](trial))
        if after_trial is not None:
            after_trial(trial)
    return samples


def median(values: Iterable[float]) -> float:
    return statistics.median(values)


def medians(samples: Mapping[K, Iterable[float]]) -> dict[K, float]:
    """The median of each case's trials."""
    return {name: median(values) for name, values in samples.items()}


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for the JSON and plot (default: benchmarks/results, or a temporary folder for --quick runs)",
    )


def output_dir(out: Path | None, quick: bool) -> Path:
    """``out`` if given; else the committed results folder for full runs and a temporary one for quick runs."""
    if out is None:
        out = Path(tempfile.gettempdir()) / "cantata-bench" if quick else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def result_file(out: Path, name: str, suffix: str = ".json") -> Path:
    return out / f"bench_{name}{suffix}"


def write_results(name: str, report: Mapping, out: Path) -> Path:
    """Write ``out/bench_<name>.json``: the benchmark's name, the machine, then ``report``.

    Written whole or not at all (a new file renamed over the old), so a run stopped while
    writing keeps its previous report.
    """
    path = result_file(out, name)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps({"benchmark": name, "machine": machine(), **report}, indent=2) + "\n")
    partial.replace(path)
    return path
