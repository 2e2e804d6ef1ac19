"""The benchmarks' shared harness: trial order, warm-up, medians and where results go."""

import json
import tempfile
from pathlib import Path

from benchmarks import harness


def test_every_case_runs_once_per_trial_in_alternating_order():
    calls = []
    cases = {name: (lambda trial, n=name: calls.append((trial, n)) or trial) for name in "abc"}
    samples = harness.interleave(cases, 3, warmup=1)
    assert calls == [
        (-1, "a"), (-1, "b"), (-1, "c"),  # warm-up, not kept
        (0, "a"), (0, "b"), (0, "c"),
        (1, "c"), (1, "b"), (1, "a"),
        (2, "a"), (2, "b"), (2, "c"),
    ]  # fmt: skip
    assert samples == {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0, 1, 2]}


def test_after_trial_is_called_once_each_trial_is_complete():
    runs, seen = [], []
    cases = {name: (lambda trial, n=name: runs.append(n)) for name in "ab"}
    harness.interleave(cases, 2, warmup=1, after_trial=lambda trial: seen.append((trial, len(runs))))
    assert seen == [(0, 4), (1, 6)]  # 2 warm-up runs, then 2 per trial


def test_medians_per_case():
    assert harness.medians({"a": [3.0, 1.0, 2.0], "b": [4.0, 1.0]}) == {"a": 2.0, "b": 2.5}


def test_quick_runs_never_default_to_the_committed_results(tmp_path: Path):
    assert harness.output_dir(None, quick=False) == harness.RESULTS
    quick = harness.output_dir(None, quick=True)
    assert quick != harness.RESULTS
    assert quick.is_relative_to(Path(tempfile.gettempdir()))
    assert harness.output_dir(tmp_path / "x", quick=True) == tmp_path / "x"


def test_results_file_names_the_benchmark_and_the_machine(tmp_path: Path):
    path = harness.write_results("demo", {"rows": [1, 2]}, tmp_path)
    assert path == tmp_path / "bench_demo.json"
    written = json.loads(path.read_text())
    assert written["benchmark"] == "demo"
    assert written["rows"] == [1, 2]
    assert {"python", "platform", "cpus", "load_average_1m"} <= written["machine"].keys()
