"""Cantata: a secure multi-tenant training platform.

The subpackages live in top-level folders of the repository (see DESIGN.md):
``cantata.proto`` (wire contract), ``cantata.sdk`` (client and CLI),
``cantata.server`` (control plane), ``cantata.trainer`` (worker processes),
``cantata.security`` and ``cantata.storage``.
"""

__version__ = "0.1.0"
