"""Initial weights for fine-tuning (``init_from``): safetensors files loaded one at a time into a built model.

Names follow Hugging Face checkpoints; their ``model.`` prefix is dropped.
Each file's tensors are handed to ``set_model_state_dict`` as full tensors,
so on a mesh every rank keeps only its own shard of them, and no more than
one file is held at once. Every parameter must come from some file with its
exact shape; a missing or unknown tensor fails the job, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

PREFIX = "model."
SUFFIX = ".safetensors"


class WeightsError(ValueError):
    """The initial weights do not fit the job's model."""


def weight_files(path: Path) -> list[Path]:
    """``path`` itself, or the ``*.safetensors`` files in the directory ``path``, sorted."""
    files = sorted(path.glob("*" + SUFFIX)) if path.is_dir() else [path]
    if not files or not all(f.is_file() and f.name.endswith(SUFFIX) for f in files):
        raise WeightsError(f"init_from {path}: no {SUFFIX} file there")
    return files


def load_weights(model: torch.nn.Module, path: Path) -> int:
    """Load every tensor of the files at ``path`` into ``model``; returns the number of files read."""
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    tied = {name for name in expected if name == "lm_head.weight" and getattr(model.cfg, "tie_embeddings", False)}
    seen: set[str] = set()
    files = weight_files(path)
    for file in files:
        tensors: dict[str, Any] = {name.removeprefix(PREFIX): tensor for name, tensor in load_file(str(file)).items()}
        for name, tensor in tensors.items():
            if name not in expected:
                raise WeightsError(f"init_from {file.name}: tensor {name!r} is not in the model")
            if tuple(tensor.shape) != expected[name]:
                raise WeightsError(
                    f"init_from {file.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model's is {expected[name]}"
                )
        seen |= tensors.keys()  # before loading: set_model_state_dict fills the dict in
        set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True, strict=False))
    missing = sorted(set(expected) - seen - tied)
    if missing:
        raise WeightsError(
            f"init_from {path}: no tensor for {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    return len(files)
