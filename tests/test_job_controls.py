"""Job controls through the real CLI and SDK against a real server: tags and filters, deletion, retention
settings, safetensors downloads, and the audit lookup (request ids, refused submissions, tenant scoping)."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import grpc
import pytest
import torch
from safetensors.torch import load_file

from cantata.proto.v1 import admin_pb2, common_pb2, jobs_pb2
from cantata.proto.vocabulary import REQUEST_ID_KEY
from cantata.sdk.errors import Conflict, InvalidJob, NotFound, QuotaExceeded, from_rpc_error
from cantata.sdk.job import Job
from cantata.trainer.model import GPT, GPTConfig
from testkit.platform import cli

QUICK = dict(model="gpt-tiny", steps=20, eval_every=10, checkpoint_every=10, batch_size=4, seq_len=16)


@pytest.fixture(scope="module")
def jobs(platform, tenant):
    """Two ended jobs of tenant ``acme``: ``tagged`` (nightly, team=nlp) and ``adhoc``, the latter deleted by a test."""
    env = platform.env
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in QUICK.items()]
    submitted = cli("jobs", "submit", "--profile", "acme", "--name", "tagged", "--tag", "nightly", "--tag", "team=nlp",
                    *flags, "--json", env=env)  # fmt: skip
    tagged = json.loads(submitted.stdout)["id"]
    adhoc = tenant.submit(Job(name="adhoc", tags=["adhoc"], **QUICK)).id
    with pytest.raises(Conflict, match="only an ended job can be deleted"):  # at once: its workers are still starting
        tenant.delete(adhoc)
    for job_id in (tagged, adhoc):
        assert tenant.job(job_id).wait().state == "SUCCEEDED"
    return {"tagged": tagged, "adhoc": adhoc}


def _listed(platform, *flags: str) -> list[str]:
    return [
        j["id"] for j in json.loads(cli("jobs", "list", "--profile", "acme", *flags, "--json", env=platform.env).stdout)
    ]


def test_jobs_list_filters_by_tag_state_and_time_on_the_server(platform, tenant, jobs):
    tagged, adhoc = jobs["tagged"], jobs["adhoc"]
    assert _listed(platform, "--tag", "nightly") == [tagged]
    text = cli("jobs", "list", "--profile", "acme", "--tag", "nightly", env=platform.env).stdout
    assert tagged in text and "[nightly, team=nlp]" in text and adhoc not in text
    assert _listed(platform, "--tag", "team=nlp", "--state", "succeeded") == [tagged]
    assert _listed(platform, "--tag", "nightly", "--state", "failed", "--state", "running") == []
    assert _listed(platform, "--state", "SUCCEEDED") == [tagged, adhoc]
    created = tenant.get(adhoc).created  # adhoc was submitted after tagged
    assert _listed(platform, "--since", created) == [adhoc]
    assert _listed(platform, "--since", "1h") == [tagged, adhoc]
    assert tenant.get(tagged).tags == ("nightly", "team=nlp")
    # filtered pages: one job a page, each page holding only matches
    assert [j.id for j in tenant.list(state="SUCCEEDED", page_size=1)] == [tagged, adhoc]
    assert [j.id for j in tenant.list(tag="adhoc", page_size=1)] == [adhoc]
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert tenant.list(since=future) == []


def test_bad_tags_are_refused_by_the_cli_and_the_server(platform, tenant):
    bad = cli("jobs", "submit", "--profile", "acme", "--name", "x", "--tag", "no spaces", env=platform.env, check=False)
    assert bad.returncode == 1 and "tags:" in bad.stderr and "does not match" in bad.stderr
    spec = common_pb2.JobSpec(name="x", steps=10, tags=["ok", "ok"])  # past the SDK: the server checks again
    with pytest.raises(grpc.RpcError) as raised:
        tenant._jobs.SubmitJob(jobs_pb2.SubmitJobRequest(request_id=uuid.uuid4().hex, spec=spec), timeout=30)
    error = from_rpc_error(raised.value)
    assert isinstance(error, InvalidJob) and error.field == "tags" and "distinct" in error.message


def test_a_safetensors_download_loads_with_plain_torch_into_the_configured_shape(platform, jobs, tmp_path):
    job_id, env = jobs["tagged"], platform.env
    cli("checkpoints", "download", job_id, "20", "--out", str(tmp_path / "state.pt"), "--profile", "acme", env=env)
    out = tmp_path / "export"
    wrote = cli(
        "checkpoints", "download", job_id, "--format", "safetensors", "--out", str(out), "--profile", "acme", env=env
    )  # fmt: skip  (no step: the latest, 20)
    assert str(out) in wrote.stdout
    config = json.loads((out / "config.json").read_text())
    assert (config["architecture"], config["model"], config["job_id"], config["step"]) == (
        "cantata-gpt", "gpt-tiny", job_id, 20
    )  # fmt: skip
    weights = load_file(out / "model.safetensors")
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    assert weights.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(weights[name], tensor), name
    n, vocab, block = config["n_embd"], config["vocab_size"], config["block_size"]
    assert weights["tok_emb.weight"].shape == (vocab, n) and weights["pos_emb.weight"].shape == (block, n)
    assert weights["blocks.0.attn.qkv.weight"].shape == (3 * n, n)
    assert len({k.split(".")[1] for k in weights if k.startswith("blocks.")}) == config["n_layer"]
    shape = {k: config[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")}
    exported, original = GPT(GPTConfig(**shape)), GPT(GPTConfig(**shape))
    exported.load_state_dict(weights, strict=True)
    original.load_state_dict(saved, strict=True)
    tokens = torch.randint(0, vocab, (2, 16))
    with torch.no_grad():
        assert torch.equal(exported(tokens)[0], original(tokens)[0])


def test_deleting_an_ended_job_removes_its_records_and_checkpoints(platform, tenant, jobs):
    job_id, env = jobs["adhoc"], platform.env
    job_store = platform.paths.checkpoints / "acme" / job_id
    assert any(p.is_file() for p in job_store.rglob("*"))  # sealed checkpoint objects, before
    # another tenant cannot delete it, nor learn that it exists
    with platform.enroll("other-co") as other, pytest.raises(NotFound):
        other.delete(job_id)
    deleted = json.loads(cli("jobs", "delete", job_id, "--profile", "acme", "--json", env=env).stdout)
    assert deleted["deleted"] and deleted["checkpoint_objects_deleted"] >= 3  # two manifests and their shards
    assert not any(p.is_file() for p in job_store.rglob("*"))
    gone = cli("jobs", "status", job_id, "--profile", "acme", env=env, check=False)
    assert gone.returncode == 1 and "NotFound" in gone.stderr
    for call in (lambda: tenant.get(job_id), lambda: tenant.checkpoints(job_id), lambda: list(tenant.logs(job_id))):
        with pytest.raises(NotFound):
            call()
    with pytest.raises(NotFound):
        tenant.delete(job_id)  # a second deletion finds nothing
    assert job_id not in [j.id for j in tenant.list()]
    (record,) = [e for e in tenant.audit_events(action="job_deleted") if e.resource == job_id]
    assert record.actor == "spiffe://cantata/tenant/acme" and record.details["checkpoint_objects"] >= 3
    assert record.request_id  # the deletion call's id


def test_an_admin_sets_a_tenants_retention(platform, tenant):
    env = platform.env
    changed = json.loads(
        cli("admin", "tenants", "set-retention", "acme", "--retention-days", "7", "--json", env=env).stdout
    )
    assert changed["retention_days"] == 7
    listed = json.loads(cli("admin", "tenants", "list", "--json", env=env).stdout)
    assert next(t for t in listed if t["name"] == "acme")["retention_days"] == 7
    with platform.admin() as admin:
        (record,) = admin.audit_events(tenant="acme", action="retention_changed")
        assert record.details["retention_days"] == 7
        admin.set_retention("acme", 0)
    with pytest.raises(grpc.RpcError) as raised:  # tenants may not change it
        tenant._admin.SetRetention(admin_pb2.SetRetentionRequest(name="acme", retention_days=1), timeout=30)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED


# ---- audit lookup ------------------------------------------------------------
def _events(platform, profile: str, *flags: str, check: bool = True):
    result = cli("audit", "events", "--profile", profile, *flags, "--json", env=platform.env, check=check)
    return [json.loads(line) for line in result.stdout.splitlines()] if check else result


def test_audit_records_carry_the_request_id_the_client_saw(platform, tenant):
    spec = Job(name="seen", **QUICK).to_proto()
    info, call = tenant._jobs.SubmitJob.with_call(
        jobs_pb2.SubmitJobRequest(request_id=uuid.uuid4().hex, spec=spec), timeout=30
    )
    seen = dict(call.trailing_metadata())[REQUEST_ID_KEY]
    (record,) = _events(platform, "acme", "--request-id", seen)
    assert (record["action"], record["resource"], record["outcome"]) == ("job_submitted", info.id, "ok")
    assert record["request_id"] == seen and record["details"]["request_id"] == seen
    tenant.cancel(info.id)
    assert tenant.job(info.id).wait().terminal


def test_refused_submissions_are_recorded(platform, tenant):
    invalid = jobs_pb2.SubmitJobRequest(request_id=uuid.uuid4().hex, spec=common_pb2.JobSpec(name="no-steps"))
    with pytest.raises(grpc.RpcError) as raised:
        tenant._jobs.SubmitJob(invalid, timeout=30)
    error = from_rpc_error(raised.value)
    assert isinstance(error, InvalidJob) and error.request_id
    (record,) = _events(platform, "acme", "--request-id", error.request_id)
    assert (record["action"], record["outcome"], record["tenant"]) == ("job_submitted", "refused", "acme")
    assert record["details"]["field"] == "steps" and record["details"]["error"] == "InvalidField"

    with platform.enroll("capped", max_total_steps=10) as capped:
        with pytest.raises(QuotaExceeded) as over:
            capped.submit(Job(name="too-long", **QUICK))
        (record,) = capped.audit_events(request_id=over.value.request_id)
        assert (record.action, record.outcome, record.details["error"]) == ("job_submitted", "refused", "QuotaExceeded")
        assert record.details["name"] == "too-long"


def test_a_tenant_sees_only_its_own_audit_records(platform, tenant, jobs):
    with platform.enroll("nosy") as nosy:
        with pytest.raises(QuotaExceeded):  # a call of its own on the record (beside its approval, certificate...)
            nosy.submit(Job(name="wide", workers=9, **QUICK))
        with pytest.raises(NotFound):
            list(nosy.audit_events(tenant="acme"))
        own = list(nosy.audit_events())
        assert own and {e.tenant for e in own} == {"nosy"}
        approval = next(e for e in own if e.action == "tenant_approved")  # an admin's act on its tenancy
        assert approval.actor.startswith("spiffe://cantata/admin/") and approval.peer == ""  # not the admin's address
        (refusal,) = [e for e in own if e.actor == "spiffe://cantata/tenant/nosy"]
        assert refusal.outcome == "refused" and refusal.peer  # its own call's address
    refused = _events(platform, "nosy", "--tenant", "acme", check=False)
    assert refused.returncode == 1 and "NotFound" in refused.stderr
    assert {e["tenant"] for e in _events(platform, "acme")} == {"acme"}
    everyone = _events(platform, "admin")
    assert {"acme", "nosy", ""} <= {e["tenant"] for e in everyone}  # "" : the platform's own acts
    seqs = [e["seq"] for e in everyone]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))  # oldest first, each once across pages
    with platform.admin() as admin:
        assert [e.seq for e in admin.audit_events(page_size=7)] == seqs  # pages of 7 give the same


def test_audit_events_filter_by_action_and_time(platform, tenant, jobs):
    submitted = _events(platform, "acme", "--action", "job_submitted")
    assert submitted and {e["action"] for e in submitted} == {"job_submitted"}
    assert jobs["tagged"] in {e["resource"] for e in submitted}
    first = submitted[0]["time"]
    assert all(e["time"] < first for e in _events(platform, "acme", "--until", first))
    assert _events(platform, "acme", "--action", "job_submitted", "--since", first)[0]["time"] == first
    assert _events(platform, "acme", "--since", "2999-01-01") == []
    text = cli("audit", "events", "--profile", "acme", "--action", "job_submitted", env=platform.env).stdout
    assert "job_submitted" in text and jobs["tagged"] in text
    bad = cli("audit", "events", "--profile", "acme", "--since", "yesterday", env=platform.env, check=False)
    assert bad.returncode == 2 and "not an ISO 8601 time" in bad.stderr


def test_the_log_with_lookups_and_request_ids_verifies(platform):
    verdict = cli("audit", "verify", "--data-dir", str(platform.data_dir), env=platform.env)
    assert verdict.returncode == 0
