"""The server's Prometheus instruments: restarts come from written job_restarted records, stores by their kind."""

from __future__ import annotations

from cantata.security.audit import Action
from cantata.server.telemetry import Telemetry, store_kind


def test_restarts_count_only_written_restart_records_and_appends_count_by_action_and_outcome() -> None:
    t = Telemetry()
    t.audited([Action.JOB_RESTARTED], 0.01, True)
    t.audited([Action.JOB_RESTARTED, Action.JOB_SUBMITTED], 0.02, False)  # not written: no restart happened
    get = t.registry.get_sample_value
    assert get("cantata_worker_restarts_total") == 1
    assert get("cantata_audit_appends_total", {"action": "job_restarted", "outcome": "written"}) == 1
    assert get("cantata_audit_appends_total", {"action": "job_restarted", "outcome": "failed"}) == 1
    assert get("cantata_audit_append_seconds_count") == 2


def test_checkpoints_are_counted_by_store_kind() -> None:
    t = Telemetry()
    t.checkpoint("s3://bucket/prefix", 1000, 0.5)
    t.checkpoint("az://container/prefix", 10, 0.1)
    t.checkpoint("file:///srv/ckpt", 7, 0.2)
    t.checkpoint("s3://bucket/other", 24, 1.5)
    get = t.registry.get_sample_value
    assert get("cantata_checkpoint_bytes_total", {"store": "s3"}) == 1024
    assert get("cantata_checkpoint_bytes_total", {"store": "azure"}) == 10
    assert get("cantata_checkpoint_write_seconds_sum", {"store": "s3"}) == 2.0
    assert store_kind("gs://x") == "other" and store_kind("file:///a") == "file"
