"""Dashboard limits on a real server (docs/security.md#dashboard-limits): login links and sessions are bounded
per principal, so one tenant's flood never evicts another's; refusals are RESOURCE_EXHAUSTED with when to retry
and audited as one record per burst; a bad Last-Event-ID is 400 and takes no stream slot; a suspension signs the
tenant out for good.

Browsers are plain HTTPS clients here (``http.client``, trusting the platform CA), so each request and its status
is what the test sent and read.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from cantata.proto.v1 import dashboard_pb2, dashboard_pb2_grpc
from cantata.sdk import Job
from cantata.sdk.errors import QuotaExceeded
from cantata.sdk.profiles import Profile
from testkit.platform import Platform, free_port
from testkit.waiting import JOB_TIMEOUT_S, wait_for

pytestmark = pytest.mark.integration

LINKS = 3  # open links per principal
BURST = 5  # links issued at once
SESSIONS = 2  # live sessions per principal
STREAMS = 2  # open streams per principal
COOKIE = "__Host-cantata_session"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("dashboard-limits"),
        settings={
            "dashboard_listen": f"127.0.0.1:{free_port()}",
            "dashboard_links_per_principal": LINKS,
            "dashboard_link_burst": BURST,
            "dashboard_links_per_minute": 0.5,
            "dashboard_sessions_per_principal": SESSIONS,
            "max_streams_per_principal": STREAMS,
            "max_workers_on_node": 0,  # jobs stay queued: a stream of one stays open
            "anonymous_refusal_window_s": 1.0,  # the counted record of a refusal burst comes soon
        },
    )
    platform.start()
    yield platform
    platform.stop()


class Browser:
    """One cookie jar over HTTPS to the dashboard."""

    def __init__(self, server: Platform):
        self._context = ssl.create_default_context(cadata=server.ca_pem.decode())
        self._context.check_hostname = False  # the certificate is checked against the CA; its name is a test host
        self.cookie = ""

    def get(self, url: str, headers: dict | None = None, *, read: bool = True) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname, url
        connection = http.client.HTTPSConnection(parts.hostname, parts.port, context=self._context, timeout=60)
        cookie = {"Cookie": f"{COOKIE}={self.cookie}"} if self.cookie else {}
        connection.request("GET", parts.path, headers={**cookie, **(headers or {})})
        response = connection.getresponse()
        for name, value in response.getheaders():
            if name.lower() == "set-cookie" and value.startswith(COOKIE + "="):
                self.cookie = value.split(";")[0].partition("=")[2]
        if read:
            response.read()
            connection.close()
        return response

    def sign_in(self, url: str) -> int:
        return self.get(url).status


def _base(server: Platform) -> str:
    port = server.paths.load_settings().dashboard_listen.rpartition(":")[2]
    return f"https://127.0.0.1:{port}"


def _raw_login(server: Platform, tenant: str) -> grpc.RpcError | dashboard_pb2.DashboardLogin:
    profile = Profile.named(tenant)
    credentials = grpc.ssl_channel_credentials(server.ca_pem, profile.key.read_bytes(), profile.cert.read_bytes())
    with grpc.secure_channel(server.address, credentials) as channel:
        try:
            return dashboard_pb2_grpc.DashboardStub(channel).CreateDashboardLogin(
                dashboard_pb2.CreateDashboardLoginRequest(), timeout=60
            )
        except grpc.RpcError as err:
            return err


def test_a_link_flood_is_refused_per_principal_and_spares_another_tenant(server):
    with server.enroll("flooder") as flooder, server.enroll("bystander") as bystander:
        spared = bystander.dashboard_login()
        issued, refused = [], []
        for _ in range(40):
            try:
                issued.append(flooder.dashboard_login())
            except QuotaExceeded as exc:
                refused.append(exc)
        assert len(issued) == LINKS and len(refused) == 40 - LINKS
        assert {r.what for r in refused} == {"open login links"} and all(r.retry_after_s >= 1 for r in refused)
        raw = _raw_login(server, "flooder")
        assert isinstance(raw, grpc.RpcError) and raw.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        retry = error_details_pb2.RetryInfo()
        assert any(d.Unpack(retry) for d in rpc_status.from_call(raw).details if d.Is(retry.DESCRIPTOR))
        assert retry.retry_delay.seconds >= 1
        assert Browser(server).sign_in(spared.url) == 303  # the bystander's link survived the flood
        # Redeeming frees a link slot; the bucket (BURST at once) then refuses by rate.
        for link in issued:
            assert Browser(server).sign_in(link.url) == 303
        flooder.dashboard_login(), flooder.dashboard_login()  # BURST - LINKS tokens were left
        with pytest.raises(QuotaExceeded) as rate:
            flooder.dashboard_login()
        assert rate.value.what == "login links per minute" and rate.value.retry_after_s > 1
        assert bystander.dashboard_login().url  # the bystander's own bucket is untouched
    with server.admin() as admin:

        def refusals() -> list:
            records = admin.audit_events(tenant="flooder", action="dashboard_link_issued")
            return [r for r in records if r.outcome == "refused"]

        counted = wait_for(
            lambda: [r for r in refusals() if r.details.get("repeated")] and refusals(), timeout=JOB_TIMEOUT_S
        )
    # Per limit, one record for a burst's first refusal and one counting the rest: 39 refusals, at most 4 records.
    assert len(counted) <= 4
    assert sum(r.details["count"] for r in counted) == len(refused) + 2  # and the raw call's, and the rate's


def test_sessions_are_capped_per_principal_and_spare_another_tenant(server):
    with server.enroll("many-tabs") as tabs, server.enroll("one-tab") as other:
        other_browser = Browser(server)
        assert other_browser.sign_in(other.dashboard_login().url) == 303
        browsers = [Browser(server) for _ in range(SESSIONS + 1)]
        for browser in browsers:
            assert browser.sign_in(tabs.dashboard_login().url) == 303
    base = _base(server)
    assert browsers[0].get(base + "/").status == 401  # the principal's oldest session made room
    assert [b.get(base + "/").status for b in browsers[1:]] == [200] * SESSIONS
    assert other_browser.get(base + "/").status == 200


def test_a_bad_last_event_id_is_400_and_takes_no_stream_slot(server):
    with server.enroll("watcher") as watcher:
        job = watcher.submit(Job(name="queued", model="gpt-tiny", steps=10, batch_size=2, seq_len=16))
        browser = Browser(server)
        assert browser.sign_in(watcher.dashboard_login().url) == 303
    stream = f"{_base(server)}/jobs/{job.id}/stream"
    for bad in ("abc", "\u00b2", "1" * 5000, "-1", "7.0", "1" * 20):
        response = browser.get(stream, {"Last-Event-ID": bad.encode("utf-8").decode("latin-1")})
        assert response.status == 400, bad
    held = [browser.get(stream, {"Last-Event-ID": "0"}, read=False) for _ in range(STREAMS)]
    assert [r.status for r in held] == [200] * STREAMS  # no refused request kept a slot
    assert browser.get(stream, {"Last-Event-ID": "0"}).status == 429
    for response in held:
        response.close()
    wait_for(lambda: browser.get(stream, {"Last-Event-ID": "0"}, read=False).status == 200)


def test_a_suspension_ends_sessions_and_links_and_a_resume_does_not_revive_them(server):
    with server.enroll("suspect") as suspect:
        browser = Browser(server)
        assert browser.sign_in(suspect.dashboard_login().url) == 303
        unused = suspect.dashboard_login()
        base = _base(server)
        assert browser.get(base + "/").status == 200
        with server.admin() as admin:
            admin.suspend_tenant("suspect", "test")
            admin.resume_tenant("suspect", "test")
        assert browser.get(base + "/").status == 401
        assert Browser(server).sign_in(unused.url) == 403
        fresh = Browser(server)
        assert fresh.sign_in(suspect.dashboard_login().url) == 303  # once resumed, a new link works
        assert fresh.get(base + "/").status == 200
