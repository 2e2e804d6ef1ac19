"""benchmarks/gpu_vs_torchtitan.py before a GPU runs it: equal configurations, and a clear refusal without one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_vs_torchtitan.py"


@pytest.mark.parametrize(("flavor", "parameters"), [("debugmodel", 6_163_712), ("1B", 1_235_814_400)])
def test_the_dry_run_builds_cantatas_model_equal_to_torchtitans_flavor(flavor, parameters):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--flavor", flavor], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cantata_parameters"] == report["expected_parameters"] == parameters  # 1B: Llama 3.2 1B's count
    assert report["torchtitan_parameters"] in (None, parameters)  # counted too where torchtitan is installed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would measure")
def test_without_a_gpu_it_says_so_exits_2_and_writes_nothing(tmp_path: Path):
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "needs a CUDA GPU; nothing was measured or written" in done.stderr
    assert not out.exists()
