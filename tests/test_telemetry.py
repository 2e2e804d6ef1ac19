"""The server's Prometheus instruments: restarts come from written job_restarted records, stores by their kind."""

from __future__ import annotations

import cantata
from cantata.security.audit import Action
from cantata.server.telemetry import JobTokens, Telemetry, build_info, store_kind


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


def test_rpcs_are_counted_by_service_method_and_code_without_created_series() -> None:
    t = Telemetry()
    t.rpc("/cantata.v1.Jobs/GetJob", "OK", 0.25)
    t.rpc("/cantata.v1.Jobs/GetJob", "NOT_FOUND", 0.5)
    get = t.registry.get_sample_value
    assert get("cantata_rpc_calls_total", {"service": "cantata.v1.Jobs", "method": "GetJob", "code": "OK"}) == 1
    labels = {"service": "cantata.v1.Jobs", "method": "GetJob", "code": "NOT_FOUND"}
    assert get("cantata_rpc_duration_seconds_sum", labels) == 0.5
    names = {s.name for family in t.registry.collect() for s in family.samples}
    assert not {n for n in names if n.endswith("_created")}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "cantata_build_info"} <= names
    assert get("cantata_build_info", build_info()) == 1 and build_info()["version"] == cantata.__version__


def test_tokens_are_counted_per_active_job_and_forgotten_when_it_ends() -> None:
    tokens = JobTokens()
    tokens.add("a", 640)
    tokens.add("a", 320)
    tokens.add("b", 10)
    assert tokens.totals(["a", "b", "c"]) == {"a": 960, "b": 10, "c": 0}
    assert tokens.totals(["a"]) == {"a": 960}
    assert tokens.totals(["a", "b"]) == {"a": 960, "b": 0}  # b ended: its count went with it
