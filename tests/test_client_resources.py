"""The client's resources: each call is written once, on its resource, and the flat names are those methods.

``client.submit(job)`` is ``client.jobs.submit(job)``, ``client.checkpoints(job_id)`` is
``client.checkpoints.list(job_id)``, ...: checked on the class, then by calling both ways against a real server.
"""

from __future__ import annotations

import inspect

import pytest

from cantata.sdk.admin import Admin
from cantata.sdk.audit import Audit
from cantata.sdk.checkpoints import Checkpoints
from cantata.sdk.client import Client
from cantata.sdk.dashboard import Dashboard
from cantata.sdk.datasources import DataSources
from cantata.sdk.errors import NotFound
from cantata.sdk.job import Job
from cantata.sdk.jobs import Jobs
from cantata.sdk.resource import Resource
from cantata.sdk.sweeps import Sweeps
from cantata.sdk.tenants import Tenants
from cantata.sdk.webhooks import Webhooks

RESOURCES = {
    "jobs": Jobs,
    "checkpoints": Checkpoints,
    "data_sources": DataSources,
    "webhooks": Webhooks,
    "sweeps": Sweeps,
    "audit": Audit,
    "dashboard": Dashboard,
    "tenants": Tenants,
    "admin": Admin,
}
CONNECTION = {"from_profile", "close"}  # what the client itself does: open and close its connection
S3 = {"access_key_id": "AKIADELEGATES", "secret_access_key": "secret"}


def test_every_flat_name_is_one_resource_method_and_no_method_is_written_twice():
    flat = {
        name: value
        for name, value in vars(Client).items()
        if not name.startswith("_") and callable(value) and name not in CONNECTION
    }
    wrapped = {}
    for name, value in flat.items():
        method = getattr(value, "__wrapped__", None)
        assert method is not None, f"Client.{name} is not a delegate to a resource: it holds logic of its own"
        owners = [attr for attr, cls in RESOURCES.items() if vars(cls).get(method.__name__) is method]
        assert len(owners) == 1, (name, method.__qualname__)
        wrapped[name] = method
    assert len(set(wrapped.values())) == len(wrapped), "two flat names for one resource method"
    for cls in RESOURCES.values():  # each resource's calls go through the client's one connection
        assert issubclass(cls, Resource)
        assert "__init__" not in vars(cls) and "_call" not in vars(cls), cls
    # the contract of ../shared/DESIGN.md
    for name in ("submit", "get", "list", "metrics", "download_checkpoint"):
        assert name in flat, name
    assert inspect.signature(Client.download_checkpoint) == inspect.signature(Checkpoints.download)


def test_the_flat_names_and_the_resources_answer_alike(platform, tenant):
    assert {name: type(getattr(tenant, name)) for name in RESOURCES} == RESOURCES
    job = Job(name="delegates", model="gpt-tiny", steps=10_000, batch_size=4, seq_len=16)
    handle = tenant.submit(job)
    assert tenant.jobs.submit(job).id == handle.id  # the same request id: the same job, whichever way
    tenant.jobs.cancel(handle.id)
    ended = handle.wait()
    assert ended.state == "CANCELLED" and ended.terminal
    assert tenant.get(handle.id) == tenant.jobs.get(handle.id) == ended
    assert tenant.job(handle.id).status() == ended
    assert tenant.list() == tenant.jobs.list() and handle.id in [j.id for j in tenant.list()]
    assert list(tenant.events(handle.id)) == list(tenant.jobs.events(handle.id))
    assert tenant.metrics(handle.id) == tenant.jobs.metrics(handle.id)
    assert tenant.checkpoints(handle.id) == tenant.checkpoints.list(handle.id) == []
    for download in (tenant.download_checkpoint, tenant.checkpoints.download):
        with pytest.raises(NotFound, match="has no checkpoint yet"):
            download(handle.id, None, "unused")

    source = tenant.register_data_source("delegated", kind="s3", credentials=S3)
    assert tenant.data_sources() == tenant.data_sources.list() == [source]
    tenant.delete_data_source("delegated")
    with pytest.raises(NotFound):
        tenant.data_sources.delete("delegated")
    submitted = list(tenant.audit_events(action="job_submitted"))
    assert submitted == list(tenant.audit.events(action="job_submitted")) and submitted

    with platform.admin() as admin:
        assert admin.tenants() == admin.tenants.list() and "acme" in [t.name for t in admin.tenants()]
        assert admin.anomalies(handle.id) == admin.admin.anomalies(handle.id) == []
