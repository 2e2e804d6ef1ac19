"""The server picks its executor by name from one registry; both executors share one base."""

from __future__ import annotations

import pytest

from cantata.security.pki import CertificateAuthority
from cantata.security.worker_confinement import ConfinementPolicy
from cantata.server.config import ServerSettings
from cantata.server.executors.base import ExecutorBase
from cantata.server.executors.local import LocalExecutor
from cantata.server.executors.ray import RayExecutor
from cantata.server.executors.registry import EXECUTORS, ExecutorSetup, executor_kind
from cantata.server.workers.sandbox import Identities


def test_each_registered_executor_builds_one_of_the_shared_base(tmp_path):
    setup = ExecutorSetup(
        settings=ServerSettings(),
        jobs_dir=tmp_path / "jobs",
        ca=CertificateAuthority.create("test CA"),
        listen="0.0.0.0:7443",
        connect_host="127.0.0.1",
        port=7443,
        cluster_address="10.0.0.1:6379",
        gpus=0,
        secrets=None,  # nothing is launched
        certificates=None,
        identities=Identities(60000, 1, root=False),
        memory_limit=lambda job: 0,
        confinement=ConfinementPolicy(),
        note=lambda job_id, message: None,
    )
    built = {name: executor_kind(name, setup.cluster_address).build(setup) for name in EXECUTORS}
    assert {name: type(executor) for name, executor in built.items()} == {"local": LocalExecutor, "ray": RayExecutor}
    assert all(isinstance(executor, ExecutorBase) for executor in built.values())
    assert [name for name in EXECUTORS if EXECUTORS[name].remote] == ["ray"]


def test_an_unknown_executor_or_a_cluster_executor_without_its_address_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown executor 'slurm' \(local or ray\)"):
        executor_kind("slurm")
    with pytest.raises(ValueError, match="the ray executor needs --ray-address"):
        executor_kind("ray")


def test_server_start_refuses_an_executor_the_registry_does_not_know():
    from cantata.server.cli import _executor

    assert _executor("ray") == "ray"
    with pytest.raises(Exception, match=r"invalid choice: 'slurm' \(choose from local, ray\)"):
        _executor("slurm")
