"""Cantata: a secure multi-tenant training platform.

The subpackages live in top-level folders of the repository (see docs/architecture.md):
``cantata.proto`` (wire contract), ``cantata.sdk`` (client and CLI),
``cantata.server`` (control plane), ``cantata.trainer`` (worker processes),
``cantata.security`` and ``cantata.storage``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("cantata")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
