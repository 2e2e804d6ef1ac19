"""The model-family registry: what the trainer asks of a family of models, answered once per family.

A family (:class:`ModelFamily`) owns its models' shapes, makes a config of
each, builds the module, names its repeated blocks (compiled, checkpointed and
sharded one by one) and, where it has them, its tensor-parallel plan and its
Hugging Face names. The model builder, parallelism, regional compilation,
Hugging Face interchange and export ask :func:`family_of` (by model name),
:func:`family_of_config` or :func:`family_of_module`, never a class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from cantata.proto.vocabulary import Shape


@dataclass(frozen=True)
class ModelFamily:
    """One family of models and what the trainer asks of it."""

    name: str
    title: str  # what messages call one of its models: "a byte GPT"
    models: Mapping[str, Mapping[str, Shape]]  # the models it owns, by name: their shapes
    config_type: type  # what config() makes
    config: Callable[[Mapping[str, Shape]], Any]  # a shape -> the config build() takes
    module_type: type[nn.Module]  # what build() makes
    build: Callable[[Any], nn.Module]  # draws its initial values from the default generator
    blocks: Callable[[nn.Module], nn.ModuleList]  # the repeated blocks (each compiled and sharded alone)
    # (config, tensor-parallel degree) -> each block's plan, raising ValueError for a degree it cannot take;
    # None: the family is never sharded (no FSDP, no tensor parallelism)
    tp_plan: Callable[[Any, int], dict[str, ParallelStyle]] | None = None
    checkpointing: Callable[[nn.Module, bool], None] | None = None  # turns activation checkpointing on or off
    hf_names: Callable[[Any], tuple[str, str]] | None = None  # config -> (model_type, architecture) on the Hub


FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Add ``family``; a family or model name taken already is refused."""
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered already")
    taken = [model for model in family.models if any(model in other.models for other in FAMILIES.values())]
    if taken:
        raise ValueError(f"models {taken} belong to another family already")
    FAMILIES[family.name] = family
    return family


def family_of(model: str) -> ModelFamily:
    """The family that owns the model named ``model``."""
    for family in FAMILIES.values():
        if model in family.models:
            return family
    raise ValueError(f"unknown model {model!r}")


def family_of_config(cfg: object) -> ModelFamily:
    """The family whose config ``cfg`` is."""
    for family in FAMILIES.values():
        if isinstance(cfg, family.config_type):
            return family
    raise TypeError(f"{type(cfg).__name__} is no model family's config")


def family_of_module(module: nn.Module) -> ModelFamily:
    """The family whose model ``module`` is."""
    for family in FAMILIES.values():
        if isinstance(module, family.module_type):
            return family
    raise TypeError(f"{type(module).__name__} is no model family's model")


def model_config(model: str) -> Any:
    """The config of the model named ``model``."""
    family = family_of(model)
    return family.config(family.models[model])
