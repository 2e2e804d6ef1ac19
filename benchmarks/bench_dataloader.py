"""Tokens/s the streaming data loader delivers, against a plain sequential read of the same bytes.

For each store (local directory, S3 on moto, Azure Blob on Azurite) and each
shard form (raw, encrypted with the tenant's dataset key), one run measures
side by side:

- the baseline: a plain loop of ``store.get_bytes`` over the objects, one at
  a time (for encrypted shards also that loop followed by ``unseal`` of each
  object, the least any reader of sealed shards must do);
- the ``DataLoader`` (fetch, decrypt, verify the checksum, cut windows, build
  int64 batches) with its default 2 concurrent fetchers, at the gpt-tiny
  batch shape (16 x 64) and at a GPU-sized shape (32 x 1024), and with 1
  fetcher at 32 x 1024 as the like-for-like check against the sequential read.

Every measurement runs once untimed (warm-up), then in ``--trials`` rounds
that interleave all of them; the medians are reported, each trial is kept.
A loader measurement times its second epoch of a continuing run, so the
prefetch pipeline is full at both ends of the window (steady state, no cold
first fetch). Loader tokens/s count input tokens of the batches delivered.

Then it measures gpt-tiny's training step (16 x 64, one thread) and the data
wait of gpt-tiny training runs fed by the loader from raw and encrypted
shards on every store, with shards small enough that each run crosses at
least 3 shard boundaries, and compares the loader with the tokens/s a
GPU-sized model needs at a stated step rate.

    .venv/bin/python benchmarks/bench_dataloader.py            # 64 MiB of shards, 5 trials, 800-step runs
    .venv/bin/python benchmarks/bench_dataloader.py --quick    # 16 MiB, 5 trials, 200-step runs
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import harness  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from cantata.storage import BlobStore, open_store  # noqa: E402
from cantata.trainer.data import DataLoader, DatasetKey, open_dataset  # noqa: E402
from cantata.trainer.data.loader import DEFAULT_VAL_FRACTION, window_split  # noqa: E402
from cantata.trainer.data.sealing import SEALED_SUFFIX, unseal  # noqa: E402
from cantata.trainer.data.shards import dtype_for, encode_shard  # noqa: E402
from cantata.trainer.data.upload import upload_shards  # noqa: E402
from cantata.trainer.model import build_model  # noqa: E402
from emulators import S3_TEST_CREDENTIALS, azurite_connection_string, start_azurite, start_moto, stop_service  # noqa: E402

TINY_SHAPE = (16, 64)
GPU_SHAPE = (32, 1024)
# The stated GPU-sized model: a GPT-2-small-class model (124M parameters) on one
# H100 at batch 32 x 1024 and 12 steps/s (about 393k tokens/s, in line with
# published nanoGPT figures for that class of model and accelerator).
GPU_MODEL = {"name": "GPT-2 small (124M) on one H100", "batch": GPU_SHAPE, "steps_per_s": 12.0}
SHARD_TOKENS = 1 << 21  # 4 MiB uint16 shards for the throughput measurements
WAIT_SHARDS = 8  # shards of the data-wait runs' datasets, sized so that a run reads about 4 of them
FETCHERS = 2  # the loader's default


def stdlib_tokens(count: int) -> np.ndarray:
    """``count`` tokens of standard-library source bytes (real token statistics)."""
    text = bytearray()
    for path in sorted(Path(os.__file__).parent.rglob("*.py")):
        if len(text) >= count:
            break
        text += path.read_bytes()
    return np.frombuffer(bytes(text[:count]), dtype=np.uint8)


def make_shards(directory: Path, tokens: np.ndarray, shard_tokens: int) -> list[int]:
    """uint16 shards of ``shard_tokens`` tokens; returns each shard's token count."""
    directory.mkdir(parents=True)
    counts = []
    for index, start in enumerate(range(0, tokens.size, shard_tokens)):
        chunk = tokens[start : start + shard_tokens]
        (directory / f"shard-{index:05d}.tok").write_bytes(encode_shard(chunk, dtype_for("uint16")))
        counts.append(chunk.size)
    return counts


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def plain_read(store: BlobStore, keys: list[str]) -> None:
    """Every object read once, sequentially: the baseline."""
    for key in keys:
        store.get_bytes(key)


def read_and_unseal(store: BlobStore, keys: list[str], dataset_key: DatasetKey) -> None:
    """The baseline, each sealed object then decrypted and authenticated."""
    for key in keys:
        unseal(store.get_bytes(key), dataset_key, key.removesuffix(SEALED_SUFFIX), key)


def loader_epoch(dataset, shape: tuple[int, int], windows: int, fetchers: int) -> float:
    """Seconds for one epoch's batches after a first, untimed epoch of the same run (the pipeline full)."""
    batch, seq = shape
    with DataLoader(dataset, batch_size=batch, seq_len=seq, seed=1, fetchers=fetchers) as loader:
        for _ in range(windows // batch):
            loader.next_batch()
        started = time.perf_counter()
        for _ in range(windows // batch):
            loader.next_batch()
        return time.perf_counter() - started


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
        first_wait = None
        for _ in range(steps):
            batch = loader.next_batch()
            if first_wait is None:
                first_wait = loader.wait_seconds  # the cold start: nothing to overlap the first fetch with
            model(batch.inputs, batch.targets)[1].backward()
            optimizer.step()
            optimizer.zero_grad()
        elapsed = time.perf_counter() - started
        state = loader.state_dict()
    shards = state["object"] + 1 + state["epoch"] * len(dataset.objects)
    return {
        "steps": steps,
        "seconds": elapsed,
        "shards_read": shards,
        "data_wait_s": loader.wait_seconds,
        "first_batch_wait_s": first_wait,
        "data_wait_fraction": loader.wait_seconds / elapsed,
        "data_wait_fraction_after_first_batch": (loader.wait_seconds - first_wait) / elapsed,
    }


def load_average() -> float:
    return os.getloadavg()[0]


def run(total_mib: int, trials: int, tiny_steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-dataloader-") as workdir:
        return measure(Path(workdir), total_mib, trials, tiny_steps)


def measure(workdir: Path, total_mib: int, trials: int, tiny_steps: int) -> dict:
    """Every measurement, with its shards, stores and servers under ``workdir``."""
    text = stdlib_tokens(total_mib << 19)
    counts = make_shards(workdir / "shards", text, SHARD_TOKENS)
    tokens = sum(counts)
    wait_shard_tokens = tiny_steps * TINY_SHAPE[0] * TINY_SHAPE[1] // 4
    make_shards(workdir / "wait-shards", text[: WAIT_SHARDS * wait_shard_tokens], wait_shard_tokens)
    key = DatasetKey.generate("bench")
    loads = {"start": load_average()}
    moto, azurite = start_moto(workdir), start_azurite(workdir)
    try:
        bucket, container = f"bench-{uuid.uuid4().hex[:12]}", f"bench-{uuid.uuid4().hex[:12]}"
        s3_options = {"endpoint_url": moto.endpoint, **S3_TEST_CREDENTIALS}
        az_options = {"connection_string": azurite_connection_string(azurite.endpoint)}
        open_store(f"s3://{bucket}/x", **s3_options).client.create_bucket(Bucket=bucket)
        open_store(f"az://{container}/x", **az_options).container.create_container()
        stores = {
            "local": ((workdir / "store").as_uri(), {}),
            "s3 (moto)": (f"s3://{bucket}", s3_options),
            "azure (azurite)": (f"az://{container}", az_options),
        }

        # Every measurement of every store and form, as a name and a function returning seconds.
        cases = []
        wait_datasets = {}
        for store_name, (base, options) in stores.items():
            for form in ("raw", "encrypted"):
                sealed_key = key if form == "encrypted" else None
                uri = f"{base.rstrip('/')}/{form}"
                store = open_store(uri, **options)
                keys = upload_shards(workdir / "shards", store, dataset_key=sealed_key)
                dataset = open_dataset(uri, allowed_roots=[workdir], dataset_key=key, **options)
                windows = {
                    shape: sum(window_split(n, shape[1], DEFAULT_VAL_FRACTION)[0] for n in counts)
                    for shape in (TINY_SHAPE, GPU_SHAPE)
                }
                measures = {"plain_read": lambda s=store, k=keys: timed(lambda: plain_read(s, k))}
                if sealed_key:
                    measures["plain_read_unseal"] = lambda s=store, k=keys: timed(lambda: read_and_unseal(s, k, key))
                for shape, fetchers in ((TINY_SHAPE, FETCHERS), (GPU_SHAPE, FETCHERS), (GPU_SHAPE, 1)):
                    name = f"loader_{shape[0]}x{shape[1]}" + ("_1_fetcher" if fetchers == 1 else "")
                    measures[name] = lambda d=dataset, sh=shape, f=fetchers, w=windows[shape]: loader_epoch(d, sh, w, f)
                cases.append(
                    {
                        "store": store_name,
                        "form": form,
                        "bytes": sum(len(store.get_bytes(k)) for k in keys),
                        "windows": windows,
                        "measures": measures,
                        "seconds": {},
                    }
                )
                wait_uri = f"{base.rstrip('/')}/wait-{form}"
                upload_shards(workdir / "wait-shards", open_store(wait_uri, **options), dataset_key=sealed_key)
                wait_datasets[f"{store_name} {form}"] = open_dataset(
                    wait_uri, allowed_roots=[workdir], dataset_key=key, **options
                )

        trial_loads = []

        def trial_done(trial: int) -> None:
            trial_loads.append(load_average())
            print(f"trial {trial + 1}/{trials} done (load average {trial_loads[-1]:.2f})", flush=True)

        # One untimed warm-up round (page cache, servers' first requests, allocator), then the trials.
        measures = {
            (index, name): lambda _trial, m=measure: m()
            for index, case in enumerate(cases)
            for name, measure in case["measures"].items()
        }
        for (index, name), values in harness.interleave(measures, trials, warmup=1, after_trial=trial_done).items():
            cases[index]["seconds"][name] = values
        loads["throughput_trials"] = trial_loads

        waits = {name: tiny_training_wait(dataset, tiny_steps) for name, dataset in wait_datasets.items()}
        tiny_rate = tiny_step_rate(min(tiny_steps, 300))
        loads["end"] = load_average()
    finally:
        stop_service(moto)
        stop_service(azurite)

    rows = [summarize(case, tokens) for case in cases]
    for row in rows:
        print(
            f"{row['store']:16} {row['form']:9} plain {row['plain_read_tokens_per_s'] / 1e6:7.1f} M tok/s   "
            + "   ".join(
                f"{shape} {row[f'loader_tokens_per_s_{shape}'] / 1e6:6.1f} M ({row[f'ratio_{shape}']:.2f}x"
                + (
                    f", {row[f'ratio_vs_read_unseal_{shape}']:.2f}x of read+unseal"
                    if row["form"] == "encrypted"
                    else ""
                )
                + ")"
                for shape in ("16x64", "32x1024")
            ),
            flush=True,
        )
    need_tiny = tiny_rate * TINY_SHAPE[0] * TINY_SHAPE[1]
    need_gpu = GPU_MODEL["steps_per_s"] * GPU_SHAPE[0] * GPU_SHAPE[1]
    slowest_tiny = min(r["loader_tokens_per_s_16x64"] for r in rows)
    slowest_gpu = min(r["loader_tokens_per_s_32x1024"] for r in rows)
    return {
        "load_average_1m": loads,
        "method": {
            "trials": trials,
            "statistic": "median of the trials after one untimed warm-up round, "
            "all measurements interleaved in each trial (order reversed in odd trials)",
            "baseline": "store.get_bytes of every object, one at a time (plain_read_unseal: each then unsealed)",
            "loader": f"DataLoader with {FETCHERS} concurrent fetchers (and 1 at 32x1024), the second "
            "epoch of a continuing run timed; tokens/s counts input tokens delivered",
            "ratio": "loader tokens/s over the plain read's tokens/s of the same bytes; "
            "ratio_vs_read_unseal: over the read-and-unseal baseline",
        },
        "dataset": {"tokens": tokens, "dtype": "uint16", "shards": len(counts), "shard_tokens": SHARD_TOKENS},
        "rows": rows,
        "gpt_tiny": {
            "batch": TINY_SHAPE,
            "threads": 1,
            "steps_per_s": tiny_rate,
            "tokens_per_s_needed": need_tiny,
            "slowest_loader_tokens_per_s": slowest_tiny,
            "keeps_up": slowest_tiny >= need_tiny,
            "headroom": slowest_tiny / need_tiny,
            "wait_shard_tokens": wait_shard_tokens,
            "training_runs": waits,
        },
        "gpu_model": {
            **GPU_MODEL,
            "tokens_per_s_needed": need_gpu,
            "slowest_loader_tokens_per_s": slowest_gpu,
            "keeps_up": slowest_gpu >= need_gpu,
            "headroom": slowest_gpu / need_gpu,
        },
    }


def summarize(case: dict, tokens: int) -> dict:
    """Medians, rates and ratios of one store and form (every trial's seconds kept)."""
    seconds = harness.medians(case["seconds"])
    row = {
        "store": case["store"],
        "form": case["form"],
        "bytes": case["bytes"],
        "tokens": tokens,
        "plain_read_tokens_per_s": tokens / seconds["plain_read"],
        "plain_read_mib_per_s": case["bytes"] / seconds["plain_read"] / (1 << 20),
    }
    if "plain_read_unseal" in seconds:
        row["plain_read_unseal_tokens_per_s"] = tokens / seconds["plain_read_unseal"]
    for name, value in seconds.items():
        if name.startswith("loader_"):
            shape = name.removeprefix("loader_").removesuffix("_1_fetcher")
            batch, seq = map(int, shape.split("x"))
            rate = case["windows"][(batch, seq)] // batch * batch * seq / value
            suffix = name.removeprefix("loader")
            row[f"loader_tokens_per_s{suffix}"] = rate
            row[f"ratio{suffix}"] = rate / row["plain_read_tokens_per_s"]
            if "plain_read_unseal_tokens_per_s" in row:
                row[f"ratio_vs_read_unseal{suffix}"] = rate / row["plain_read_unseal_tokens_per_s"]
    row["trial_seconds"] = case["seconds"]
    return row


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [f"{r['store']}\n{r['form']}" for r in rows]
    x = np.arange(len(rows))
    width = 0.2
    fig, ax = plt.subplots(figsize=(13, 5))
    ax.bar(x - 1.5 * width, [r["plain_read_tokens_per_s"] / 1e6 for r in rows], width, label="plain sequential read")
    ax.bar(
        x - 0.5 * width,
        [r.get("plain_read_unseal_tokens_per_s", np.nan) / 1e6 for r in rows],
        width,
        label="plain read + unseal",
    )
    ax.bar(
        x + 0.5 * width, [r["loader_tokens_per_s_32x1024"] / 1e6 for r in rows], width, label="loader, batch 32x1024"
    )
    ax.bar(x + 1.5 * width, [r["loader_tokens_per_s_16x64"] / 1e6 for r in rows], width, label="loader, batch 16x64")
    ax.axhline(
        result["gpu_model"]["tokens_per_s_needed"] / 1e6,
        color="red",
        linestyle="--",
        label=f"needed by {result['gpu_model']['name']}",
    )
    ax.axhline(
        result["gpt_tiny"]["tokens_per_s_needed"] / 1e6,
        color="black",
        linestyle=":",
        label="needed by gpt-tiny (1 CPU thread)",
    )
    ax.set_yscale("log")
    ax.set_ylabel("million tokens/s (median of trials)")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title(
        f"Data loader throughput ({result['dataset']['tokens'] / 1e6:.0f}M uint16 tokens, "
        f"{FETCHERS} fetchers, {result['method']['trials']} interleaved trials)"
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB of shards and 200-step training runs")
    parser.add_argument("--trials", type=int, default=5, help="interleaved timed trials (median reported)")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    result = run(total_mib=16 if args.quick else 64, trials=args.trials, tiny_steps=200 if args.quick else 800)
    out = harness.output_dir(args.out, args.quick)
    print(f"wrote {harness.write_results('dataloader', {'quick': args.quick, **result}, out)}")
    plot(result, harness.result_file(out, "dataloader", ".png"))
    tiny, gpu = result["gpt_tiny"], result["gpu_model"]
    print(
        f"gpt-tiny: {tiny['steps_per_s']:.1f} steps/s needs {tiny['tokens_per_s_needed']:,.0f} tok/s; slowest loader "
        f"{tiny['slowest_loader_tokens_per_s']:,.0f} ({tiny['headroom']:.0f}x headroom)"
    )
    for name, wait in tiny["training_runs"].items():
        print(
            f"  gpt-tiny run fed from {name}: {wait['shards_read']} shards, data wait "
            f"{100 * wait['data_wait_fraction']:.2f}% of wall time "
            f"({100 * wait['data_wait_fraction_after_first_batch']:.2f}% after the first batch)"
        )
    print(
        f"{gpu['name']}: needs {gpu['tokens_per_s_needed']:,.0f} tok/s; slowest loader "
        f"{gpu['slowest_loader_tokens_per_s']:,.0f} ({gpu['headroom']:.1f}x)"
    )


if __name__ == "__main__":
    main()
