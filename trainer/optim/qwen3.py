"""Hidden-matrix shapes of Qwen3 models, the workload Canzona was measured on."""

from __future__ import annotations

from dataclasses import dataclass

HEAD_DIM = 128


@dataclass(frozen=True)
class Qwen3Config:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int


QWEN3 = {
    "0.6B": Qwen3Config(hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8),
    "1.7B": Qwen3Config(hidden=2048, intermediate=6144, layers=28, heads=16, kv_heads=8),
    "8B": Qwen3Config(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8),
    "32B": Qwen3Config(hidden=5120, intermediate=25600, layers=64, heads=64, kv_heads=8),
}


def qwen3_matrix_shapes(model: str, *, scale_down: int = 1, layers: int | None = None) -> list[tuple[int, int]]:
    """[out, in] shapes of every Muon matrix (q, k, v, o, gate, up, down per layer) in model order.

    `scale_down` divides every dimension (hidden, intermediate and head_dim);
    `layers` keeps only the first that many layers.
    """
    if model not in QWEN3:
        raise ValueError(f"unknown Qwen3 model {model!r}; known: {sorted(QWEN3)}")
    config = QWEN3[model]
    for dim in (config.hidden, config.intermediate, HEAD_DIM):
        if dim % scale_down:
            raise ValueError(f"scale_down={scale_down} does not divide dimension {dim}")
    h, f, d = config.hidden // scale_down, config.intermediate // scale_down, HEAD_DIM // scale_down
    q, kv = config.heads * d, config.kv_heads * d
    layer = [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f)]
    return layer * (config.layers if layers is None else layers)
