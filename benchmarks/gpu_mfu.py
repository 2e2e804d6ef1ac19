"""Model FLOPs utilisation of a ~1B decoder trained with FSDP2 in bf16, for a GPU machine.

Builds a Llama-shaped decoder of about 1B parameters on the meta device,
shards it with the trainer's own ``parallelize`` (FSDP2 over every GPU, bf16
compute, fp32 reduction), materialises it on the GPU and trains ``--steps``
AdamW steps of random tokens after ``--warmup`` untimed ones. It reports
tokens/s over all ranks and MFU = 6 · N · tokens/s / (peak FLOPs · GPUs),
where N counts every parameter but the input embedding (a lookup, no matmul)
and attention's own FLOPs are left out, as is usual for this estimate.

    torchrun --nproc-per-node=8 benchmarks/gpu_mfu.py      # every GPU of the node
    .venv/bin/python benchmarks/gpu_mfu.py                 # one GPU
    .venv/bin/python benchmarks/gpu_mfu.py --check         # CPU: a few steps of llama-tiny, fp32

The peak is taken from the GPU's name (dense bf16, e.g. H100/H200 989.5
TFLOP/s) or given with ``--peak-tflops``. ``--check`` runs the same code on
CPU with gloo so the script is tested where no GPU is lent; its MFU is
against a nominal 1 TFLOP/s and means nothing. Writes
``bench_gpu_mfu.json`` into ``--out`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import time
from pathlib import Path

import harness
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.decoder import Decoder, DecoderConfig
from cantata.trainer.model import MODELS
from cantata.trainer.parallel import DIMS, parallelize

# Llama-shaped, 0.98B parameters (0.92B without the input embedding).
ONE_B = DecoderConfig(
    dim=2048, n_layers=18, n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=5632, vocab_size=32000,
    block_size=2048, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=False, qk_norm=False,
)  # fmt: skip
# Dense bf16 tensor-core peaks, TFLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "A100": 312.0, "L40S": 362.0, "A10G": 70.0}
CHECK_PEAK_TFLOPS = 1.0


def _init() -> tuple[int, int]:
    """Join torchrun's group, or make a group of one."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def peak_tflops(given: float | None) -> float:
    if given is not None:
        return given
    name = torch.cuda.get_device_name()
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    raise SystemExit(f"no known bf16 peak for {name!r}: give --peak-tflops")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="CPU, llama-tiny, fp32: test the script itself")
    parser.add_argument("--batch", type=int, default=4, help="sequences per GPU and step")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of one GPU")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing per layer")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    if args.check:
        args.batch, args.seq, args.steps, args.warmup = 4, 64, 3, 1
    rank, world = _init()
    device = torch.device("cpu" if args.check else "cuda", 0 if args.check else int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = MODELS["llama-tiny"] if args.check else ONE_B
    assert isinstance(cfg, DecoderConfig)
    precision = MixedPrecision.FP32 if args.check else MixedPrecision.BF16
    with torch.device("meta"):
        model = Decoder(cfg)
    mesh = init_device_mesh(device.type, (1, world, 1), mesh_dim_names=DIMS)
    parallelize(model, mesh, precision, checkpointing=args.checkpointing)
    model.to_empty(device=device)
    torch.manual_seed(0)
    model.reset_parameters()
    n = sum(p.numel() for p in model.parameters()) - model.embed_tokens.weight.numel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2 if args.check else 3e-4, fused=device.type == "cuda")
    generator = torch.Generator().manual_seed(rank)
    batch = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=generator).to(device)
    losses = []

    def step() -> None:
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = time.perf_counter() - start
    tokens_per_s = args.batch * args.seq * world * args.steps / seconds
    peak = CHECK_PEAK_TFLOPS if args.check else peak_tflops(args.peak_tflops)
    mfu = 6 * n * tokens_per_s / (peak * 1e12 * world)
    report = {
        "check": args.check,
        "device": "cpu" if args.check else torch.cuda.get_device_name(),
        "gpus": 0 if args.check else world,
        "config": dataclasses.asdict(cfg),
        "parameters_without_embedding": n,
        "precision": precision.value,
        "batch_per_rank": [args.batch, args.seq],
        "timed_steps": args.steps,
        "tokens_per_s": tokens_per_s,
        "peak_tflops_per_device": peak,
        "mfu": mfu,
        "losses": [float(loss) for loss in losses],
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }
    if rank == 0:
        out: Path = harness.output_dir(args.out, quick=True)
        print(f"wrote {harness.write_results('gpu_mfu', report, out)}")
        print(f"{n / 1e9:.3f}B parameters (no embedding), {world} rank(s): {tokens_per_s:.0f} tokens/s, MFU {mfu:.1%}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
