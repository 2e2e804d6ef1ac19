"""The executors a server may run its workers with, by the name ``server.json`` (or ``server start --executor``) gives.

A new executor joins here, with one line: its module defines
``build(setup: ExecutorSetup) -> Executor``, imported only when a server
chooses it.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cantata.security.pki import CertificateAuthority
from cantata.security.worker_confinement import ConfinementPolicy
from cantata.server.config import ServerSettings
from cantata.server.executors.base import Executor
from cantata.server.network.ports import CertificateRegistry, SecretsBroker
from cantata.server.store import JobRecord
from cantata.server.workers.sandbox import Identities


@dataclass(frozen=True)
class ExecutorKind:
    """One executor: the module that builds it, and what the server must know of it."""

    module: str  # defines build(setup: ExecutorSetup) -> Executor
    remote: bool = False  # its workers run on other machines: a file:// store must be under a shared root
    cluster: bool = False  # it needs the address of its cluster (--ray-address)

    def build(self, setup: ExecutorSetup) -> Executor:
        return importlib.import_module(self.module).build(setup)


EXECUTORS = {
    "local": ExecutorKind("cantata.server.executors.local"),
    "ray": ExecutorKind("cantata.server.executors.ray", remote=True, cluster=True),
}


def executor_kind(name: str, cluster_address: str = "") -> ExecutorKind:
    """The executor called ``name``; a ``ValueError`` saying why if it is none, or lacks its cluster's address."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r} ({' or '.join(EXECUTORS)})")
    kind = EXECUTORS[name]
    if kind.cluster and not cluster_address:
        raise ValueError(f"the {name} executor needs --ray-address HOST:PORT (or ray_address in server.json)")
    return kind


@dataclass(frozen=True)
class ExecutorSetup:
    """What the server starts its executor with."""

    settings: ServerSettings
    jobs_dir: Path
    ca: CertificateAuthority
    listen: str  # the server's listening address (host:port; the host may be a wildcard)
    connect_host: str  # the host a worker on this machine dials
    port: int
    cluster_address: str  # the cluster's (remote executors)
    gpus: int  # this node's (local executor; -1: count them)
    secrets: SecretsBroker
    certificates: CertificateRegistry
    identities: Identities
    memory_limit: Callable[[JobRecord], int]
    confinement: ConfinementPolicy
    note: Callable[[str, str], None]  # a line in a job's events

    @property
    def cert_lifetime(self) -> dt.timedelta:
        return dt.timedelta(hours=self.settings.worker_cert_hours)
