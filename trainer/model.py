"""The models a job trains, by name: a small GPT over bytes (vocabulary 256, in the spirit of nanoGPT)
and the Llama/Qwen3 decoder family (:mod:`cantata.trainer.decoder`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from cantata.proto.vocabulary import BYTE_GPTS, MODEL_SHAPES, Model
from cantata.trainer.decoder import Decoder, DecoderConfig
from cantata.trainer.deferred_init import InitPlan, InitRecorder


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int = 256


MODELS: dict[Model, GPTConfig | DecoderConfig] = {
    model: GPTConfig(**shape) if model in BYTE_GPTS else DecoderConfig(**shape)  # type: ignore[arg-type]
    for model, shape in MODEL_SHAPES.items()
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.fc_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


LanguageModel = GPT | Decoder  # forward(idx, targets) -> (logits, loss); .cfg has block_size and vocab_size


def _construct(name: str) -> LanguageModel:
    cfg = MODELS[Model(name)]
    return GPT(cfg) if isinstance(cfg, GPTConfig) else Decoder(cfg)


def build_model(name: str, seed: int) -> LanguageModel:
    """The named model with deterministic initial weights (same on every worker)."""
    torch.manual_seed(seed)
    return _construct(name)


def build_meta_model(name: str) -> tuple[LanguageModel, InitPlan]:
    """The named model on the meta device (no memory), and how :func:`build_model` would initialise it.

    ``cantata.trainer.deferred_init.materialize`` gives it, once sharded, the very
    values ``build_model(name, seed)`` has.
    """
    with torch.device("meta"), InitRecorder() as recorder:
        model = _construct(name)
    return model, recorder.plan(model)
