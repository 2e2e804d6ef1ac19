"""The Llama/Qwen3 decoder family (:mod:`cantata.trainer.decoder`): Qwen3 normalises queries and keys, Llama not.

Each layer's attention and MLP projections get column/row tensor-parallel
plans (query and key norms act on a rank's own heads, as sequence-parallel
modules whose weight gradients are summed); on the Hub a config is a
``qwen3`` or a ``llama`` checkpoint by the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

from cantata.proto.vocabulary import Shape
from cantata.trainer.decoder import Decoder, DecoderConfig
from cantata.trainer.models.registry import ModelFamily, register

HF_NAMES = {False: ("llama", "LlamaForCausalLM"), True: ("qwen3", "Qwen3ForCausalLM")}  # by qk_norm


def _published(dim: int, layers: int, heads: int, ffn: int, *, tie: bool, qwen3: bool) -> dict[str, Shape]:
    """A shape of the published configs, with head_dim 128 and 8 key/value heads in both families.

    Qwen3: vocabulary 151936, rope theta 1e6, RMSNorm of queries and keys;
    Llama 3: vocabulary 128256, rope theta 500000.
    """
    return {
        "dim": dim,
        "n_layers": layers,
        "n_heads": heads,
        "n_kv_heads": 8,
        "head_dim": 128,
        "ffn_dim": ffn,
        "vocab_size": 151936 if qwen3 else 128256,
        "block_size": 40960 if qwen3 else 8192,
        "rope_theta": 1_000_000.0 if qwen3 else 500_000.0,
        "norm_eps": 1e-6 if qwen3 else 1e-5,
        "tie_embeddings": tie,
        "qk_norm": qwen3,
    }


_TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 192, "vocab_size": 512, "block_size": 512}
# Each model's shape: what the trainer builds and what a downloaded checkpoint's config.json describes.
MODELS: dict[str, dict[str, Shape]] = {
    "llama-tiny": {**_published(0, 0, 0, 0, tie=False, qwen3=False), **_TINY, "head_dim": 16},
    # heads x head_dim != dim, as in Qwen3-0.6B and 32B
    "qwen3-tiny": {**_published(0, 0, 0, 0, tie=True, qwen3=True), **_TINY, "head_dim": 32},
    "qwen3-0.6b": _published(1024, 28, 16, 3072, tie=True, qwen3=True),
    "qwen3-1.7b": _published(2048, 28, 16, 6144, tie=True, qwen3=True),
    "qwen3-4b": _published(2560, 36, 32, 9728, tie=True, qwen3=True),
    "qwen3-8b": _published(4096, 36, 32, 12288, tie=False, qwen3=True),
    "qwen3-14b": _published(5120, 40, 40, 17408, tie=False, qwen3=True),
    "qwen3-32b": _published(5120, 64, 64, 25600, tie=False, qwen3=True),
    "llama3-8b": _published(4096, 32, 32, 14336, tie=False, qwen3=False),
    "llama3-70b": _published(8192, 80, 64, 28672, tie=False, qwen3=False),
}


def tp_plan(cfg: DecoderConfig, tp: int) -> dict[str, ParallelStyle]:
    """Column-parallel q/k/v and gate/up, row-parallel o and down: one all-reduce per attention and per MLP."""
    if cfg.n_kv_heads % tp:
        raise ValueError(f"tp {tp} does not divide the model's {cfg.n_kv_heads} key/value heads")
    plan: dict[str, ParallelStyle] = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    if cfg.qk_norm:  # (b, t, heads, head_dim): each rank normalises its own heads
        plan |= {
            name: SequenceParallel(sequence_dim=2, use_local_output=True)
            for name in ("self_attn.q_norm", "self_attn.k_norm")
        }
    return plan


def _config(shape: Mapping[str, Shape]) -> DecoderConfig:
    return DecoderConfig(**shape)  # type: ignore[arg-type]


def _blocks(model: nn.Module) -> nn.ModuleList:
    assert isinstance(model, Decoder)
    return model.layers


def _checkpointing(model: nn.Module, on: bool) -> None:
    assert isinstance(model, Decoder)
    model.checkpoint_layers = on


def _hf_names(cfg: DecoderConfig) -> tuple[str, str]:
    return HF_NAMES[cfg.qk_norm]


FAMILY = register(
    ModelFamily(
        name="decoder",
        title="a Llama/Qwen3 decoder",
        models=MODELS,
        config_type=DecoderConfig,
        config=_config,
        module_type=Decoder,
        build=Decoder,
        blocks=_blocks,
        tp_plan=tp_plan,
        checkpointing=_checkpointing,
        hf_names=_hf_names,
    )
)
