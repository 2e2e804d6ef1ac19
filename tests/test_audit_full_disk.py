"""A real server whose audit directory fills up: audited work is refused with UNAVAILABLE and leaves nothing behind,
reads go on, and the server takes work again by itself once there is space."""

from __future__ import annotations

import json

import pytest

from cantata.sdk import Job, enroll
from cantata.sdk.errors import Unavailable
from testkit.platform import Platform, cli
from tests.fullfs import fill, small_tmpfs

pytestmark = pytest.mark.integration

# Two worker processes on a node with one slot: every job stays QUEUED, so no worker ever starts.
NEVER_PLACED = dict(model="gpt-tiny", algorithm="allreduce", workers=2, steps=20, batch_size=8, seq_len=32)
# A long name makes the approval's record larger than any submit's, so it cannot fit where a submit did not.
PENDING = "pending-tenant-whose-name-makes-its-approval-record-the-larger"
LONG_ENDPOINT = "http://an-s3-endpoint-whose-name-makes-the-registration-record-the-larger.example:9000"
S3 = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": "not-a-real-secret"}


@pytest.fixture
def full_disk_platform(tmp_path):
    platform = Platform(tmp_path)
    settings = json.loads(platform.paths.config.read_text())
    platform.paths.config.write_text(json.dumps({**settings, "max_workers_on_node": 1}))
    with small_tmpfs(platform.paths.audit, size="2m") as audit:
        platform.start()
        try:
            yield platform, audit
        finally:
            if platform.proc is not None:
                platform.stop()


def test_a_full_audit_disk_refuses_audited_work_keeps_reads_and_recovers_without_a_restart(full_disk_platform):
    platform, audit = full_disk_platform
    tenant = platform.enroll("acme", max_concurrent_jobs=200)
    admin = platform.admin()
    queued = tenant.submit(Job(name="before", **NEVER_PLACED))
    pending = enroll.request_tenancy(PENDING, platform.address, platform.ca_pem, platform.enroll_address)
    filler = fill(audit)

    # Submits take what room the segment's last page still has; then one is refused and leaves no job behind.
    accepted = [queued.id]
    for i in range(100):
        try:
            accepted.append(tenant.submit(Job(name=f"j{i}", **NEVER_PLACED)).id)
        except Unavailable as exc:
            refused = exc
            break
    else:
        pytest.fail("a full audit disk kept accepting jobs")
    assert "the audit log cannot be written" in str(refused) and "No space left on device" in str(refused)
    assert sorted(j.id for j in tenant.list()) == sorted(accepted)

    with pytest.raises(Unavailable, match="the audit log cannot be written: No space left on device"):
        admin.approve_tenant(PENDING, pending.fingerprint)
    assert [t.status for t in admin.tenants() if t.name == PENDING] == ["PENDING"]
    with pytest.raises(Unavailable, match="the audit log cannot be written"):
        tenant.register_data_source("corpus", kind="s3", endpoint=LONG_ENDPOINT, credentials=S3)
    assert tenant.data_sources() == []
    assert tenant.get(queued.id).state == "QUEUED"  # reads audit nothing and go on

    filler.unlink()
    after = tenant.submit(Job(name="after", **NEVER_PLACED))  # the same server, no restart
    assert admin.approve_tenant(PENDING, pending.fingerprint).status == "APPROVED"
    assert tenant.register_data_source("corpus", kind="s3", endpoint=LONG_ENDPOINT, credentials=S3).name == "corpus"
    assert sorted(j.id for j in tenant.list()) == sorted([*accepted, after.id])
    admin.close()
    tenant.close()

    assert platform.stop() == 0
    verified = cli("audit", "verify", "--data-dir", str(platform.data_dir), env=platform.env, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
