"""Model families, one module each, registered on import (:mod:`.registry` says what a family answers).

A new family is a module here that owns its models' shapes and calls :func:`register`, imported below;
``make proto`` then writes its models into the torch-free catalog the server and SDK read (``proto/models.py``).
"""

# isort: off
from cantata.trainer.models import gpt  # registered first: the byte GPTs lead the list of models
from cantata.trainer.models import decoder

# isort: on
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
