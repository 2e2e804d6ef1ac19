"""A downloaded checkpoint as files any PyTorch user can load: ``model.safetensors`` and ``config.json``.

The SDK never imports torch, so it finds these converters through the
``cantata.checkpoint_formats`` entry point (installed with the trainer's
dependencies) and hands them the downloaded state dict and the config it made
(:func:`cantata.sdk.client.checkpoint_config`). ``safetensors`` writes the
model's state dict, tensor for tensor, with that config; loading it needs
``safetensors`` and ``torch``, not Cantata. ``hf`` writes a decoder as a
Hugging Face Llama or Qwen3 folder (:mod:`cantata.trainer.hf`) that
``transformers.AutoModelForCausalLM.from_pretrained`` loads. A mesh job's
sharded checkpoint arrives as a directory of its decrypted objects (every
rank's shards and DCP's metadata) and is consolidated here into full tensors
(:func:`cantata.trainer.sealed_dcp.consolidate`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WEIGHTS, CONFIG = "model.safetensors", "config.json"


class ExportError(ValueError):
    """The checkpoint cannot be written in the asked format."""


def write_safetensors(state_path: Path, out_dir: str | os.PathLike, config: dict[str, object]) -> Path:
    """Write the state dict at ``state_path`` (``torch.save``, or a sharded checkpoint's objects) as safetensors.

    The result is ``out_dir/model.safetensors`` (full tensors) + ``out_dir/config.json``.
    """
    return _write(_full_tensors(state_path), out_dir, config, {"model": str(config["model"])})


def write_hf(state_path: Path, out_dir: str | os.PathLike, config: dict[str, object]) -> Path:
    """Write a decoder's state dict at ``state_path`` as a Hugging Face folder: its config.json and weights.

    Tensors get Hugging Face's names (``model.``-prefixed); a tied head is left out, as
    ``transformers`` saves it. The job, step and Cantata model go under ``cantata`` in config.json.
    """
    from cantata.proto.vocabulary import MODEL_SHAPES, Model
    from cantata.trainer import hf
    from cantata.trainer.models import family_of, model_config

    model = Model(str(config["model"]))
    family, cfg = family_of(model), model_config(model)
    if family.hf_names is None:
        raise ExportError(f"format hf: {model} is {family.title}, which has no Hugging Face form")
    tensors = {
        hf.hf_name(name): tensor
        for name, tensor in _full_tensors(state_path).items()
        if not (cfg.tie_embeddings and name == hf.HEAD)
    }
    provenance = {key: value for key, value in config.items() if key not in MODEL_SHAPES[model]}
    dtype = str(tensors[hf.hf_name("embed_tokens.weight")].dtype).removeprefix("torch.")
    return _write(tensors, out_dir, hf.hf_config(cfg, dtype, provenance), {})


def _full_tensors(state_path: Path) -> dict[str, torch.Tensor]:
    """The model's full tensors from a ``torch.save`` state dict, or joined from a sharded checkpoint's objects."""
    import torch

    if state_path.is_dir():  # a sharded checkpoint's objects: join every rank's chunks
        from cantata.security.sealed_checkpoint import SHARDED_PART
        from cantata.trainer.sealed_dcp import consolidate

        state = consolidate(lambda name: (state_path / name).read_bytes(), SHARDED_PART, "model.")
    else:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    return {name: tensor.detach().contiguous().clone() for name, tensor in state.items()}


def _write(
    tensors: dict[str, torch.Tensor], out_dir: str | os.PathLike, config: dict[str, object], metadata: dict[str, str]
) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt", **metadata})
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out
