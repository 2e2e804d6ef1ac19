"""Model FLOPs utilisation of the platform's own ``Trainer`` on one GPU, with compile and float8 on and off.

Each row is a job spec (``gpus_per_worker`` 1, ``compile`` and ``float8`` as
the row says) turned into the ``WorkerConfig`` a worker gets and the
``Trainer`` a worker builds: its model on the GPU under bf16 autocast, its
regional compilation and float8 linears, its AdamW (the fused kernel on a
GPU), and its own ``train_step`` over random tokens. After ``--warmup``
untimed steps (which pay the compile) it times ``--steps`` steps and reports
tokens/s and MFU = 6 · N · tokens/s / peak FLOPs, where N counts every
parameter but the input embedding (a lookup; a tied output head counts once,
as the matmul it is) and attention's own FLOPs are left out, as is usual.

    .venv/bin/python benchmarks/gpu_mfu.py                  # qwen3-1.7b, 4 rows
    .venv/bin/python benchmarks/gpu_mfu.py --check          # CPU, llama-tiny, compile off/on: tests the script

The peak is taken from the GPU's name (dense bf16, e.g. H100/H200 989.5
TFLOP/s) or given with ``--peak-tflops``. A float8 row on a GPU without float8
tensor cores (or on the CPU) is reported as skipped with the trainer's own
refusal. ``--check`` MFU is against a nominal 1 TFLOP/s and means nothing.
Writes ``bench_gpu_mfu.json`` into ``--out`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import gc
import socket
import threading
import time
from pathlib import Path

import harness
import torch

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.trainer import loop
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data.batch import Batch
from cantata.trainer.float8 import Float8Unsupported

# Dense bf16 tensor-core peaks, TFLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "A100": 312.0, "L40S": 362.0, "A10G": 70.0}
CHECK_PEAK_TFLOPS = 1.0


class RandomTokens:
    """The feed ``train_step`` reads: one fixed batch of random tokens, already on the device."""

    def __init__(self, vocab: int, batch: int, seq: int, device: torch.device):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0)).to(device)
        self.batch = Batch(tokens[:, :-1], tokens[:, 1:], torch.arange(batch))

    def next_batch(self) -> Batch:
        return self.batch


def peak_tflops(given: float | None) -> float:
    if given is not None:
        return given
    name = torch.cuda.get_device_name()
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    raise SystemExit(f"no known bf16 peak for {name!r}: give --peak-tflops")


def matmul_parameters(model: torch.nn.Module) -> int:
    """Every parameter but the input embedding; an output head tied to it counts once."""
    n = sum(p.numel() for p in model.parameters())
    embedding = model.get_submodule("embed_tokens").weight
    head = model.get_submodule("lm_head").weight
    return n - embedding.numel() + (head.numel() if head is embedding else 0)


def job_config(model: str, batch: int, seq: int, *, gpus: int, compile: bool, float8: bool) -> WorkerConfig:
    """What the launcher would write for the one worker of a single job with these fields."""
    spec = common_pb2.JobSpec(
        name="gpu-mfu", model=model, algorithm="single", workers=1, steps=1000, batch_size=batch, seq_len=seq,
        gpus_per_worker=gpus, compile=compile, float8=float8, checkpoint_store=Path("/tmp").as_uri(),
    )  # fmt: skip
    jobfields.fill_defaults(spec)
    scratch = Path("/tmp")
    return WorkerConfig(
        job_id="gpu-mfu", tenant="bench", worker=0, workers=1, attempt=0, server="", ca=scratch, cert=scratch,
        key=scratch, rendezvous=f"tcp://127.0.0.1:{_free_port()}", threads=torch.get_num_threads(), spec=spec,
        checkpoint_keys=None,  # type: ignore[arg-type]  # nothing is saved
        dataset_access=None,  # type: ignore[arg-type]  # the tokens are random
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_row(args, *, compile: bool, float8: bool, peak: float) -> dict:
    gpus = 0 if args.check else 1
    cfg = job_config(args.model, args.batch, args.seq, gpus=gpus, compile=compile, float8=float8)
    row: dict = {"compile": compile, "float8": float8}
    strategy = loop.AllReduce(cfg)
    try:
        trainer = loop.Trainer(cfg, None, threading.Event(), strategy)  # type: ignore[arg-type]  # no server
    except Float8Unsupported as exc:
        return row | {"skipped": str(exc)}
    device = trainer.device
    feed = RandomTokens(trainer.model.cfg.vocab_size, args.batch, trainer.seq_len, device.torch)
    losses = []

    def step(i: int) -> None:
        losses.append(
            loop.train_step(trainer.model, trainer.optimizer, feed, i, 3e-4, accumulate=1, trace=False, device=device)  # type: ignore[arg-type]
        )

    def sync() -> None:
        if device.kind == "cuda":
            torch.cuda.synchronize()

    began = time.perf_counter()
    for i in range(args.warmup):
        step(i)
    sync()
    warmup_s = time.perf_counter() - began
    if device.kind == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    sync()
    seconds = time.perf_counter() - start
    tokens_per_s = args.batch * trainer.seq_len * args.steps / seconds
    n = matmul_parameters(trainer.model)
    row |= {
        "device": device.kind if device.kind == "cpu" else torch.cuda.get_device_name(),
        "parameters_without_embedding": n,
        "batch": [args.batch, trainer.seq_len],
        "warmup_s": warmup_s,
        "timed_steps": args.steps,
        "tokens_per_s": tokens_per_s,
        "mfu": 6 * n * tokens_per_s / (peak * 1e12),
        "losses": losses,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.kind == "cuda" else None,
    }
    return row


def release() -> None:
    """Free the last row's model, optimizer and compiled graphs before the next row."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="CPU, llama-tiny, fp32: test the script itself")
    parser.add_argument("--model", default="qwen3-1.7b", help="the job's model")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (the job's batch_size)")
    parser.add_argument("--seq", type=int, default=1024, help="the job's seq_len (at most 1024 at submit)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-float8", action="store_true", help="leave out the float8 rows")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    if args.check:
        args.model, args.batch, args.seq, args.steps, args.warmup = "llama-tiny", 4, 64, 3, 1
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_mfu.py needs a CUDA GPU (or --check on the CPU)")
    peak = CHECK_PEAK_TFLOPS if args.check else peak_tflops(args.peak_tflops)
    float8s = (False,) if args.no_float8 else (False, True)
    rows = []
    for float8 in float8s:
        for compile in (False, True):
            rows.append(run_row(args, compile=compile, float8=float8, peak=peak))
            release()
    eager = rows[0]["tokens_per_s"]
    for row in rows:
        if "tokens_per_s" in row:
            row["speedup_vs_eager"] = row["tokens_per_s"] / eager
            flags = f"compile={row['compile']!s:5} float8={row['float8']!s:5}"
            print(f"{flags} {row['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.1%}, x{row['speedup_vs_eager']:.2f}")
        else:
            print(f"compile={row['compile']!s:5} float8={row['float8']!s:5} skipped: {row['skipped']}")
    report = {"check": args.check, "model": args.model, "peak_tflops": peak, "rows": rows}
    out: Path = harness.output_dir(args.out, quick=True)
    print(f"wrote {harness.write_results('gpu_mfu', report, out)}")


if __name__ == "__main__":
    main()
