"""The models the server accepts, each with its shape: what the trainer builds and what a downloaded
checkpoint's config.json describes.

Generated from the model families (:mod:`cantata.trainer.models`) by ``python -m cantata.proto.codegen``;
do not edit: a family's models and shapes are written in its module.
"""

from __future__ import annotations

import enum


class Model(enum.StrEnum):
    """The model configurations the server accepts, family by family."""

    GPT_TINY = "gpt-tiny"
    GPT_SMALL = "gpt-small"
    LLAMA_TINY = "llama-tiny"
    QWEN3_TINY = "qwen3-tiny"
    QWEN3_0_6B = "qwen3-0.6b"
    QWEN3_1_7B = "qwen3-1.7b"
    QWEN3_4B = "qwen3-4b"
    QWEN3_8B = "qwen3-8b"
    QWEN3_14B = "qwen3-14b"
    QWEN3_32B = "qwen3-32b"
    LLAMA3_8B = "llama3-8b"
    LLAMA3_70B = "llama3-70b"


MODEL_SHAPES: dict[Model, dict[str, int | float | bool]] = {
    Model.GPT_TINY: {'n_layer': 2, 'n_head': 4, 'n_embd': 64, 'block_size': 256, 'vocab_size': 256},
    Model.GPT_SMALL: {'n_layer': 4, 'n_head': 4, 'n_embd': 128, 'block_size': 512, 'vocab_size': 256},
    Model.LLAMA_TINY: {'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'head_dim': 16, 'ffn_dim': 192, 'vocab_size': 512, 'block_size': 512, 'rope_theta': 500000.0, 'norm_eps': 1e-05, 'tie_embeddings': False, 'qk_norm': False},
    Model.QWEN3_TINY: {'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'head_dim': 32, 'ffn_dim': 192, 'vocab_size': 512, 'block_size': 512, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': True, 'qk_norm': True},
    Model.QWEN3_0_6B: {'dim': 1024, 'n_layers': 28, 'n_heads': 16, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 3072, 'vocab_size': 151936, 'block_size': 40960, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': True, 'qk_norm': True},
    Model.QWEN3_1_7B: {'dim': 2048, 'n_layers': 28, 'n_heads': 16, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 6144, 'vocab_size': 151936, 'block_size': 40960, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': True, 'qk_norm': True},
    Model.QWEN3_4B: {'dim': 2560, 'n_layers': 36, 'n_heads': 32, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 9728, 'vocab_size': 151936, 'block_size': 40960, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': True, 'qk_norm': True},
    Model.QWEN3_8B: {'dim': 4096, 'n_layers': 36, 'n_heads': 32, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 12288, 'vocab_size': 151936, 'block_size': 40960, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': False, 'qk_norm': True},
    Model.QWEN3_14B: {'dim': 5120, 'n_layers': 40, 'n_heads': 40, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 17408, 'vocab_size': 151936, 'block_size': 40960, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': False, 'qk_norm': True},
    Model.QWEN3_32B: {'dim': 5120, 'n_layers': 64, 'n_heads': 64, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 25600, 'vocab_size': 151936, 'block_size': 40960, 'rope_theta': 1000000.0, 'norm_eps': 1e-06, 'tie_embeddings': False, 'qk_norm': True},
    Model.LLAMA3_8B: {'dim': 4096, 'n_layers': 32, 'n_heads': 32, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 14336, 'vocab_size': 128256, 'block_size': 8192, 'rope_theta': 500000.0, 'norm_eps': 1e-05, 'tie_embeddings': False, 'qk_norm': False},
    Model.LLAMA3_70B: {'dim': 8192, 'n_layers': 80, 'n_heads': 64, 'n_kv_heads': 8, 'head_dim': 128, 'ffn_dim': 28672, 'vocab_size': 128256, 'block_size': 8192, 'rope_theta': 500000.0, 'norm_eps': 1e-05, 'tie_embeddings': False, 'qk_norm': False},
}
# models of a family that is neither sharded nor exported to Hugging Face: byte-level GPTs
BYTE_GPTS = frozenset(
    {
        Model.GPT_TINY,
        Model.GPT_SMALL,
    }
)
