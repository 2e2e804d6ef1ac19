"""Enrollment over real TLS: request, fingerprint-checked approval, certificate fetch."""

from __future__ import annotations

import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from cantata.proto.v1 import tenancy_pb2, tenancy_pb2_grpc
from cantata.sdk import enroll, errors
from cantata.sdk.client import Client
from cantata.sdk.profiles import Profile
from cantata.security import pki


def _tenancy_stub(platform):
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    return channel, tenancy_pb2_grpc.TenancyStub(channel)


def test_request_is_pending_and_listed_with_its_fingerprint(platform):
    status = enroll.request_tenancy("pending-co", platform.address, platform.ca_pem, platform.enroll_address)
    assert status.status == "PENDING"
    assert status.fingerprint.startswith("sha256:") and len(status.fingerprint) == 7 + 64
    with platform.admin() as admin:
        listed = {t.name: t for t in admin.tenants("PENDING")}
    assert listed["pending-co"].fingerprint == status.fingerprint
    assert (Profile.named("pending-co").key.stat().st_mode & 0o777) == 0o600
    with pytest.raises(FileNotFoundError, match="no certificate yet"):
        Client.from_profile("pending-co")


def test_approval_requires_the_matching_fingerprint(platform):
    status = enroll.request_tenancy("careful-co", platform.address, platform.ca_pem, platform.enroll_address)
    with platform.admin() as admin:
        with pytest.raises(errors.Conflict, match="fingerprint mismatch"):
            admin.approve_tenant("careful-co", "sha256:" + "0" * 64)
        assert enroll.fetch_status("careful-co").status == "PENDING"
        approved = admin.approve_tenant("careful-co", status.fingerprint, max_concurrent_jobs=2)
    assert approved.status == "APPROVED" and approved.max_concurrent_jobs == 2
    fetched = enroll.fetch_status("careful-co")
    assert fetched.status == "APPROVED" and fetched.certificate_installed
    principal = pki.certificate_principal(x509.load_pem_x509_certificate(Profile.named("careful-co").cert.read_bytes()))
    assert principal == pki.Principal.tenant("careful-co")  # named by its URI SAN
    with Client.from_profile("careful-co") as client:
        assert client.list() == []


def test_malformed_csr_is_invalid_argument(platform):
    channel, stub = _tenancy_stub(platform)
    with channel, pytest.raises(grpc.RpcError) as err:
        stub.RequestTenancy(tenancy_pb2.RequestTenancyRequest(name="broken", csr_pem=b"-----BEGIN nonsense"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("name", ["../etc", "UPPER", "a/b", "spiffe://x", "", "x" * 64])
def test_unsafe_tenant_names_are_refused(platform, name):
    key = pki.new_key()
    csr = pki.make_csr(key, "placeholder")
    channel, stub = _tenancy_stub(platform)
    with channel, pytest.raises(grpc.RpcError) as err:
        stub.RequestTenancy(tenancy_pb2.RequestTenancyRequest(name=name, csr_pem=csr))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_status_needs_proof_of_the_csr_key(platform):
    enroll.request_tenancy("proof-co", platform.address, platform.ca_pem, platform.enroll_address)
    impostor = ec.generate_private_key(ec.SECP256R1())
    now = int(time.time())
    signature = pki.sign_message(impostor, pki.tenancy_status_message("proof-co", now))
    channel, stub = _tenancy_stub(platform)
    with channel, pytest.raises(grpc.RpcError) as err:
        stub.GetTenancyStatus(tenancy_pb2.GetTenancyStatusRequest(name="proof-co", unix_time=now, signature=signature))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_sdk_and_server_sign_the_same_status_message():
    assert enroll.status_message("acme", 123) == pki.tenancy_status_message("acme", 123)


def test_duplicate_tenant_name_is_refused(platform):
    enroll.request_tenancy("dup-co", platform.address, platform.ca_pem, platform.enroll_address)
    Profile.named("dup-co").key.unlink()
    with pytest.raises(errors.Conflict, match="already exists"):
        enroll.request_tenancy("dup-co", platform.address, platform.ca_pem, platform.enroll_address)
