"""The Llama/Qwen3 decoder family, in the spirit of torchtitan and nanoGPT.

RMSNorm before attention and MLP, rotary position embeddings (the
rotate-half convention of Hugging Face checkpoints), grouped-query attention
through ``F.scaled_dot_product_attention``, a SwiGLU MLP and, optionally,
per-head RMSNorm of queries and keys (Qwen3) and an output head tied to the
embedding. Parameter names follow the Hugging Face layout without its
``model.`` prefix (``layers.0.self_attn.q_proj.weight``), so real weights map
one to one. The projections are separate linears, and attention reshapes to
``(-1, head_dim)``, so tensor parallelism shards them by heads with plain
column/row plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class DecoderConfig:
    dim: int  # hidden size
    n_layers: int
    n_heads: int
    n_kv_heads: int  # grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads
    head_dim: int  # not always dim / n_heads (Qwen3: 128 everywhere)
    ffn_dim: int  # SwiGLU intermediate size
    vocab_size: int
    block_size: int  # the longest sequence the model was made for
    rope_theta: float
    norm_eps: float
    tie_embeddings: bool
    qk_norm: bool

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")


def rotary(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each ``(seq_len, head_dim)`` (the two halves repeat)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(b, heads, t, head_dim)`` by position."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds its own share of them
        q = self.q_proj(x).view(b, t, -1, self.head_dim)
        k = self.k_proj(x).view(b, t, -1, self.head_dim)
        v = self.v_proj(x).view(b, t, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """``forward(idx, targets)`` returns ``(logits, loss)`` like the byte GPT."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.checkpoint_layers = False  # activation checkpointing: recompute each layer in the backward pass
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, 0.02) weights, output projections scaled by depth; norms at one."""
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and not (self.cfg.tie_embeddings and name == "lm_head"):
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o_proj", "down_proj")) else 0.02
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed_tokens(idx)
        cos, sin = rotary(idx.shape[1], self.cfg.head_dim, self.cfg.rope_theta, idx.device)
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if self.checkpoint_layers else layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
