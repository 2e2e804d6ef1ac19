"""Cantata: a secure multi-tenant training platform.

The subpackages live in top-level folders of the repository (see docs/architecture.md):
``cantata.proto`` (wire contract), ``cantata.sdk`` (client and CLI),
``cantata.server`` (control plane), ``cantata.trainer`` (worker processes),
``cantata.security`` and ``cantata.storage``.

``cantata.__version__`` is read from the installed distribution's metadata when
asked for (importing ``importlib.metadata`` at every start would slow the CLI).
"""


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module 'cantata' has no attribute {name!r}")
    import importlib.metadata

    try:
        return importlib.metadata.version("cantata")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
