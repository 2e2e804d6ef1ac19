"""Hugging Face Llama and Qwen3 folders: their config.json checked against a job's decoder, their names mapped.

A folder that ``transformers`` saves holds ``config.json``, the weights as
``model.safetensors`` or as shards that ``model.safetensors.index.json``
lists, and tensors named ``model.layers.0.self_attn.q_proj.weight`` ...
``lm_head.weight``. Cantata's decoder (:mod:`cantata.trainer.decoder`) has
the same modules under the same names without ``model.``, the same
rotate-half rotary layout, RMSNorm and attention scaling, so tensors map one
to one, unpermuted; what must agree is the configuration, which
:func:`check_config` compares field by field (``transformers`` itself is
never imported here). :func:`hf_config` writes it back for an exported
checkpoint (:func:`cantata.trainer.export.write_hf`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from cantata.trainer.decoder import DecoderConfig
from cantata.trainer.models import family_of_config

PREFIX = "model."  # Hugging Face's prefix of every tensor but the output head's
HEAD = "lm_head.weight"
CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# DecoderConfig field -> config.json key, for the fields a checkpoint's tensors or numerics depend on
FIELDS = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "ffn_dim": "intermediate_size",
    "vocab_size": "vocab_size",
    "rope_theta": "rope_theta",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
}
SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
# config.json keys whose other values the decoder does not compute: key -> the value it must have
PLAIN = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "use_sliding_window": False,
    "rope_type": "default",
}


class HFConfigError(ValueError):
    """A Hugging Face config.json that is not the job's model: another family, size or computation."""


def cantata_name(name: str) -> str:
    """The decoder's name of the Hugging Face tensor ``name`` (``model.norm.weight`` -> ``norm.weight``)."""
    return name.removeprefix(PREFIX)


def hf_name(name: str) -> str:
    """The Hugging Face name of the decoder's tensor ``name``."""
    return name if name == HEAD else PREFIX + name


def hf_settings(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The values of ``FIELDS`` and ``PLAIN`` in a config.json, with transformers' defaults where one may be left out.

    The sizes must be there. Rotary settings are read from ``rope_parameters`` (transformers 5)
    or from ``rope_theta`` and ``rope_scaling`` (earlier configs, as published checkpoints ship).
    """
    absent = [key for key in SIZES if key not in config]
    if absent:
        raise HFConfigError(f"{where}: no {', '.join(absent)}")
    odd = [key for key in SIZES if type(config[key]) is not int or config[key] < 1]
    if odd:
        raise HFConfigError(f"{where}: {odd[0]} is {config[odd[0]]!r}, not a positive whole number")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise HFConfigError(f"{where}: rope_parameters is {rope!r}, not an object")
    settings = {key: config[key] for key in SIZES}
    family_head_dim = (
        128 if config.get("model_type") == "qwen3" else config["hidden_size"] // config["num_attention_heads"]
    )
    settings["head_dim"] = config.get("head_dim") or family_head_dim
    settings["rope_theta"] = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    settings["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6)
    settings["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
    settings |= {key: config.get(key, plain) for key, plain in PLAIN.items()}
    settings["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    if any(kind != "full_attention" for kind in config.get("layer_types") or ()):
        settings["layer_types"] = config["layer_types"]
    return settings


def check_config(config: Mapping[str, Any], cfg: object, where: str) -> None:
    """Refuse a Hugging Face ``config`` that is not of the decoder ``cfg``, naming the first field that differs.

    A config without ``model_type`` (no Hugging Face config: a Cantata export's, say) is not checked.
    """
    model_type = config.get("model_type")
    if model_type is None:
        return
    family = family_of_config(cfg)
    if family.hf_names is None:
        raise HFConfigError(f"{where}: model_type is {model_type!r}, the job's model is {family.title}")
    expected_type = family.hf_names(cfg)[0]
    if model_type != expected_type:
        raise HFConfigError(f"{where}: model_type is {model_type!r}, the job's model is {expected_type!r}")
    settings = hf_settings(config, where)
    for field, key in FIELDS.items():
        ours = getattr(cfg, field)
        if settings[key] != ours:
            raise HFConfigError(f"{where}: {key} is {settings[key]!r}, the job's model has {ours!r} ({field})")
    for key, plain in PLAIN.items():
        if settings[key] != plain:
            raise HFConfigError(f"{where}: {key} is {settings[key]!r}; Cantata's decoder computes only {plain!r}")
    if "layer_types" in settings:
        raise HFConfigError(f"{where}: layer_types {settings['layer_types']!r}; Cantata's decoder attends in full")


def checked_files(
    keys: tuple[str, ...], listing: Collection[str], read: Callable[[str], bytes], cfg: object, where: str
) -> tuple[str, ...]:
    """The weight files of a folder (``keys``: its ``.safetensors``; ``listing``: every file in it), checked.

    Its config.json, if any, must be the job's model (:func:`check_config`). With an index, its
    files are the ones the index names (others beside them, an older export say, are left alone),
    each of which must be there.
    """
    if CONFIG in listing:
        check_config(_json(read(CONFIG), f"{where}{CONFIG}"), cfg, f"{where}{CONFIG}")
    if INDEX not in listing:
        return keys
    weight_map = _json(read(INDEX), f"{where}{INDEX}").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise HFConfigError(f"{where}{INDEX}: no weight_map")
    files = tuple(sorted(set(weight_map.values())))
    absent = [name for name in files if name not in keys]
    if absent:
        raise HFConfigError(f"{where}{INDEX} names {', '.join(map(repr, absent))}, which is not there")
    return files


def hf_config(cfg: DecoderConfig, dtype: str, provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json of ``cfg`` as a Llama or Qwen3 checkpoint, with ``provenance`` under ``cantata``.

    Rotary settings are written both ways (transformers 5's ``rope_parameters`` and the older
    ``rope_theta``); token ids are left null: the tenant's tokenizer, not the model, knows them.
    """
    hf_names = family_of_config(cfg).hf_names
    assert hf_names is not None
    model_type, architecture = hf_names(cfg)
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        **{key: getattr(cfg, field) for field, key in FIELDS.items()},
        "max_position_embeddings": cfg.block_size,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_scaling": None,
        **{key: plain for key, plain in PLAIN.items() if key != "rope_type"},
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "dtype": dtype,
        "cantata": dict(provenance),
    }
    return config


def _json(data: bytes, where: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HFConfigError(f"{where}: not JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise HFConfigError(f"{where}: not a JSON object")
    return parsed
