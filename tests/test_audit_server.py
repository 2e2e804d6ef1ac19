"""The server writes every security-relevant act to the audit log, and serves scoped reports."""

from __future__ import annotations

import json

import pytest

from cantata.sdk import enroll, errors
from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records, verify
from testkit.platform import cli
from testkit.waiting import wait_for

QUICK = dict(steps=20, eval_every=10, checkpoint_every=10, batch_size=4, seq_len=16)


@pytest.fixture(scope="module")
def history(platform, tmp_path_factory):
    """Drive the platform through the acts the audit log must record."""
    acme = platform.enroll("audited")
    job = acme.submit(Job(name="recorded", **QUICK))
    assert job.wait().state == "SUCCEEDED"
    acme.download_checkpoint(job.id, 10, tmp_path_factory.mktemp("dl") / "m.pt")
    doomed = acme.submit(
        Job(name="doomed", steps=100_000, batch_size=4, seq_len=16, eval_every=50_000, checkpoint_every=50_000)
    )
    doomed.cancel()
    doomed.wait()
    with pytest.raises(errors.PermissionDenied):
        acme.tenants()  # a tenant calling an admin method
    with platform.admin() as admin:
        admin.set_quota("audited", max_concurrent_jobs=3)
        serial = next(t for t in admin.tenants() if t.name == "audited").certificate_serial
        admin.suspend_tenant("audited")
        admin.resume_tenant("audited")
    enroll.request_tenancy("unwanted", platform.address, platform.ca_pem, platform.enroll_address)
    with platform.admin() as admin:
        admin.reject_tenant("unwanted")
    rival = platform.enroll("other-audited")
    rival.submit(Job(name="theirs", **QUICK)).wait()
    with platform.admin() as admin:
        admin.revoke_certificate(serial)
    with pytest.raises(errors.Unauthenticated):
        acme.list()  # the revoked certificate: an authentication failure
    return {"acme": acme, "rival": rival, "job": job.id}


def _actions(platform) -> set[str]:
    return {r.action for r in read_records(platform.data_dir / "audit")}


@pytest.mark.parametrize(
    "action",
    [
        Action.TENANCY_REQUESTED,
        Action.TENANT_APPROVED,
        Action.CERTIFICATE_ISSUED,
        Action.QUOTA_CHANGED,
        Action.TENANT_SUSPENDED,
        Action.TENANT_RESUMED,
        Action.CERTIFICATE_REVOKED,
        Action.AUTHZ_DENIED,
        Action.AUTH_FAILED,
        Action.JOB_SUBMITTED,
        Action.JOB_STARTED,
        Action.JOB_CANCEL_REQUESTED,
        Action.JOB_CANCELLED,
        Action.JOB_FINISHED,
        Action.CHECKPOINT_WRITTEN,
        Action.CHECKPOINT_DOWNLOADED,
        Action.SERVER_STARTED,
        Action.TENANT_REJECTED,
        Action.KEY_CREATED,
        Action.KEY_UNWRAPPED,
    ],
)
def test_every_act_is_recorded(platform, history, action):
    wait_for(lambda: action in _actions(platform))


def test_denials_name_the_actor_and_peer_and_hold_no_secrets(platform, history):
    denials = [r for r in read_records(platform.data_dir / "audit") if r.action == Action.AUTHZ_DENIED]
    assert denials and denials[0].actor == "spiffe://cantata/tenant/audited"
    assert denials[0].peer.startswith("ipv4:127.0.0.1:")
    text = (platform.data_dir / "audit").rglob("*.jsonl")
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in text)


def test_tenant_report_is_limited_to_its_own_records(platform, history):
    report = history["rival"].audit_report(fmt="json")
    assert report.intact
    data = json.loads(report.content)
    assert set(data["by_tenant"]) == {"other-audited"}
    with pytest.raises(errors.NotFound):
        history["rival"].audit_report(tenant="audited")


def test_admin_report_covers_every_tenant_and_the_log_verifies(platform, history):
    with platform.admin() as admin:
        report = admin.audit_report(fmt="json")
    assert report.intact
    assert {"audited", "other-audited"} <= set(json.loads(report.content)["by_tenant"])
    assert verify(platform.data_dir / "audit").ok


def test_audit_report_through_the_cli_as_a_tenant(platform, history, tmp_path):
    out = tmp_path / "report.html"
    cli("audit", "report", "--profile", "other-audited", "--format", "html", "--out", str(out), env=platform.env)
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "other-audited" in html and ">audited<" not in html
