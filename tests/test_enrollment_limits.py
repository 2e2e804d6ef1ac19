"""Anonymous enrollment is bounded, over a real server: pending caps, a rate per address, expiry, counted refusals.

Every test client calls from 127.0.0.1, so each test starts a server with
the limit it tests set small (``testkit.platform.Platform`` gives other tests
room).
"""

from __future__ import annotations

import grpc
import pytest

from cantata.proto.v1 import tenancy_pb2, tenancy_pb2_grpc
from cantata.sdk import enroll, errors
from cantata.security import pki
from cantata.security.audit import Action, read_records
from cantata.server.config import ServerSettings
from cantata.server.enrollment import source_address
from testkit.platform import Platform
from testkit.waiting import wait_for


@pytest.fixture
def limited(tmp_path):
    """A factory of started servers with the given ``server.json`` settings; all are stopped at the end."""
    started: list[Platform] = []

    def start(**settings) -> Platform:
        platform = Platform(tmp_path / f"p{len(started)}", settings=settings)
        platform.start()
        started.append(platform)
        return platform

    yield start
    for platform in started:
        if platform.proc is not None:
            platform.stop()


def _request(platform: Platform, name: str) -> enroll.EnrollmentStatus:
    return enroll.request_tenancy(name, platform.address, platform.ca_pem, platform.enroll_address)


def _raw_request(platform: Platform, name: str, csr: bytes = b"") -> grpc.StatusCode:
    """A request (with a fresh key unless ``csr`` is given), as a squatter would send it: no profile is written."""
    request = tenancy_pb2.RequestTenancyRequest(name=name, csr_pem=csr or pki.make_csr(pki.new_key(), name))
    return _call(platform, lambda stub: stub.RequestTenancy(request, timeout=30))


def _raw_status(platform: Platform, name: str) -> grpc.StatusCode:
    request = tenancy_pb2.GetTenancyStatusRequest(name=name)
    return _call(platform, lambda stub: stub.GetTenancyStatus(request, timeout=30))


def _call(platform: Platform, send) -> grpc.StatusCode:
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel:
        try:
            send(tenancy_pb2_grpc.TenancyStub(channel))
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def _records(platform: Platform, action: str) -> list:
    return [r for r in read_records(platform.data_dir / "audit") if r.action == action]


@pytest.mark.integration
def test_pending_requests_from_one_address_are_capped(limited):
    platform = limited(enroll_max_pending_per_address=2)
    first = pki.make_csr(pki.new_key(), "first-co")
    assert _raw_request(platform, "first-co", first) == grpc.StatusCode.OK
    _request(platform, "second-co")
    with pytest.raises(errors.EnrollmentLimited) as refused:
        _request(platform, "third-co")
    assert isinstance(refused.value, errors.QuotaExceeded) and refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (refused.value.what, refused.value.limit) == ("pending requests from this address", 2)
    assert refused.value.retry_after_s > 0
    assert _raw_request(platform, "first-co", first) == grpc.StatusCode.OK  # a retry is not a new request
    with platform.admin() as admin:
        admin.reject_tenant("first-co")
    _request(platform, "third-co")  # a slot is free again
    (denied,) = [r for r in _records(platform, Action.AUTHZ_DENIED) if "enrollment limit" in r.details["reason"]]
    assert denied.actor == "anonymous" and denied.resource == "/cantata.v1.Tenancy/RequestTenancy"


@pytest.mark.integration
def test_pending_requests_are_capped_in_all(limited):
    platform = limited(enroll_max_pending=2)
    one = _request(platform, "one-co")
    _request(platform, "two-co")
    with pytest.raises(errors.EnrollmentLimited) as refused:
        _request(platform, "three-co")
    assert (refused.value.what, refused.value.limit) == ("pending requests", 2)
    with platform.admin() as admin:
        admin.approve_tenant("one-co", one.fingerprint)
    _request(platform, "three-co")


@pytest.mark.integration
def test_an_address_over_its_rate_is_refused_and_others_calls_are_not_touched(limited):
    platform = limited(enroll_burst=3, enroll_rate_per_minute=0.01)
    for n in range(3):
        assert _raw_request(platform, f"burst-{n}") == grpc.StatusCode.OK
    with pytest.raises(errors.EnrollmentLimited) as refused:
        _request(platform, "one-too-many")
    assert refused.value.what == "requests per minute from this address"
    assert refused.value.retry_after_s > 60  # one token every 100 minutes
    assert _raw_status(platform, "burst-0") == grpc.StatusCode.RESOURCE_EXHAUSTED  # polls spend from it too
    with platform.admin() as admin:  # certificate holders on the main port are not enrollment calls
        assert {t.name for t in admin.tenants()} == {"burst-0", "burst-1", "burst-2"}


@pytest.mark.integration
def test_a_stale_request_expires_and_its_name_is_free_again(limited):
    platform = limited(enroll_pending_ttl_hours=1 / 3600)  # one second
    _request(platform, "squatted")
    wait_for(lambda: _raw_request(platform, "squatted") == grpc.StatusCode.OK)  # refused (exists) until it expired
    (expired,) = _records(platform, Action.TENANCY_EXPIRED)
    assert (expired.actor, expired.resource) == ("server", "squatted")
    with pytest.raises(errors.NotFound):
        enroll.fetch_status("squatted")  # the squatter's request is gone; the new one is someone else's


@pytest.mark.integration
def test_anonymous_refusals_are_counted_not_recorded_one_by_one(limited):
    platform = limited(anonymous_refusal_window_s=600.0)
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    renew = channel.unary_unary(  # a tenant's method: refused (and audited) without a certificate
        "/cantata.v1.Tenancy/RenewCertificate",
        request_serializer=tenancy_pb2.RenewCertificateRequest.SerializeToString,
    )
    refusals = 40
    with channel:
        for _ in range(refusals):
            with pytest.raises(grpc.RpcError) as refused:
                renew(tenancy_pb2.RenewCertificateRequest(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    anonymous = [r for r in _records(platform, Action.AUTH_FAILED) if r.actor == "anonymous"]
    assert len(anonymous) == 1 and anonymous[0].details["count"] == 1  # the first, recorded as it happened
    platform.stop()  # closes the window: its count is recorded
    anonymous = [r for r in _records(platform, Action.AUTH_FAILED) if r.actor == "anonymous"]
    assert len(anonymous) == 2
    assert sum(r.details["count"] for r in anonymous) == refusals  # complete: every refusal is counted
    counted = anonymous[1]
    assert counted.details["repeated"] is True and counted.peer == "127.0.0.1"
    assert counted.details["resources"] == ["/cantata.v1.Tenancy/RenewCertificate"]


@pytest.mark.parametrize(
    ("peer", "source"),
    [
        ("ipv4:203.0.113.7:5555", "203.0.113.7"),
        ("ipv6:[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"),
        ("ipv6:[2001:db8:1:2:ffff::1]:9", "2001:db8:1:2::/64"),  # the same /64: one source
        ("ipv6:[::ffff:198.51.100.1]:80", "198.51.100.1"),
        ("unix:/tmp/socket", "unix:/tmp/socket"),
    ],
)
def test_callers_are_counted_by_address_without_port(peer, source):
    assert source_address(peer) == source


def test_the_documented_defaults():
    settings = ServerSettings()
    assert (
        settings.enroll_max_pending,
        settings.enroll_max_pending_per_address,
        settings.enroll_rate_per_minute,
        settings.enroll_burst,
        settings.enroll_pending_ttl_hours,
        settings.anonymous_refusal_window_s,
    ) == (100, 3, 10.0, 10, 72.0, 60.0)
