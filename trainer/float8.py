"""float8 training: torchao's float8 linears, on GPUs that have float8 tensor cores.

``convert_to_float8_training`` swaps a model's ``nn.Linear`` layers for
``Float8Linear``: weights stay in high precision, and each matmul casts its
inputs to float8 with a per-tensor scale (the "tensorwise" recipe). The output
head stays in high precision (as torchtitan keeps it), and so does any linear
whose sizes are not multiples of 16 (``torch._scaled_mm`` needs them). torchao
is imported only when a job asks for float8.
"""

from __future__ import annotations

import torch
from torch import nn

MIN_CAPABILITY = (8, 9)  # Ada and Hopper (L40S, H100, H200) and newer


class Float8Unsupported(ValueError):
    """The job asked for float8, but this worker's device has no float8 tensor cores (permanent)."""


def check_float8_device(device: torch.device) -> None:
    """Raise :class:`Float8Unsupported` unless ``device`` is a GPU of compute capability 8.9 or newer."""
    if device.type != "cuda":
        raise Float8Unsupported(
            f"float8 training needs an NVIDIA GPU of compute capability {'.'.join(map(str, MIN_CAPABILITY))} "
            f"or newer (H100, H200, L40S); this worker trains on the {device.type}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise Float8Unsupported(
            f"float8 training needs compute capability {'.'.join(map(str, MIN_CAPABILITY))} or newer; "
            f"{torch.cuda.get_device_name(device)} has {'.'.join(map(str, capability))}"
        )


def _float8_ready(module: nn.Module, name: str) -> bool:
    if not isinstance(module, nn.Linear) or name == "lm_head":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_to_float8(model: nn.Module, device: torch.device) -> int:
    """Swap ``model``'s eligible linears for float8 ones in place; returns how many were swapped."""
    check_float8_device(device)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # type: ignore[import-untyped]
    from torchao.float8.float8_linear import Float8Linear  # type: ignore[import-untyped]

    convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name("tensorwise"), module_filter_fn=_float8_ready
    )
    return sum(isinstance(m, Float8Linear) for m in model.modules())
