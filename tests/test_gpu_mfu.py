"""benchmarks/gpu_mfu.py works before a GPU machine runs it: its --check mode trains llama-tiny on CPU."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_mfu.py"


def test_check_mode_trains_and_reports_tokens_per_second_and_mfu(tmp_path: Path):
    subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(tmp_path)], check=True, timeout=300)
    report = json.loads((tmp_path / "bench_gpu_mfu.json").read_text())
    assert report["check"] is True and report["precision"] == "fp32"
    assert report["tokens_per_s"] > 0
    n = report["parameters_without_embedding"]
    assert n == 131392  # llama-tiny: every parameter but the 512 x 64 input embedding
    assert report["mfu"] == 6 * n * report["tokens_per_s"] / (report["peak_tflops_per_device"] * 1e12)
    losses = report["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]  # one warm-up and three timed steps on one batch
