"""The model family by name: real Llama-3/Qwen3 shapes (counted on the meta device) and tiny ones that train."""

from __future__ import annotations

import pytest
import torch

from cantata.proto.vocabulary import BYTE_GPTS, MODEL_SHAPES, Model
from cantata.trainer.decoder import Decoder, DecoderConfig, apply_rotary, rotary
from cantata.trainer.model import MODELS, build_model
from cantata.trainer.optim import build_optimizer

# (total, non-embedding) parameters in billions, as the model cards publish them (Qwen3: rounded to 0.1 B).
PUBLISHED = {
    Model.QWEN3_0_6B: (0.6, 0.44),
    Model.QWEN3_1_7B: (1.7, 1.4),
    Model.QWEN3_4B: (4.0, 3.6),
    Model.QWEN3_8B: (8.2, 6.95),
    Model.QWEN3_14B: (14.8, 13.2),
    Model.QWEN3_32B: (32.8, 31.2),
    Model.LLAMA3_8B: (8.03, None),
    Model.LLAMA3_70B: (70.6, None),
}


def _count(model: Decoder) -> tuple[float, float]:
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed_tokens.weight.numel()
    head = 0 if model.cfg.tie_embeddings else model.lm_head.weight.numel()
    return total / 1e9, (total - embedding - head) / 1e9


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_real_shapes_have_the_published_parameter_counts(name):
    with torch.device("meta"):
        model = Decoder(MODELS[name])
    total, non_embedding = _count(model)
    published_total, published_non_embedding = PUBLISHED[name]
    digits = len(str(published_total).split(".")[1])
    assert round(total, digits) == published_total
    if published_non_embedding is not None:
        assert round(non_embedding, len(str(published_non_embedding).split(".")[1])) == published_non_embedding


def test_qwen3_and_llama3_differ_where_their_configs_do():
    qwen, llama = MODELS[Model.QWEN3_8B], MODELS[Model.LLAMA3_8B]
    assert isinstance(qwen, DecoderConfig) and isinstance(llama, DecoderConfig)
    assert (qwen.qk_norm, qwen.rope_theta, qwen.vocab_size) == (True, 1e6, 151936)
    assert (llama.qk_norm, llama.rope_theta, llama.vocab_size) == (False, 5e5, 128256)
    assert [MODELS[m].tie_embeddings for m in (Model.QWEN3_0_6B, Model.QWEN3_4B, Model.QWEN3_8B)] == [True, True, False]


def test_every_model_name_builds_from_its_shape():
    assert set(MODELS) == set(Model) == set(MODEL_SHAPES)
    assert {m for m in Model if not isinstance(MODELS[m], DecoderConfig)} == BYTE_GPTS


@pytest.mark.parametrize("name", ["llama-tiny", "qwen3-tiny"])
def test_tiny_decoders_are_causal_and_learn(name):
    model = build_model(name, seed=1)
    x = torch.randint(0, model.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, _ = model(x)
        changed = x.clone()
        changed[:, 12] = (changed[:, 12] + 1) % model.cfg.vocab_size
        after, _ = model(changed)
    assert torch.equal(before[:, :12], after[:, :12])  # no position sees the future
    assert not torch.equal(before[:, 12:], after[:, 12:])
    optimizer = build_optimizer(model, "muon", lr=0.02)
    losses = []
    for _ in range(20):  # one batch, memorised
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_tied_embeddings_share_one_tensor_and_muon_leaves_it_to_adamw():
    model = build_model("qwen3-tiny", seed=1)
    assert model.lm_head.weight is model.embed_tokens.weight
    optimizer = build_optimizer(model, "muon", lr=0.02)
    assert optimizer.muon is not None
    muon = {id(p) for p in optimizer.muon.params}
    assert id(model.embed_tokens.weight) not in muon
    assert id(model.layers[0].self_attn.q_proj.weight) in muon
    assert not build_model("llama-tiny", seed=1).cfg.tie_embeddings


def test_grouped_query_attention_matches_repeated_key_value_heads():
    cfg = MODELS[Model.LLAMA_TINY]
    model = build_model("llama-tiny", seed=3)
    attn = model.layers[0].self_attn
    x = torch.randn(1, 10, cfg.dim)
    cos, sin = rotary(10, cfg.head_dim, cfg.rope_theta, x.device)
    q = apply_rotary(attn.q_proj(x).view(1, 10, cfg.n_heads, cfg.head_dim).transpose(1, 2), cos, sin)
    k = apply_rotary(attn.k_proj(x).view(1, 10, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(1, 10, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    group = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / cfg.head_dim**0.5
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    expected = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 10, -1))
    torch.testing.assert_close(attn(x, cos, sin), expected, rtol=1e-5, atol=1e-6)


def test_rotary_scores_depend_only_on_relative_position():
    cos, sin = rotary(32, 16, 10_000.0, torch.device("cpu"))
    q, k = torch.randn(16), torch.randn(16)

    def score(i: int, j: int) -> torch.Tensor:
        qi = apply_rotary(q.expand(1, 1, 32, 16), cos, sin)[0, 0, i]
        kj = apply_rotary(k.expand(1, 1, 32, 16), cos, sin)[0, 0, j]
        return qi @ kj

    torch.testing.assert_close(score(5, 2), score(20, 17))
    assert not torch.allclose(score(5, 2), score(5, 3))
