"""Encrypted vs plaintext checkpoints: save/load throughput and peak memory on three stores.

For each store (local directory, moto S3, Azurite) the same state is saved and
loaded twice in one run: plaintext (``torch.save`` streamed straight into the
store in 1 MiB pieces, ``torch.load(weights_only=True)`` back) and sealed
(:func:`save_checkpoint` / :func:`load_checkpoint`). Each case runs in a fresh
subprocess so its peak RSS is its own (reported as the peak, VmHWM, minus the
RSS once the state is built); each case runs ``--repeat`` times in alternating order and the
best time is kept, as the machine is shared. A last case streams a large object through the encryptor into
the local store to show the bounded memory of sealing.

    .venv/bin/python benchmarks/bench_checkpoint.py            # 1 GiB state, 2 GiB stream
    .venv/bin/python benchmarks/bench_checkpoint.py --quick    # 128 MiB state, 256 MiB stream

Writes benchmarks/results/bench_checkpoint.json and bench_checkpoint.png.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from cantata.security.keys import LocalKeyring, MasterKey  # noqa: E402
from cantata.security.sealed_checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from cantata.security.stream_aead import StreamContext, StreamEncryptor  # noqa: E402
from cantata.storage import BlobStore, BlobUpload, open_store  # noqa: E402
from tests.services import S3_TEST_CREDENTIALS, azurite_connection_string, start_azurite, start_moto, stop_service  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"
MIB = 1 << 20
TENSOR_MIB = 64
COPY_CHUNK = 4 * MIB
PLAIN_PIECE = MIB  # = DEFAULT_SEGMENT_SIZE; torch.save's single 64 MiB writes were 4x slower on local disk here


def build_state(size_mib: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    count, remainder = divmod(size_mib, TENSOR_MIB)
    sizes = [TENSOR_MIB] * count + ([remainder] if remainder else [])
    return {f"layer{i}": torch.rand(mib * MIB // 4, generator=generator) for i, mib in enumerate(sizes)}


def _status_mib(field: str) -> float:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def peak_rss_mib() -> float:
    """Peak RSS since this process started (``ru_maxrss`` would carry the parent's over exec)."""
    return _status_mib("VmHWM")


def current_rss_mib() -> float:
    return _status_mib("VmRSS")


def store_for(spec: dict) -> BlobStore:
    if spec["kind"] == "local":
        return open_store(Path(spec["root"]).as_uri())
    if spec["kind"] == "s3":
        return open_store(spec["uri"], endpoint_url=spec["endpoint"], **S3_TEST_CREDENTIALS)
    return open_store(spec["uri"], connection_string=spec["connection_string"])


class PieceWriter:
    """Passes writes on in ``PLAIN_PIECE`` slices: the I/O pattern of the sealed path's segments."""

    def __init__(self, sink: BlobUpload) -> None:
        self._sink = sink

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        for offset in range(0, len(view), PLAIN_PIECE):
            self._sink.write(view[offset : offset + PLAIN_PIECE])
        return len(view)

    def flush(self) -> None:
        self._sink.flush()


def save_plaintext(store: BlobStore, key: str, state: dict) -> None:
    with store.writer(key) as upload:
        torch.save(state, PieceWriter(upload))


def load_plaintext(store: BlobStore, key: str) -> dict:
    buffer = io.BytesIO()
    with store.get(key) as reader:
        while chunk := reader.read(PLAIN_PIECE):
            buffer.write(chunk)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def run_case(case: dict) -> dict:
    """One (store, mode) save + load in this process; returns timings and peak RSS."""
    torch.set_num_threads(1)
    store = store_for(case["store"])
    state = build_state(case["size_mib"])
    baseline = current_rss_mib()
    keys = LocalKeyring(Path(case["keyring"]), MasterKey.parse(case["master_key"])).job_keys("bench", "job")
    key = f"plain/{uuid.uuid4().hex}"
    started = time.perf_counter()
    if case["mode"] == "sealed":
        save_checkpoint(store, tenant="bench", job_id="job", step=1, shards={"model": state}, kek=keys.current)
    else:
        save_plaintext(store, key, state)
    save_s = time.perf_counter() - started
    save_peak = peak_rss_mib() - baseline
    started = time.perf_counter()
    if case["mode"] == "sealed":
        loaded = load_checkpoint(store, tenant="bench", job_id="job", step=1, keys=keys)["model"]
    else:
        loaded = load_plaintext(store, key)
    load_s = time.perf_counter() - started
    load_peak = peak_rss_mib() - baseline
    if not all(torch.equal(loaded[name], tensor) for name, tensor in state.items()):
        raise AssertionError(f"{case['store']['kind']} {case['mode']}: loaded state differs")
    for stored in store.list():
        store.delete(stored)
    return {"save_s": save_s, "load_s": load_s, "save_peak_rss_mib": save_peak, "load_peak_rss_mib": load_peak}


def run_stream_case(case: dict) -> dict:
    """Seal ``size_mib`` of generated data into the local store; report the RSS growth."""
    store = store_for(case["store"])
    keys = LocalKeyring(Path(case["keyring"]), MasterKey.parse(case["master_key"])).job_keys("bench", "job")
    chunk = os.urandom(COPY_CHUNK)
    baseline = current_rss_mib()
    started = time.perf_counter()
    with store.writer("stream/big.sealed") as upload:
        encryptor = StreamEncryptor(upload, context=StreamContext("bench", "job", 1, "big"), wrapper=keys.current)
        for _ in range(case["size_mib"] * MIB // COPY_CHUNK):
            encryptor.write(chunk)
        encryptor.close()
    seconds = time.perf_counter() - started
    store.delete("stream/big.sealed")
    return {"seconds": seconds, "peak_rss_above_baseline_mib": peak_rss_mib() - baseline}


def in_subprocess(case: dict) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"case {case['store']['kind']}/{case.get('mode')} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    stores = sorted({r["store"] for r in results}, key=["local", "s3", "azure"].index)
    for axis, operation in zip(axes, ["save", "load"], strict=True):
        for offset, mode in enumerate(["plaintext", "sealed"]):
            values = [
                next(r[f"{operation}_mb_s"] for r in results if r["store"] == s and r["mode"] == mode) for s in stores
            ]
            axis.bar([i + offset * 0.4 for i in range(len(stores))], values, width=0.4, label=mode)
        axis.set_xticks([i + 0.2 for i in range(len(stores))], stores)
        axis.set_title(f"{operation} throughput")
        axis.set_ylabel("MB/s")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB state and 256 MiB stream")
    parser.add_argument("--size-mib", type=int, help="state size (default 1024, or 128 with --quick)")
    parser.add_argument("--stream-mib", type=int, help="streamed object size (default 2048, or 256 with --quick)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per case, alternating order; best time kept")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        case = json.loads(args.case)
        print(json.dumps(run_stream_case(case) if case["mode"] == "stream" else run_case(case)))
        return
    size_mib = args.size_mib or (128 if args.quick else 1024)
    stream_mib = args.stream_mib or (256 if args.quick else 2048)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as workdir:
        work = Path(workdir)
        master_key = MasterKey.create_file(work / "master.key")
        LocalKeyring(work / "keyring", master_key).ensure_tenant("bench")
        moto, azurite = start_moto(work), start_azurite(work)
        try:
            s3 = open_store("s3://bench-bucket/ckpt", endpoint_url=moto.endpoint, **S3_TEST_CREDENTIALS)
            s3.client.create_bucket(Bucket="bench-bucket")
            connection_string = azurite_connection_string(azurite.endpoint)
            open_store("az://bench/ckpt", connection_string=connection_string).container.create_container()
            stores = {
                "local": {"kind": "local", "root": str(work / "store")},
                "s3": {"kind": "s3", "uri": "s3://bench-bucket/ckpt", "endpoint": moto.endpoint},
                "azure": {"kind": "azure", "uri": "az://bench/ckpt", "connection_string": connection_string},
            }
            common = {"keyring": str(work / "keyring"), "master_key": (work / "master.key").read_text()}
            for name, store in stores.items():
                runs: dict[str, list[dict]] = {"plaintext": [], "sealed": []}
                for repeat in range(args.repeat):
                    for mode in ("plaintext", "sealed") if repeat % 2 == 0 else ("sealed", "plaintext"):
                        runs[mode].append(in_subprocess({**common, "store": store, "mode": mode, "size_mib": size_mib}))
                for mode, timings in runs.items():
                    timing = {
                        "save_s": min(t["save_s"] for t in timings),
                        "load_s": min(t["load_s"] for t in timings),
                        "save_peak_rss_mib": max(t["save_peak_rss_mib"] for t in timings),
                        "load_peak_rss_mib": max(t["load_peak_rss_mib"] for t in timings),
                        "runs": timings,
                    }
                    row = {
                        "store": name,
                        "mode": mode,
                        "size_mib": size_mib,
                        **timing,
                        "save_mb_s": size_mib * MIB / 1e6 / timing["save_s"],
                        "load_mb_s": size_mib * MIB / 1e6 / timing["load_s"],
                    }
                    results.append(row)
                    print(
                        f"{name:6} {mode:9} save {row['save_mb_s']:8.1f} MB/s  load {row['load_mb_s']:8.1f} MB/s"
                        f"  peak RSS +{row['save_peak_rss_mib']:.0f}/+{row['load_peak_rss_mib']:.0f} MiB",
                        flush=True,
                    )
            stream = in_subprocess({**common, "store": stores["local"], "mode": "stream", "size_mib": stream_mib})
        finally:
            stop_service(moto)
            stop_service(azurite)
    ratios = {}
    for name in ("local", "s3", "azure"):
        plain, sealed = (
            next(r for r in results if r["store"] == name and r["mode"] == m) for m in ("plaintext", "sealed")
        )
        ratios[name] = {op: sealed[f"{op}_mb_s"] / plain[f"{op}_mb_s"] for op in ("save", "load")}
        print(f"{name:6} sealed/plaintext: save {ratios[name]['save']:.2f}x  load {ratios[name]['load']:.2f}x")
    stream_row = {"size_mib": stream_mib, **stream, "mb_s": stream_mib * MIB / 1e6 / stream["seconds"]}
    print(f"stream-seal {stream_mib} MiB into the local store: {stream_row['mb_s']:.1f} MB/s, "
          f"peak RSS +{stream['peak_rss_above_baseline_mib']:.1f} MiB")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "bench_checkpoint",
        "quick": args.quick,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "state_size_mib": size_mib,
        "repeat": args.repeat,
        "cases": results,
        "sealed_over_plaintext": ratios,
        "stream_seal": stream_row,
    }
    (RESULTS / "bench_checkpoint.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, RESULTS / "bench_checkpoint.png")


if __name__ == "__main__":
    main()
