"""Tokens/s the streaming data loader delivers, against a plain sequential read of the same bytes.

For each store (local directory, S3 on moto, Azure Blob on Azurite) and each
shard form (raw, encrypted with the tenant's dataset key), the same bytes are
read twice in one run: by a plain loop of ``store.get_bytes`` over the
objects (the baseline) and by ``DataLoader`` (fetch, decrypt, verify the
checksum, cut windows, build int64 batches), at the gpt-tiny batch shape
(16 x 64) and at a GPU-sized shape (32 x 1024). It then measures gpt-tiny's
training step (batch 16 x 64, one thread) and the data wait of a gpt-tiny
training run fed by the loader, and compares the loader's rate with the
tokens/s a GPU-sized model needs at a stated step rate.

    .venv/bin/python benchmarks/bench_dataloader.py            # 64 MiB of shards
    .venv/bin/python benchmarks/bench_dataloader.py --quick    # 16 MiB
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cantata.storage import BlobStore, open_store  # noqa: E402
from cantata.trainer.data import DataLoader, DatasetKey, open_dataset  # noqa: E402
from cantata.trainer.data.loader import window_split  # noqa: E402
from cantata.trainer.data.shards import dtype_for, encode_shard  # noqa: E402
from cantata.trainer.data.upload import upload_shards  # noqa: E402
from cantata.trainer.model import build_model  # noqa: E402
from tests.services import S3_TEST_CREDENTIALS, azurite_connection_string, start_azurite, start_moto, stop_service  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"
TINY_SHAPE = (16, 64)
GPU_SHAPE = (32, 1024)
# The stated GPU-sized model: a GPT-2-small-class model (124M parameters) on one
# H100 at batch 32 x 1024 and 12 steps/s (about 393k tokens/s, in line with
# published nanoGPT figures for that class of model and accelerator).
GPU_MODEL = {"name": "GPT-2 small (124M) on one H100", "batch": GPU_SHAPE, "steps_per_s": 12.0}
SHARD_TOKENS = 1 << 21  # 4 MiB uint16 shards


def make_shards(directory: Path, total_mib: int) -> int:
    """Shards of stdlib text (real token statistics); returns the token count."""
    stdlib = Path(os.__file__).parent
    text = bytearray()
    for path in sorted(stdlib.rglob("*.py")):
        if len(text) >= total_mib << 19:
            break
        text += path.read_bytes()
    tokens = np.frombuffer(bytes(text[: total_mib << 19]), dtype=np.uint8)
    directory.mkdir(parents=True)
    for index, start in enumerate(range(0, tokens.size, SHARD_TOKENS)):
        chunk = tokens[start : start + SHARD_TOKENS]
        (directory / f"shard-{index:05d}.tok").write_bytes(encode_shard(chunk, dtype_for("uint16")))
    return tokens.size


def plain_read(store: BlobStore) -> tuple[float, int]:
    """Seconds and bytes to read every object once, sequentially."""
    started = time.perf_counter()
    size = sum(len(store.get_bytes(key)) for key in store.list())
    return time.perf_counter() - started, size


def loader_rate(dataset, shape: tuple[int, int], tokens: int) -> float:
    """Tokens/s the loader delivers over one epoch of training windows."""
    batch, seq = shape
    counts = [min(SHARD_TOKENS, tokens - start) for start in range(0, tokens, SHARD_TOKENS)]
    with DataLoader(dataset, batch_size=batch, seq_len=seq, seed=1) as loader:
        batches = sum(window_split(count, seq, loader.val_fraction)[0] for count in counts) // batch
        started = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        elapsed = time.perf_counter() - started
    return batches * batch * seq / elapsed


def tiny_step_rate(steps: int) -> float:
    torch.set_num_threads(1)
    model = build_model("gpt-tiny", 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, TINY_SHAPE)
    for _ in range(3):
        model(x, x)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    started = time.perf_counter()
    for _ in range(steps):
        model(x, x)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return steps / (time.perf_counter() - started)


def tiny_training_wait(dataset, steps: int) -> dict:
    """A gpt-tiny training run fed by the loader: share of wall time spent waiting for data."""
    torch.set_num_threads(1)
    model = build_model("gpt-tiny", 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with DataLoader(dataset, batch_size=TINY_SHAPE[0], seq_len=TINY_SHAPE[1], seed=1) as loader:
        started = time.perf_counter()
        for _ in range(steps):
            batch = loader.next_batch()
            model(batch.inputs, batch.targets)[1].backward()
            optimizer.step()
            optimizer.zero_grad()
        elapsed = time.perf_counter() - started
        return {"steps": steps, "seconds": elapsed, "data_wait_s": loader.wait_seconds,
                "data_wait_fraction": loader.wait_seconds / elapsed}


def run(total_mib: int, tiny_steps: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-dataloader-"))
    shards = workdir / "shards"
    tokens = make_shards(shards, total_mib)
    key = DatasetKey.generate("bench")
    moto, azurite = start_moto(workdir), start_azurite(workdir)
    try:
        bucket, container = f"bench-{uuid.uuid4().hex[:12]}", f"bench-{uuid.uuid4().hex[:12]}"
        s3_options = {"endpoint_url": moto.endpoint, **S3_TEST_CREDENTIALS}
        az_options = {"connection_string": azurite_connection_string(azurite.endpoint)}
        open_store(f"s3://{bucket}/x", **s3_options).client.create_bucket(Bucket=bucket)
        open_store(f"az://{container}/x", **az_options).container.create_container()
        stores = {"local": ((workdir / "store").as_uri(), {}), "s3 (moto)": (f"s3://{bucket}", s3_options),
                  "azure (azurite)": (f"az://{container}", az_options)}
        rows = []
        waits = {}
        for store_name, (base, options) in stores.items():
            for form in ("raw", "encrypted"):
                uri = f"{base.rstrip('/')}/{form}"
                store = open_store(uri, **options)
                upload_shards(shards, store, dataset_key=key if form == "encrypted" else None)
                read_s, read_bytes = plain_read(store)
                dataset = open_dataset(uri, allowed_roots=[workdir], dataset_key=key, **options)
                plain_tokens_per_s = tokens / read_s
                tiny = loader_rate(dataset, TINY_SHAPE, tokens)
                gpu = loader_rate(dataset, GPU_SHAPE, tokens)
                rows.append({"store": store_name, "form": form, "bytes": read_bytes, "tokens": tokens,
                             "plain_read_tokens_per_s": plain_tokens_per_s,
                             "plain_read_mib_per_s": read_bytes / read_s / (1 << 20),
                             "loader_tokens_per_s_16x64": tiny, "loader_tokens_per_s_32x1024": gpu,
                             "ratio_16x64": tiny / plain_tokens_per_s, "ratio_32x1024": gpu / plain_tokens_per_s})
                print(f"{store_name:16} {form:9} plain {plain_tokens_per_s / 1e6:8.1f} M tok/s   loader 16x64 "
                      f"{tiny / 1e6:7.1f} M tok/s ({tiny / plain_tokens_per_s:.2f}x)   32x1024 {gpu / 1e6:7.1f} M tok/s "
                      f"({gpu / plain_tokens_per_s:.2f}x)", flush=True)
                if form == "encrypted" or store_name == "local":
                    waits[f"{store_name} {form}"] = tiny_training_wait(dataset, tiny_steps)
        tiny_rate = tiny_step_rate(tiny_steps)
    finally:
        stop_service(moto)
        stop_service(azurite)
    need_tiny = tiny_rate * TINY_SHAPE[0] * TINY_SHAPE[1]
    need_gpu = GPU_MODEL["steps_per_s"] * GPU_SHAPE[0] * GPU_SHAPE[1]
    slowest_tiny = min(r["loader_tokens_per_s_16x64"] for r in rows)
    slowest_gpu = min(r["loader_tokens_per_s_32x1024"] for r in rows)
    return {
        "benchmark": "dataloader", "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "dataset": {"tokens": tokens, "dtype": "uint16", "shards": len(list(shards.iterdir())),
                    "shard_tokens": SHARD_TOKENS},
        "rows": rows,
        "gpt_tiny": {"batch": TINY_SHAPE, "threads": 1, "steps_per_s": tiny_rate, "tokens_per_s_needed": need_tiny,
                     "slowest_loader_tokens_per_s": slowest_tiny, "keeps_up": slowest_tiny >= need_tiny,
                     "headroom": slowest_tiny / need_tiny, "training_runs": waits},
        "gpu_model": {**GPU_MODEL, "tokens_per_s_needed": need_gpu, "slowest_loader_tokens_per_s": slowest_gpu,
                      "keeps_up": slowest_gpu >= need_gpu, "headroom": slowest_gpu / need_gpu},
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [f"{r['store']}\n{r['form']}" for r in rows]
    x = np.arange(len(rows))
    width = 0.27
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.bar(x - width, [r["plain_read_tokens_per_s"] / 1e6 for r in rows], width, label="plain sequential read")
    ax.bar(x, [r["loader_tokens_per_s_32x1024"] / 1e6 for r in rows], width, label="loader, batch 32x1024")
    ax.bar(x + width, [r["loader_tokens_per_s_16x64"] / 1e6 for r in rows], width, label="loader, batch 16x64")
    ax.axhline(result["gpu_model"]["tokens_per_s_needed"] / 1e6, color="red", linestyle="--",
               label=f"needed by {result['gpu_model']['name']}")
    ax.axhline(result["gpt_tiny"]["tokens_per_s_needed"] / 1e6, color="black", linestyle=":",
               label="needed by gpt-tiny (1 CPU thread)")
    ax.set_yscale("log")
    ax.set_ylabel("million tokens/s")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title(f"Data loader throughput ({result['dataset']['tokens'] / 1e6:.0f}M uint16 tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB of shards and a shorter training run")
    args = parser.parse_args()
    result = run(total_mib=16 if args.quick else 64, tiny_steps=100 if args.quick else 300)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_dataloader.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "bench_dataloader.png")
    tiny, gpu = result["gpt_tiny"], result["gpu_model"]
    print(f"gpt-tiny: {tiny['steps_per_s']:.1f} steps/s needs {tiny['tokens_per_s_needed']:,.0f} tok/s; slowest loader "
          f"{tiny['slowest_loader_tokens_per_s']:,.0f} ({tiny['headroom']:.0f}x headroom)")
    for name, wait in tiny["training_runs"].items():
        print(f"  gpt-tiny run fed from {name}: data wait {100 * wait['data_wait_fraction']:.2f}% of wall time")
    print(f"{gpu['name']}: needs {gpu['tokens_per_s_needed']:,.0f} tok/s; slowest loader "
          f"{gpu['slowest_loader_tokens_per_s']:,.0f} ({gpu['headroom']:.1f}x)")


if __name__ == "__main__":
    main()
