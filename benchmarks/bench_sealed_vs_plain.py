"""Sealed checkpoints against plain ones on the same local disk: DCP against DCP, one object against torch.save.

One state dict (fp32 and bf16 tensors of a few sizes, like a model with its
optimizer state) is saved and loaded four ways:

- ``torch``: ``torch.save`` to a file (then ``fsync``, as the store and DCP both
  sync what they write) and ``torch.load(weights_only=True)`` back;
- ``sealed``: :func:`save_checkpoint` / :func:`load_checkpoint` into a local
  store, the state as one sealed ``torch.save`` shard;
- ``dcp``: ``torch.distributed.checkpoint`` with its ``FileSystemWriter`` /
  ``FileSystemReader``, loading into an existing state dict;
- ``sealed_dcp``: the job's sharded path (``JobCheckpoints.save_sharded`` /
  ``load_sharded``: DCP through the sealed writer and reader) into a local
  store, loading into an existing state dict.

Every (case, trial) runs in a fresh process, as a restore does, so no case
inherits another's allocator or page state; the cases of a trial run in
alternating order, so load on the shared machine hits them alike. Each file
is read back while still in the page cache, as written. Reported per case:
every trial's save and load seconds, their median and spread; per pair: the
sealed/plain throughput ratio of the medians and of each trial.

    .venv/bin/python benchmarks/bench_sealed_vs_plain.py              # 384 MiB state, 5 trials
    .venv/bin/python benchmarks/bench_sealed_vs_plain.py --quick      # 64 MiB state, 3 trials

Writes benchmarks/results/bench_sealed_vs_plain.json (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import harness  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from cantata.security.keys import JobKeys, LocalKeyring, MasterKey  # noqa: E402
from cantata.security.sealed_checkpoint import commit_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402
from cantata.storage import open_store  # noqa: E402
from cantata.trainer.checkpoint import JobCheckpoints  # noqa: E402

MIB = 1 << 20
CASES = ("torch", "sealed", "dcp", "sealed_dcp")
PAIRS = {"torch": "sealed", "dcp": "sealed_dcp"}  # plain baseline: its sealed counterpart
LAYER_MIB = 48  # per layer: a 32 MiB fp32 weight, a 4 MiB bf16 one, a 12 MiB fp32 moment, and a 4 KiB bias


def build_state(size_mib: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    state = {}
    for layer in range(max(1, size_mib // LAYER_MIB)):
        scale = size_mib / LAYER_MIB if size_mib < LAYER_MIB else 1
        state[f"layer{layer}.weight"] = torch.rand(int(32 * MIB * scale) // 4, generator=generator).view(-1, 1024)
        state[f"layer{layer}.bias"] = torch.rand(1024, generator=generator)
        state[f"layer{layer}.half"] = torch.rand(int(4 * MIB * scale) // 2, generator=generator).bfloat16()
        state[f"layer{layer}.moment"] = torch.rand(int(12 * MIB * scale) // 4, generator=generator)
    return state


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def run_case(case: dict) -> dict:
    """Save then load the state one way in this process; returns the seconds of each."""
    torch.set_num_threads(1)
    work = Path(case["work"])
    state = build_state(case["size_mib"])
    keys = JobKeys.from_json(case["keys"])
    store_uri = (work / "store").as_uri()
    kind = case["kind"]
    started = time.perf_counter()
    fsync_s = 0.0
    if kind == "torch":
        torch.save(state, work / "plain.pt")
        synced = time.perf_counter()
        _fsync(work / "plain.pt")
        fsync_s = time.perf_counter() - synced
    elif kind == "sealed":
        save_checkpoint(open_store(store_uri), tenant="bench", job_id="job", step=1, shards={"model": state},
                        kek=keys.current)  # fmt: skip
    elif kind == "dcp":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(work / "dcp")), no_dist=True)
    else:
        checkpoints = JobCheckpoints(store_uri, "bench", "job", keys, keep_last=1)
        written = checkpoints.save_sharded(1, "train", state, None)
        commit_checkpoint(open_store(store_uri), tenant="bench", job_id="job", step=1, shards=written, kek=keys.current)
    save_s = time.perf_counter() - started
    targets = {name: torch.zeros_like(tensor) for name, tensor in state.items()}  # the model a load fills
    started = time.perf_counter()
    if kind == "torch":
        loaded = torch.load(work / "plain.pt", weights_only=True)
    elif kind == "sealed":
        loaded = load_checkpoint(open_store(store_uri), tenant="bench", job_id="job", step=1, keys=keys)["model"]
    elif kind == "dcp":
        dcp.load(targets, storage_reader=dcp.FileSystemReader(str(work / "dcp")), no_dist=True)
        loaded = targets
    else:
        checkpoints = JobCheckpoints(store_uri, "bench", "job", keys, keep_last=1)
        checkpoints.load_sharded(1, checkpoints.manifest(1), "train", targets, None)
        loaded = targets
    load_s = time.perf_counter() - started
    if not all(torch.equal(loaded[name], tensor) for name, tensor in state.items()):
        raise AssertionError(f"{kind}: the loaded state differs from the saved one")
    size = sum(tensor.numel() * tensor.itemsize for tensor in state.values())
    return {"save_s": save_s, "load_s": load_s, "fsync_s": fsync_s, "bytes": size}


def in_subprocess(case: dict) -> dict:
    work = Path(case["work"])
    work.mkdir()
    try:
        result = subprocess.run(
            [sys.executable, __file__, "--case", json.dumps(case)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    finally:
        shutil.rmtree(work)
    if result.returncode != 0:
        raise RuntimeError(f"case {case['kind']} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    return {"median": harness.median(values), "min": min(values), "max": max(values), "runs": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB state, 3 trials")
    parser.add_argument("--size-mib", type=int, help="state size (default 384, or 64 with --quick)")
    parser.add_argument("--trials", type=int, help="trials per case (default 5, or 3 with --quick)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    harness.add_output_argument(parser)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    size_mib = args.size_mib or (64 if args.quick else 384)
    trials = args.trials or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="bench-sealed-vs-plain-") as scratch:
        ring = LocalKeyring(Path(scratch) / "keyring", MasterKey(os.urandom(32)))
        ring.ensure_tenant("bench")
        common = {"size_mib": size_mib, "keys": ring.job_keys("bench", "job").to_json()}
        runs = harness.interleave(
            {
                kind: lambda trial, k=kind: in_subprocess(
                    {**common, "kind": k, "work": str(Path(scratch) / f"{k}-{trial}")}
                )
                for kind in CASES
            },
            trials,
        )
    cases = {kind: {op: spread([run[f"{op}_s"] for run in runs[kind]]) for op in ("save", "load")} for kind in CASES}
    size_mb = runs["torch"][0]["bytes"] / 1e6
    ratios = {}
    for plain, sealed in PAIRS.items():
        ratios[sealed] = {}
        for op in ("save", "load"):
            paired = [p[f"{op}_s"] / s[f"{op}_s"] for p, s in zip(runs[plain], runs[sealed], strict=True)]
            ratios[sealed][op] = {
                "of_medians": cases[plain][op]["median"] / cases[sealed][op]["median"],
                "per_trial": spread(paired),
            }
        print(
            f"{sealed:10} over {plain:5}: save {ratios[sealed]['save']['of_medians']:.2f}x  "
            f"load {ratios[sealed]['load']['of_medians']:.2f}x",
            flush=True,
        )
    for kind in CASES:
        save, load = cases[kind]["save"], cases[kind]["load"]
        save["mb_s"], load["mb_s"] = size_mb / save["median"], size_mb / load["median"]
        print(f"{kind:10} save {save['median']:.3f} s  load {load['median']:.3f} s (median of {trials})")
    report = {
        "quick": args.quick,
        "state_size_mib": size_mib,
        "state_mb": size_mb,
        "trials": trials,
        "cases": cases,
        "torch_fsync_s": spread([run["fsync_s"] for run in runs["torch"]]),
        "sealed_over_plain": ratios,
    }
    print(f"wrote {harness.write_results('sealed_vs_plain', report, harness.output_dir(args.out, args.quick))}")


if __name__ == "__main__":
    main()
