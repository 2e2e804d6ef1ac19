"""``Client``: one identity's connection to a Cantata server, and the resources that group its calls.

``client.jobs``, ``client.checkpoints``, ``client.data_sources``, ``client.webhooks``, ``client.sweeps``,
``client.audit``, ``client.dashboard`` and, for admins, ``client.tenants`` and ``client.admin`` each live in a
module of their own. The client's flat names (``client.submit(job)``, ``client.get(job_id)``,
``client.download_checkpoint(...)``, ...) are those resources' methods, delegated in one line each.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import grpc

from cantata.proto.v1 import (
    admin_pb2_grpc,
    audit_pb2_grpc,
    checkpoints_pb2_grpc,
    dashboard_pb2_grpc,
    datasources_pb2_grpc,
    jobs_pb2_grpc,
    sweeps_pb2_grpc,
    webhooks_pb2_grpc,
)
from cantata.sdk.admin import Admin, Anomaly
from cantata.sdk.audit import Audit, AuditEvent, AuditReport
from cantata.sdk.checkpoints import Checkpoint, Checkpoints, checkpoint_config
from cantata.sdk.dashboard import Dashboard, DashboardLogin
from cantata.sdk.datasources import DataSource, DataSources, data_source_request
from cantata.sdk.errors import CantataError, from_rpc_error
from cantata.sdk.jobs import Event, JobHandle, Jobs, JobStatus, MetricRow
from cantata.sdk.profiles import Profile
from cantata.sdk.sweeps import Sweeps
from cantata.sdk.tenants import KeyRotation, Tenant, Tenants
from cantata.sdk.webhooks import Webhooks

__all__ = [  # the resources' types, importable from here as before they had modules of their own
    "Anomaly",
    "AuditEvent",
    "AuditReport",
    "Checkpoint",
    "Client",
    "DashboardLogin",
    "DataSource",
    "Event",
    "JobHandle",
    "JobStatus",
    "KeyRotation",
    "MetricRow",
    "Tenant",
    "checkpoint_config",
    "data_source_request",
]

TIMEOUT = 30.0
RESUME_WINDOW = 120.0  # seconds a dropped event stream is resumed for before StreamInterrupted
# gRPC's own reconnect backoff grows to 120 s: cap it so a restarted server is found within seconds.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
]

P = ParamSpec("P")
T = TypeVar("T")


def _delegate(resource: str, method: Callable[Concatenate[Any, P], T]) -> Callable[Concatenate[Client, P], T]:
    """A ``Client`` method that is ``method`` of the client's resource ``resource``: its call, signature and
    docstring (``__wrapped__`` is ``method``)."""

    @functools.wraps(method)
    def delegate(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(getattr(self, resource), *args, **kwargs)

    return delegate


def _read(path_or_pem: str | os.PathLike | bytes) -> bytes:
    return path_or_pem if isinstance(path_or_pem, bytes) else Path(path_or_pem).read_bytes()


class Client:
    """A connection to a Cantata server with one identity (a profile's certificate).

    Its calls are grouped by resource (``client.jobs.submit(job)``, ``client.checkpoints.download(...)``);
    the flat names below are the same methods (``client.submit(job)``).
    """

    def __init__(
        self,
        address: str,
        *,
        ca,
        cert=None,
        key=None,
        timeout: float = TIMEOUT,
        resume_window: float = RESUME_WINDOW,
        profile: str = "",
    ):
        """``timeout`` bounds each call; ``resume_window`` is how long ``events()`` resumes a dropped stream;
        ``profile`` is the name of the profile the identity came from (errors name it)."""
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(ca),
            private_key=_read(key) if key is not None else None,
            certificate_chain=_read(cert) if cert is not None else None,
        )
        self.address = address
        self.profile = profile
        self.timeout = timeout
        self.resume_window = resume_window
        self._channel = grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        self._jobs = jobs_pb2_grpc.JobsStub(self._channel)
        self._checkpoints = checkpoints_pb2_grpc.CheckpointsStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._audit = audit_pb2_grpc.AuditStub(self._channel)
        self._data_sources = datasources_pb2_grpc.DataSourcesStub(self._channel)
        self._dashboard = dashboard_pb2_grpc.DashboardStub(self._channel)
        self._webhooks = webhooks_pb2_grpc.WebhooksStub(self._channel)
        self._sweeps = sweeps_pb2_grpc.SweepsStub(self._channel)
        self.jobs = Jobs(self)
        self.checkpoints = Checkpoints(self)  # client.checkpoints(job_id) lists them
        self.data_sources = DataSources(self)  # client.data_sources() lists them
        self.webhooks = Webhooks(self)
        self.sweeps = Sweeps(self)
        self.audit = Audit(self)
        self.dashboard = Dashboard(self)
        self.tenants = Tenants(self)  # admins; client.tenants() lists them
        self.admin = Admin(self)

    @classmethod
    def from_profile(cls, name: str, **kwargs) -> Client:
        profile = Profile.named(name)
        if not profile.exists:
            raise FileNotFoundError(f"no profile {name!r} under {profile.folder.parent}")
        if not profile.cert.exists():
            raise FileNotFoundError(f"profile {name!r} has no certificate yet: run `cantata tenant status {name}`")
        return cls(profile.server, ca=profile.ca, cert=profile.cert, key=profile.key, profile=name, **kwargs)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _error(self, err: grpc.RpcError) -> CantataError:
        """The SDK's error for ``err``; one that reached no server says where the call went."""
        profile = f" (profile {self.profile})" if self.profile else ""
        return from_rpc_error(err, target=f"the Cantata server at {self.address}{profile}")

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise self._error(err) from None

    # ---- the flat names: each one resource method ------------------------
    submit = _delegate("jobs", Jobs.submit)
    check = _delegate("jobs", Jobs.check)
    get = _delegate("jobs", Jobs.get)
    job = _delegate("jobs", Jobs.handle)
    list = _delegate("jobs", Jobs.list)
    cancel = _delegate("jobs", Jobs.cancel)
    resume = _delegate("jobs", Jobs.resume)
    delete = _delegate("jobs", Jobs.delete)
    events = _delegate("jobs", Jobs.events)
    metrics = _delegate("jobs", Jobs.metrics)
    logs = _delegate("jobs", Jobs.logs)
    download_checkpoint = _delegate("checkpoints", Checkpoints.download)
    register_data_source = _delegate("data_sources", DataSources.register)
    delete_data_source = _delegate("data_sources", DataSources.delete)
    audit_report = _delegate("audit", Audit.report)
    audit_events = _delegate("audit", Audit.events)
    dashboard_login = _delegate("dashboard", Dashboard.login)
    approve_tenant = _delegate("tenants", Tenants.approve)
    set_quota = _delegate("tenants", Tenants.set_quota)
    set_retention = _delegate("tenants", Tenants.set_retention)
    rotate_tenant_key = _delegate("tenants", Tenants.rotate_key)
    reject_tenant = _delegate("tenants", Tenants.reject)
    suspend_tenant = _delegate("tenants", Tenants.suspend)
    resume_tenant = _delegate("tenants", Tenants.resume)
    add_scraper = _delegate("admin", Admin.add_scraper)
    revoke_certificate = _delegate("admin", Admin.revoke_certificate)
    simulate_attack = _delegate("admin", Admin.simulate_attack)
    inject_fault = _delegate("admin", Admin.inject_fault)
    anomalies = _delegate("admin", Admin.anomalies)
