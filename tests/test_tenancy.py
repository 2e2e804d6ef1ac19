"""Tenancy that holds: the role table on every method, lifecycle, quotas, revocation, rotation."""

from __future__ import annotations

import datetime as dt
import threading
import time
from types import SimpleNamespace

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from cantata.proto.v1 import tenancy_pb2, tenancy_pb2_grpc
from cantata.sdk import enroll, errors
from cantata.sdk.client import Client
from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from cantata.security import pki
from cantata.security.pki import CertificateAuthority, PeerCertificate, Principal
from cantata.server.auth import ADMIN, PUBLIC, RULES, TENANT, WORKER, Gatekeeper
from cantata.server.network.tls import rotate_server_certificate
from testkit.platform import cli
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_auth import all_methods, call_raw

LONG = dict(steps=100_000, batch_size=4, seq_len=16, eval_every=50_000, checkpoint_every=50_000)
ROLES = {ADMIN: Principal.admin("root"), TENANT: Principal.tenant("acme"), WORKER: Principal.worker("job-1", 0)}


def _peer(principal: Principal) -> PeerCertificate:
    return PeerCertificate(principal, serial=1, not_after=dt.datetime.now(dt.UTC))


@pytest.mark.parametrize("role", sorted(ROLES))
@pytest.mark.parametrize("method", sorted(RULES))
def test_each_role_gets_exactly_what_the_table_says(role, method):
    gate = Gatekeeper(
        certificates=SimpleNamespace(is_revoked=lambda s: False),
        tenants=SimpleNamespace(tenant_status=lambda n: "APPROVED"),
        jobs=SimpleNamespace(job_active=lambda j: True),
    )
    allowed = gate.decide(method, _peer(ROLES[role])).allowed
    assert allowed == (role in RULES[method] or PUBLIC in RULES[method])


def _ca(platform) -> CertificateAuthority:
    return CertificateAuthority.load(
        (platform.data_dir / "ca.pem").read_bytes(), (platform.data_dir / "ca.key").read_bytes()
    )


def _channel(platform, bundle: pki.Bundle | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        platform.ca_pem, bundle.key_pem if bundle else None, bundle.cert_pem if bundle else None
    )
    return grpc.secure_channel(platform.address, creds)


def _expired_bundle(ca: CertificateAuthority, principal: Principal) -> pki.Bundle:
    return ca.issue_bundle(principal, lifetime=dt.timedelta(minutes=-1))


CREDENTIALS = ("none", "other_ca", "expired", "revoked", "suspended_tenant", "tenant_on_admin")


@pytest.fixture(scope="module")
def bad_credentials(platform):
    """Each wrong credential, as a bundle (None: no certificate), and the methods it is tried on."""
    ca = _ca(platform)
    with platform.enroll("suspendee"):
        pass
    with platform.enroll("revokee"):
        pass
    with platform.enroll("honest"):
        pass
    profiles = {n: Profile.named(n) for n in ("suspendee", "revokee", "honest")}
    own = {n: pki.Bundle(p.cert.read_bytes(), p.key.read_bytes(), platform.ca_pem) for n, p in profiles.items()}
    with platform.admin() as admin:
        serial = next(t for t in admin.tenants() if t.name == "revokee").certificate_serial
        admin.revoke_certificate(serial, "lost laptop")
        admin.suspend_tenant("suspendee", "audit")
    return {
        "none": None,
        "other_ca": CertificateAuthority.create("Other CA").issue_bundle(
            Principal.admin("admin"), lifetime=dt.timedelta(hours=1)
        ),
        "expired": _expired_bundle(ca, Principal.admin("admin")),
        "revoked": own["revokee"],
        "suspended_tenant": own["suspendee"],
        "tenant_on_admin": own["honest"],
    }


def _expected(credential: str, method: str) -> grpc.StatusCode | None:
    if credential in ("none", "other_ca", "expired"):
        return grpc.StatusCode.UNAVAILABLE  # the TLS handshake itself fails
    if credential == "revoked":
        return None if PUBLIC in RULES[method] else grpc.StatusCode.UNAUTHENTICATED
    if credential == "suspended_tenant":
        return None if PUBLIC in RULES[method] else grpc.StatusCode.PERMISSION_DENIED
    if credential == "tenant_on_admin":
        return grpc.StatusCode.PERMISSION_DENIED if method.startswith("/cantata.v1.Admin/") else None
    raise AssertionError(credential)


REFUSALS = [
    (credential, method, streaming)
    for credential in CREDENTIALS
    for method, streaming in all_methods()
    if _expected(credential, method) is not None
]


@pytest.mark.parametrize("credential,method,streaming", REFUSALS)
def test_rejection_matrix(platform, bad_credentials, credential, method, streaming):
    with _channel(platform, bad_credentials[credential]) as channel:
        assert call_raw(channel, method, streaming) == _expected(credential, method)


def test_renewal_supersedes_the_old_certificate_and_needs_good_standing(platform):
    client = platform.enroll("renewer")
    old_serial = format(x509.load_pem_x509_certificate(Profile.named("renewer").cert.read_bytes()).serial_number, "x")
    expires = dt.datetime.fromisoformat(enroll.renew_certificate("renewer"))
    assert dt.timedelta(days=29) < expires - dt.datetime.now(dt.UTC) <= dt.timedelta(days=30)
    with platform.admin() as admin:
        listed = next(t for t in admin.tenants() if t.name == "renewer")
        assert listed.certificate_serial != old_serial
        with pytest.raises(errors.Unauthenticated):
            client.list()  # the old certificate stopped working when its renewal was issued
        with Client.from_profile("renewer") as fresh:
            assert fresh.list() == []  # the new certificate works
        admin.suspend_tenant("renewer")
        with pytest.raises(errors.PermissionDenied):
            enroll.renew_certificate("renewer")
        admin.resume_tenant("renewer")
    client.close()


def test_suspension_stops_running_jobs_within_ten_seconds(platform):
    client = platform.enroll("paused-co")
    handle = client.submit(Job(name="busy", **LONG))
    wait_for(lambda: handle.status().state == "RUNNING", timeout=JOB_TIMEOUT_S)
    with platform.admin() as admin:
        suspended_at = time.monotonic()
        admin.suspend_tenant("paused-co", "billing")
        with pytest.raises(errors.PermissionDenied):
            client.get(handle.id)
        wait_for(lambda: admin.tenants("SUSPENDED") and platform_job_state(platform, handle.id) == "CANCELLED")
        assert time.monotonic() - suspended_at < 10
        admin.resume_tenant("paused-co")
    status = client.get(handle.id)
    assert status.state == "CANCELLED" and status.reason == "tenant suspended"
    client.close()


def platform_job_state(platform, job_id: str) -> str:
    """Read a job's state straight from the server's database (the tenant cannot while suspended)."""
    import sqlite3

    from cantata.proto.v1 import common_pb2

    with sqlite3.connect(platform.data_dir / "state.db") as db:
        (state,) = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
    return common_pb2.JobState.Name(state)


def test_racing_submits_cannot_both_take_the_last_slot(platform):
    client = platform.enroll("quota-co", max_concurrent_jobs=1)
    results, barrier = [], threading.Barrier(6)

    def submit(i):
        barrier.wait()
        try:
            results.append(client.submit(Job(name=f"race{i}", **LONG)).id)
        except errors.QuotaExceeded as exc:
            results.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    accepted = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, errors.QuotaExceeded)]
    assert len(accepted) == 1 and len(refused) == 5
    assert refused[0].what == "concurrent jobs" and refused[0].limit == 1 and refused[0].used == 1
    with pytest.raises(errors.QuotaExceeded) as err:
        client.submit(Job(name="too-wide", workers=9, algorithm="allreduce", steps=10))
    assert err.value.what == "workers per job"
    with pytest.raises(errors.QuotaExceeded) as err:  # a worker group's ranks are processes too
        client.submit(Job(name="deep", workers=3, algorithm="gasloc", ranks_per_worker=3, steps=10))
    assert (err.value.what, err.value.used) == ("workers per job", 9)
    with platform.admin() as admin:
        assert admin.set_quota("quota-co", max_concurrent_jobs=2).max_concurrent_jobs == 2
    second = client.submit(Job(name="now-fits", **LONG))
    for job_id in (accepted[0], second.id):
        client.cancel(job_id)
    client.close()


def test_rejected_fingerprint_cannot_come_back(platform):
    csr = pki.make_csr(pki.new_key(), "spammer")
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    stub = tenancy_pb2_grpc.TenancyStub(channel)
    with channel:
        stub.RequestTenancy(tenancy_pb2.RequestTenancyRequest(name="spammer", csr_pem=csr))
        with platform.admin() as admin:
            admin.reject_tenant("spammer")
            assert "spammer" not in {t.name for t in admin.tenants()}
        with pytest.raises(grpc.RpcError) as err:
            stub.RequestTenancy(tenancy_pb2.RequestTenancyRequest(name="spammer", csr_pem=csr))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "rejected" in err.value.details()


def test_csr_names_are_ignored_the_ca_sets_its_own(platform):
    key = pki.new_key()
    sans = x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://cantata/admin/admin")])
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
        .add_extension(sans, critical=False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel:
        reply = tenancy_pb2_grpc.TenancyStub(channel).RequestTenancy(
            tenancy_pb2.RequestTenancyRequest(name="sneaky", csr_pem=csr)
        )
    with platform.admin() as admin:
        admin.approve_tenant("sneaky", reply.csr_fingerprint)
    import sqlite3

    with sqlite3.connect(platform.data_dir / "state.db") as db:
        (cert_pem,) = db.execute("SELECT cert_pem FROM tenants WHERE name='sneaky'").fetchone()
    principal = pki.certificate_principal(x509.load_pem_x509_certificate(cert_pem))
    assert principal == Principal.tenant("sneaky")


def test_ten_megabyte_request_is_refused(platform):
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel, pytest.raises(grpc.RpcError) as err:
        tenancy_pb2_grpc.TenancyStub(channel).RequestTenancy(
            tenancy_pb2.RequestTenancyRequest(name="big", csr_pem=b"x" * (10 << 20))
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_server_certificate_rotates_without_restart(platform):
    with platform.admin() as admin:
        admin.tenants()  # an open connection
        before = _served_serial(platform)
        serial = rotate_server_certificate(platform.paths, ["localhost"], ["127.0.0.1"])
        assert admin.tenants() is not None  # the existing client keeps working
    assert _served_serial(platform) == serial != before


def _served_serial(platform) -> int:
    import socket
    import ssl

    ctx = ssl.create_default_context(cadata=platform.ca_pem.decode())
    ctx.check_hostname = False
    address = ("127.0.0.1", int(platform.enroll_address.rsplit(":", 1)[1]))
    with socket.create_connection(address) as sock, ctx.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_admin_cli_prints_changes_and_fails_with_a_reason(platform):
    env = platform.env
    platform.enroll("cli-quota").close()
    out = cli("admin", "tenants", "set-quota", "cli-quota", "--max-jobs", "7", env=env).stdout
    assert "quota of cli-quota" in out and "jobs 0/7" in out
    bad = cli("admin", "tenants", "resume", "cli-quota", env=env, check=False)
    assert bad.returncode != 0 and "is APPROVED, not SUSPENDED" in bad.stderr
    missing = cli("admin", "tenants", "revoke-cert", "abc123", env=env, check=False)
    assert missing.returncode != 0 and "no certificate with serial abc123" in missing.stderr
