#!/usr/bin/env bash
# The one prepared GPU check of issue 35, for a session with a lent GPU (the device tool), at most ~8 minutes on
# an H100: benchmarks/gpu_mfu.py (the platform's Trainer: compile off/on x float8 off/on) and
# benchmarks/gpu_vs_torchtitan.py (torchtitan's Llama 3 1B against Cantata's equal model, eager and compiled).
#
#     bash scripts/gpu_check.sh            # JSON under $OUT (the device tool's folder), else benchmarks/results/
#
# It installs nothing from the internet: the GPU machine has none. torchtitan must already be importable or
# pip-installable from the machine's local registry mirror (`pip install --no-deps torchtitan` is tried once,
# offline-safe); where it is not, the torchtitan comparison is skipped and says so. Each step has its own
# time limit, so one slow step cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

# 1. The Trainer's tokens/s and MFU, qwen3-1.7b, 8 x 1024 tokens a step (about 3 minutes with four compiles).
timeout 240 "$PY" benchmarks/gpu_mfu.py --steps 10 --warmup 3 --out "$OUT" 2>&1 | tail -20 || status=1

# 2. Against torchtitan, if it can be had without the internet.
if ! "$PY" -c "import torchtitan" 2>/dev/null; then
    timeout 60 "$PY" -m pip install --no-deps --no-input -q torchtitan 2>&1 | tail -2 || true
fi
if "$PY" -c "import torchtitan" 2>/dev/null; then
    for flags in "" "--compile"; do
        # shellcheck disable=SC2086  # the flags word-split on purpose
        timeout 150 "$PY" benchmarks/gpu_vs_torchtitan.py --flavor 1B --batch 4 --seq 2048 --rounds 3 --steps 5 \
            $flags --out "$OUT" 2>&1 | tail -5 || status=1
    done
else
    echo "torchtitan is not importable and not installable from the local mirror: comparison skipped" \
        | tee "$OUT/gpu_vs_torchtitan.skipped"
fi
ls -l "$OUT"
exit $status
