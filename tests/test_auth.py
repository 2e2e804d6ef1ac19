"""Authentication and authorization on every method, over real TLS."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import grpc
import pytest

from cantata.proto.v1 import (
    admin_pb2,
    audit_pb2,
    checkpoints_pb2,
    dashboard_pb2,
    datasources_pb2,
    jobs_pb2,
    sweeps_pb2,
    tenancy_pb2,
    webhooks_pb2,
    worker_pb2,
)
from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.pki import CertificateAuthority, Principal
from cantata.server.auth import PUBLIC, RULES

SERVICE_MODULES = (
    tenancy_pb2,
    admin_pb2,
    jobs_pb2,
    sweeps_pb2,
    checkpoints_pb2,
    worker_pb2,
    audit_pb2,
    datasources_pb2,
    dashboard_pb2,
    webhooks_pb2,
)


def all_methods() -> list[tuple[str, bool]]:
    """(full method name, server-streaming) for every method in the generated descriptors."""
    return [
        (f"/{service.full_name}/{m.name}", m.server_streaming)
        for module in SERVICE_MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
    ]


def call_raw(channel: grpc.Channel, method: str, streaming: bool, metadata=()) -> grpc.StatusCode:
    """Call ``method`` with an empty request; return the status code."""
    identity = lambda b: b  # noqa: E731
    try:
        if streaming:
            list(
                channel.unary_stream(method, request_serializer=identity, response_deserializer=identity)(
                    b"", timeout=10, metadata=metadata
                )
            )
        else:
            channel.unary_unary(method, request_serializer=identity, response_deserializer=identity)(
                b"", timeout=10, metadata=metadata
            )
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_every_generated_method_has_exactly_one_rule():
    generated = {name for name, _ in all_methods()}
    ours = {m for m in RULES if m.startswith("/cantata.")}
    assert generated == ours, f"missing rules: {generated - ours}; stale rules: {ours - generated}"


def test_unknown_method_is_denied_not_allowed():
    from cantata.server.auth import Gatekeeper

    gate = Gatekeeper(
        SimpleNamespace(is_revoked=lambda s: False),
        SimpleNamespace(tenant_status=lambda n: "APPROVED"),
        SimpleNamespace(job_active=lambda j: True),
    )
    assert not gate.decide("/cantata.v1.Jobs/DeleteEverything", None).allowed


def _channel(platform, cert=None, key=None):
    return grpc.secure_channel(
        platform.address, grpc.ssl_channel_credentials(platform.ca_pem, private_key=key, certificate_chain=cert)
    )


@pytest.mark.parametrize("method,streaming", all_methods())
def test_no_client_certificate_is_refused_on_the_main_port(platform, method, streaming):
    with _channel(platform) as channel:
        assert call_raw(channel, method, streaming) == grpc.StatusCode.UNAVAILABLE  # TLS handshake refused


@pytest.mark.parametrize("method,streaming", all_methods())
def test_enrollment_port_serves_only_the_public_methods(platform, method, streaming):
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel:
        code = call_raw(channel, method, streaming)
    if PUBLIC in RULES[method]:
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)  # reached the handler
    else:  # not served there, or served but refused without a certificate
        assert code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.parametrize("method,streaming", all_methods())
def test_certificate_from_another_ca_is_refused_everywhere(platform, method, streaming):
    rogue = CertificateAuthority.create("Rogue CA").issue_bundle(
        Principal.admin("admin"), lifetime=dt.timedelta(hours=1)
    )
    with _channel(platform, rogue.cert_pem, rogue.key_pem) as channel:
        code = call_raw(channel, method, streaming)
    assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.parametrize("method,streaming", [m for m in all_methods() if "/cantata.v1.Admin/" in m[0]])
def test_tenant_certificate_on_admin_methods_is_permission_denied(platform, tenant, method, streaming):
    profile = platform.home / "profiles" / "acme"
    with _channel(platform, (profile / "cert.pem").read_bytes(), (profile / "key.pem").read_bytes()) as channel:
        code = call_raw(channel, method, streaming, metadata=(("x-cantata-principal", "spiffe://cantata/admin/admin"),))
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_one_tenant_cannot_see_or_touch_anothers_job(platform, tenant):
    job = tenant.submit(Job(name="private", steps=20, batch_size=4, seq_len=16, eval_every=10, checkpoint_every=10))
    with platform.enroll("rival") as rival:
        assert rival.list() == []
        for probe in (
            lambda c, j: c.get(j),
            lambda c, j: c.cancel(j),
            lambda c, j: c.checkpoints(j),
            lambda c, j: list(c.events(j)),
            lambda c, j: list(c.logs(j)),
            lambda c, j: c.download_checkpoint(j, 10, "/tmp/never"),
            lambda c, j: c.metrics(j),
        ):
            with pytest.raises(errors.NotFound) as theirs:
                probe(rival, job.id)
            with pytest.raises(errors.NotFound) as missing:
                probe(rival, "job-0000000000000000")
            assert (
                theirs.value.message.replace(job.id, "ID").split(" (request")[0]
                == missing.value.message.replace("job-0000000000000000", "ID").split(" (request")[0]
            )
    assert tenant.get(job.id).state != "CANCELLED"
    tenant.cancel(job.id)


def test_suspended_tenant_is_refused_at_once(platform):
    client = platform.enroll("shady")
    with platform.admin() as admin:
        admin.suspend_tenant("shady", "unpaid")
        with pytest.raises(errors.PermissionDenied, match="suspended"):
            client.list()
        admin.resume_tenant("shady")
    assert client.list() == []
    client.close()


def test_worker_certificate_cannot_report_for_another_job(platform, tenant):
    ca = CertificateAuthority.load(
        (platform.data_dir / "ca.pem").read_bytes(), (platform.data_dir / "ca.key").read_bytes()
    )
    long = dict(steps=100_000, batch_size=4, seq_len=16, eval_every=50_000, checkpoint_every=50_000)
    job = tenant.submit(Job(name="victim", **long))
    other = tenant.submit(Job(name="attacker", **long))
    attacker = ca.issue_bundle(Principal.worker(other.id, 0), lifetime=dt.timedelta(hours=1))
    from cantata.proto.v1 import worker_pb2_grpc

    with _channel(platform, attacker.cert_pem, attacker.key_pem) as channel, pytest.raises(grpc.RpcError) as err:
        worker_pb2_grpc.WorkerStub(channel).Report(
            worker_pb2.WorkerReport(job_id=job.id, worker=0, finished=worker_pb2.Finished()), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    tenant.cancel(job.id)
    tenant.cancel(other.id)
