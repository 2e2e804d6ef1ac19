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

from cantata.proto.vocabulary import BYTE_GPTS, MODEL_SHAPES, Shape
from cantata.trainer.decoder import Decoder, DecoderConfig
from cantata.trainer.models.registry import ModelFamily, register

HF_NAMES = {False: ("llama", "LlamaForCausalLM"), True: ("qwen3", "Qwen3ForCausalLM")}  # by qk_norm


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
        models={model: shape for model, shape in MODEL_SHAPES.items() if model not in BYTE_GPTS},
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
