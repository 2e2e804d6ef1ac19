"""The models a job trains, by name, built by their family (:mod:`cantata.trainer.models`): a small GPT over bytes
(vocabulary 256, in the spirit of nanoGPT) and the Llama/Qwen3 decoder family (:mod:`cantata.trainer.decoder`)."""

from __future__ import annotations

import torch

from cantata.proto.vocabulary import MODEL_SHAPES, Model
from cantata.trainer.decoder import Decoder, DecoderConfig
from cantata.trainer.deferred_init import InitPlan, InitRecorder
from cantata.trainer.models import family_of, model_config
from cantata.trainer.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "MODELS", "GPTConfig", "LanguageModel", "build_meta_model", "build_model"]

MODELS: dict[Model, GPTConfig | DecoderConfig] = {model: model_config(model) for model in MODEL_SHAPES}

LanguageModel = GPT | Decoder  # forward(idx, targets) -> (logits, loss); .cfg has block_size and vocab_size


def _construct(name: str) -> LanguageModel:
    return family_of(name).build(model_config(name))  # type: ignore[return-value]


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
