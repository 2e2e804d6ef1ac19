"""benchmarks/gpu_mfu.py works before a GPU machine runs it: its --check mode runs the Trainer on CPU."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_mfu.py"


def test_check_mode_trains_the_jobs_trainer_eager_and_compiled_and_skips_float8(tmp_path: Path):
    subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(tmp_path)], check=True, timeout=600)
    report = json.loads((tmp_path / "bench_gpu_mfu.json").read_text())
    assert report["check"] is True and report["model"] == "llama-tiny"
    eager, compiled, *float8 = report["rows"]
    assert (eager["compile"], compiled["compile"]) == (False, True)
    for row in (eager, compiled):
        n = row["parameters_without_embedding"]
        assert n == 131392  # llama-tiny: every parameter but the 512 x 64 input embedding (the head is untied)
        assert row["tokens_per_s"] > 0
        assert row["mfu"] == 6 * n * row["tokens_per_s"] / (report["peak_tflops"] * 1e12)
        losses = row["losses"]
        assert len(losses) == 4 and losses[-1] < losses[0]  # one warm-up and three timed steps on one batch
    assert max(abs(a - b) for a, b in zip(eager["losses"], compiled["losses"], strict=True)) < 1e-4
    assert [row["float8"] for row in float8] == [True, True]
    assert all("this worker trains on the cpu" in row["skipped"] for row in float8)
