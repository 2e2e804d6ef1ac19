"""Model families, one module each, registered on import (:mod:`.registry` says what a family answers).

A new family is a module here that calls :func:`register`, imported below.
"""

from cantata.trainer.models import decoder, gpt
from cantata.trainer.models.registry import (
    FAMILIES,
    ModelFamily,
    family_of,
    family_of_config,
    family_of_module,
    model_config,
    register,
)

__all__ = [
    "FAMILIES",
    "ModelFamily",
    "decoder",
    "family_of",
    "family_of_config",
    "family_of_module",
    "gpt",
    "model_config",
    "register",
]
