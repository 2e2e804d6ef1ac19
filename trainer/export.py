"""A downloaded checkpoint as files any PyTorch user can load: ``model.safetensors`` and ``config.json``.

The SDK never imports torch, so it finds this converter through the
``cantata.checkpoint_formats`` entry point (installed with the trainer's
dependencies) and hands it the downloaded state dict and the config it made
(:func:`cantata.sdk.client.checkpoint_config`). The weights are the model's
state dict, tensor for tensor; loading them needs ``safetensors`` and
``torch``, not Cantata. A mesh job's sharded checkpoint arrives as a directory
of its decrypted objects (every rank's shards and DCP's metadata) and is
consolidated here into full tensors (:func:`cantata.trainer.sealed_dcp.consolidate`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def write_safetensors(state_path: Path, out_dir: str | os.PathLike, config: dict[str, object]) -> Path:
    """Write the state dict at ``state_path`` (``torch.save``, or a sharded checkpoint's objects) as safetensors.

    The result is ``out_dir/model.safetensors`` (full tensors) + ``out_dir/config.json``.
    """
    import torch
    from safetensors.torch import save_file

    if state_path.is_dir():  # a sharded checkpoint's objects: join every rank's chunks
        from cantata.security.sealed_checkpoint import SHARDED_PART
        from cantata.trainer.sealed_dcp import consolidate

        state = consolidate(lambda name: (state_path / name).read_bytes(), SHARDED_PART, "model.")
    else:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    tensors = {name: tensor.detach().contiguous().clone() for name, tensor in state.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt", "model": str(config["model"])})
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out
