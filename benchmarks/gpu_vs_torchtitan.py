"""Cantata against torchtitan on one GPU: the same Llama 3 shape, batch, sequence length and bf16, interleaved.

torchtitan's Llama 3 ``debugmodel`` or ``1B`` configuration (read from an
installed ``torchtitan``, written against its 0.3.0 layout) and Cantata's
decoder of the same dimensions (the table below; ``--dry-run`` checks that
their parameter counts agree) each train ``--steps`` AdamW steps (fused
kernel, lr 3e-4) of one batch of random tokens under bf16 autocast, taking
turns for ``--rounds`` rounds after ``--warmup`` untimed steps each, so that
clocks and heat affect both alike. With ``--compile`` each side compiles its
transformer blocks in place (torchtitan's ``apply_compile`` does just that;
Cantata's ``compile_blocks``); with ``--float8`` both use torchao's
tensorwise float8 linears, the output head left in bf16. Reports the median
tokens/s of each side, MFU (6 · N · tokens/s / peak, N without the input
embedding, a tied head counted once) and Cantata's ratio to torchtitan.

Differences that remain: torchtitan fuses q/k/v into one projection, uses
FlexAttention with a block-causal mask and Llama 3.1 rope scaling; Cantata
has separate projections, SDPA with a causal mask and unscaled rope (the
same FLOPs up to attention's own kernels).

    .venv/bin/python benchmarks/gpu_vs_torchtitan.py --flavor 1B --compile
    .venv/bin/python benchmarks/gpu_vs_torchtitan.py --dry-run      # any machine: configs and parameter counts

Installs nothing: without CUDA or an importable ``torchtitan`` it says so and
exits with status 2, writing nothing. Writes ``gpu_vs_torchtitan.json`` into
``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from cantata.trainer.decoder import Decoder, DecoderConfig

RESULTS = Path(__file__).resolve().parent / "results"
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "A100": 312.0, "L40S": 362.0}


def _ffn(dim: int, multiple_of: int, multiplier: float | None = None) -> int:
    """torchtitan's (and Meta's) SwiGLU width: 2/3 of 4 dim, times the multiplier, rounded up."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


# torchtitan's Llama 3 flavors (torchtitan/models/llama3/__init__.py) as Cantata decoders.
FLAVORS = {
    "debugmodel": DecoderConfig(
        dim=256, n_layers=6, n_heads=16, n_kv_heads=16, head_dim=16, ffn_dim=_ffn(256, 256), vocab_size=2048,
        block_size=131072, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=False, qk_norm=False,
    ),
    "1B": DecoderConfig(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=_ffn(2048, 1024, 1.5),
        vocab_size=128256, block_size=131072, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=True, qk_norm=False,
    ),
}  # fmt: skip


def expected_parameters(c: DecoderConfig) -> int:
    """A Llama 3 model's parameter count from its dimensions alone (torchtitan's fused qkv holds as many)."""
    attention = c.dim * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
    layer = attention + 3 * c.dim * c.ffn_dim + 2 * c.dim
    return c.vocab_size * c.dim * (1 if c.tie_embeddings else 2) + c.n_layers * layer + c.dim


def matmul_parameters(model: torch.nn.Module, embedding: torch.Tensor, head: torch.Tensor) -> int:
    n = sum(p.numel() for p in model.parameters())
    return n - embedding.numel() + (head.numel() if head is embedding else 0)


def torchtitan_model(flavor: str) -> torch.nn.Module:
    """torchtitan's own model of ``flavor``, built on the current default device."""
    from torchtitan.models.llama3 import llama3_configs

    return llama3_configs[flavor](attn_backend="flex").build()


def dry_run(flavor: str) -> dict:
    """Both configurations on the meta device: their parameter counts must agree."""
    cfg = FLAVORS[flavor]
    with torch.device("meta"):
        cantata = sum(p.numel() for p in Decoder(cfg).parameters())
        titan = (
            sum(p.numel() for p in torchtitan_model(flavor).parameters())
            if importlib.util.find_spec("torchtitan")
            else None
        )
    expected = expected_parameters(cfg)
    report = {
        "flavor": flavor,
        "config": dataclasses.asdict(cfg),
        "cantata_parameters": cantata,
        "expected_parameters": expected,
        "torchtitan_parameters": titan,
    }
    if cantata != expected or (titan is not None and titan != cantata):
        raise SystemExit(f"parameter counts differ: {json.dumps(report)}")
    return report


def _side(model: torch.nn.Module, forward: Callable, args, device: torch.device) -> Callable[[], float]:
    """One training step of ``model`` (fused AdamW, bf16 autocast) on a fixed random batch."""
    vocab = FLAVORS[args.flavor].vocab_size
    tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def build_sides(args, device: torch.device) -> dict[str, tuple[Callable, int]]:
    from cantata.trainer.float8 import convert_to_float8
    from cantata.trainer.regional_compile import compile_blocks

    torch.manual_seed(0)
    with device:
        cantata = Decoder(FLAVORS[args.flavor])
        titan = torchtitan_model(args.flavor)
    titan.init_states(buffer_device=device)
    for model in (cantata, titan):
        if args.float8:
            convert_to_float8(model, device)
    if args.compile:
        compile_blocks(cantata)
        for block in titan.layers.children():  # what torchtitan's apply_compile does to each block
            block.compile(fullgraph=True)
    return {
        "cantata": (
            _side(cantata, lambda x: cantata(x)[0], args, device),
            matmul_parameters(cantata, cantata.embed_tokens.weight, cantata.lm_head.weight),
        ),
        "torchtitan": (
            _side(titan, titan, args, device),
            matmul_parameters(titan, titan.tok_embeddings.weight, titan.lm_head.weight),
        ),
    }


def measure(args) -> dict:
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    if peak is None:
        raise SystemExit(f"no known bf16 peak for {name!r}: give --peak-tflops")
    sides = build_sides(args, device)
    for step, _ in sides.values():
        for _ in range(args.warmup):
            step()
    torch.cuda.synchronize()
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, (step, _) in sides.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            rates[side].append(args.batch * args.seq * args.steps / (time.perf_counter() - start))
    result: dict = {
        "device": name,
        "flavor": args.flavor,
        "config": dataclasses.asdict(FLAVORS[args.flavor]),
        "batch": [args.batch, args.seq],
        "precision": "bf16 autocast" + (", float8 linears" if args.float8 else ""),
        "compile": args.compile,
        "float8": args.float8,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "peak_tflops": peak,
    }
    for side, (_, n) in sides.items():
        tokens_per_s = statistics.median(rates[side])
        result[side] = {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_rounds": rates[side],
            "mfu": 6 * n * tokens_per_s / (peak * 1e12),
            "parameters_without_embedding": n,
        }
    result["cantata_over_torchtitan"] = result["cantata"]["tokens_per_s"] / result["torchtitan"]["tokens_per_s"]
    result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavor", choices=sorted(FLAVORS), default="1B")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per side (they pay the compile)")
    parser.add_argument("--compile", action="store_true", help="compile each transformer block, both sides")
    parser.add_argument("--float8", action="store_true", help="float8 linears (torchao), both sides")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU")
    parser.add_argument("--dry-run", action="store_true", help="check the configurations on the meta device only")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the JSON (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(json.dumps(dry_run(args.flavor), indent=2))
        return 0
    if not torch.cuda.is_available():
        print("gpu_vs_torchtitan.py needs a CUDA GPU; nothing was measured or written", file=sys.stderr)
        return 2
    if importlib.util.find_spec("torchtitan") is None:
        print(
            "torchtitan is not importable (this script installs nothing: pip install torchtitan beforehand, "
            "from a local mirror where there is no internet); nothing was measured or written",
            file=sys.stderr,
        )
        return 2
    dry_run(args.flavor)
    result = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("-compile" if args.compile else "") + ("-float8" if args.float8 else "")
    path = args.out / f"gpu_vs_torchtitan-{args.flavor}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['device']} {args.flavor}: cantata {result['cantata']['tokens_per_s']:,.0f} tokens/s "
        f"(MFU {result['cantata']['mfu']:.1%}), torchtitan {result['torchtitan']['tokens_per_s']:,.0f} tokens/s "
        f"(MFU {result['torchtitan']['mfu']:.1%}): x{result['cantata_over_torchtitan']:.2f}; wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
