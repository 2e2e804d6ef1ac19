"""Metrics end to end on a real server: a job's history, its export through the real CLI, plots, and Prometheus.

One short job runs to its end and one long job runs while the module looks
at it; ``/metrics`` is scraped over TLS by a plain HTTP client holding the
certificate ``cantata admin scrapers add`` issued, parsed with
``prometheus_client``'s parser, and checked against what the test did.
"""

from __future__ import annotations

import csv
import datetime as dt
import http.client
import importlib.metadata
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import promql_parser
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import cantata
from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from cantata.security.pki import CertificateAuthority, Principal
from testkit.platform import Platform, cli, free_port
from testkit.waiting import JOB_TIMEOUT_S, wait_for

TENANT = "metrics-co"
SHORT: dict[str, Any] = dict(
    steps=20, batch_size=4, seq_len=32, eval_every=10, eval_batches=2, checkpoint_every=10, grad_clip=1.0
)
Samples = dict[tuple[str, frozenset], float]
RULES = Path(__file__).parents[1] / "docs" / "alerts" / "cantata.rules.yml"
SCRAPE_SERIES = {"up"}  # what Prometheus itself adds to every scrape
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "info": ("_info",)}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"), settings={"metrics_listen": f"127.0.0.1:{free_port()}"})
    p.start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def tenant(platform):
    with platform.enroll(TENANT) as client:
        yield client


@pytest.fixture(scope="module")
def env(platform, tenant) -> dict[str, str]:
    return {**platform.env, "CANTATA_PROFILE": TENANT}


@pytest.fixture(scope="module")
def finished(tenant) -> str:
    handle = tenant.submit(Job(name="short", **SHORT))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    return handle.id


@pytest.fixture(scope="module")
def scraper(platform) -> Profile:
    out = json.loads(cli("admin", "scrapers", "add", "prom", "--json", env=platform.env).stdout)
    assert out["metrics"] == platform.paths.load_settings().metrics_listen
    return Profile.named("prom")


def scrape(platform: Platform, profile: Profile | None = None, *, path: str = "/metrics") -> tuple[int, str]:
    """GET over TLS with a plain HTTP client, presenting ``profile``'s certificate when given."""
    context = ssl.create_default_context(cafile=str(platform.data_dir / "ca.pem"))
    if profile is not None:
        context.load_cert_chain(profile.cert, profile.key)
    host, _, port = platform.paths.load_settings().metrics_listen.rpartition(":")
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def samples(platform: Platform, profile: Profile) -> Samples:
    status, text = scrape(platform, profile)
    assert status == 200, text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def test_a_finished_jobs_history_holds_what_its_workers_reported(tenant, finished, platform):
    rows = tenant.metrics(finished)
    events = list(tenant.job(finished).events())
    progress = [(e.step, e.loss) for e in events if e.kind == "PROGRESS"]
    assert [(r.step, r.value) for r in rows if r.name == "loss"] == progress  # one point per report window
    assert [r.step for r in rows if r.name == "val_loss"] == [e.step for e in events if e.kind == "EVAL"] == [10, 20]
    steps = [s for s, _ in progress]
    for name in ("lr", "tokens_per_s", "step_time_s", "data_wait_s", "grad_norm"):
        assert [r.step for r in rows if r.name == name] == steps, name
    assert all(r.value > 0 for r in rows if r.name in ("lr", "tokens_per_s", "step_time_s", "grad_norm"))
    assert all(r.value >= 0 for r in rows if r.name == "data_wait_s")
    checkpoints = [r for r in rows if r.name == "checkpoint_bytes"]
    assert [r.step for r in checkpoints] == [10, 20] and all(r.value > 1000 for r in checkpoints)
    assert all(r.worker == 0 and r.peer is None for r in rows)
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)

    assert {r.name for r in tenant.metrics(finished, ["val_loss", "lr"])} == {"val_loss", "lr"}
    assert tenant.job(finished).metrics(since=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)) == []
    with pytest.raises(errors.InvalidArgument, match="accuracy"):
        tenant.metrics(finished, ["accuracy"])
    with platform.enroll("other-co") as other, pytest.raises(errors.NotFound):
        other.metrics(finished)  # another tenant's job is not there at all


def test_the_cli_exports_the_history_for_bi_tools_as_csv_json_and_parquet(tenant, finished, env, tmp_path):
    rows = tenant.metrics(finished)
    for fmt in ("csv", "json", "parquet"):
        cli("jobs", "metrics", finished, "--format", fmt, "--out", str(tmp_path / f"m.{fmt}"), env=env)

    table = pq.read_table(tmp_path / "m.parquet")
    assert table.schema.field("time").type == pa.timestamp("ms", tz="UTC")
    assert table.schema.field("step").type == pa.int64() and table.schema.field("value").type == pa.float64()
    assert table.schema.field("peer").type == pa.int32() and table.schema.field("worker").type == pa.int32()
    assert table.column("name").to_pylist() == [r.name for r in rows]
    assert table.column("value").to_pylist() == [r.value for r in rows]
    assert table.column("peer").null_count == len(rows)
    assert table.column("time").to_pylist()[0] == rows[0].time.replace(
        microsecond=rows[0].time.microsecond // 1000 * 1000
    )

    with open(tmp_path / "m.csv", newline="") as f:
        table_rows = list(csv.DictReader(f))
    assert [(int(r["step"]), r["name"], float(r["value"])) for r in table_rows] == [
        (r.step, r.name, r.value) for r in rows
    ]
    assert {r["job_id"] for r in table_rows} == {finished} and {r["peer"] for r in table_rows} == {""}
    records = json.loads((tmp_path / "m.json").read_text())
    assert [(r["seq"], r["value"], r["peer"]) for r in records] == [(r.seq, r.value, None) for r in rows]
    assert records[0]["time"].endswith("Z")

    out = cli("jobs", "metrics", finished, "--name", "val_loss", env=env).stdout  # csv to stdout by default
    assert [line.split(",")[4] for line in out.splitlines()[1:]] == ["val_loss", "val_loss"]
    refused = cli("jobs", "metrics", finished, "--format", "parquet", env=env, check=False)
    assert refused.returncode != 0 and "--out" in refused.stderr


def test_plot_overlays_a_finished_and_a_running_job_and_the_scraper_sees_the_running_one(
    tenant, finished, env, platform, scraper, tmp_path
):
    running = tenant.submit(
        Job(name="long", steps=3000, batch_size=2, seq_len=16, eval_every=3000, checkpoint_every=3000)
    )
    wait_for(lambda: tenant.metrics(running.id, ["loss"]), timeout=JOB_TIMEOUT_S)
    found = samples(platform, scraper)  # at once, while it runs
    job = dict(tenant=TENANT, job_id=running.id)
    losses = {r.value for r in tenant.metrics(running.id, ["loss"])}
    assert value(found, "cantata_job_loss", **job) in losses
    step_times = {r.value for r in tenant.metrics(running.id, ["optim_step_s"])}  # the optimizer's, per window
    assert value(found, "cantata_job_optim_step_seconds", **job) in step_times
    assert value(found, "cantata_job_step", **job) > 0
    # a counter of the tokens of every report window so far: 2 x 16 tokens a step, up to a reported step
    tokens = value(found, "cantata_job_tokens_total", **job)
    assert tokens > 0 and tokens % 32 == 0
    assert tokens // 32 in {r.step for r in tenant.metrics(running.id, ["loss"])}
    assert (("cantata_job_loss", frozenset({("tenant", TENANT), ("job_id", finished)}))) not in found  # ended
    assert value(found, "cantata_jobs", state="RUNNING") == 1
    assert value(found, "cantata_workers_alive") >= 1

    for axis in ("step", "time"):
        out = tmp_path / f"overlay-{axis}.png"
        cli("jobs", "plot", finished, running.id, "--x", axis, "--out", str(out), env=env)
        assert out.read_bytes().startswith(b"\x89PNG")
    running.cancel()
    assert running.wait().state == "CANCELLED"


def test_the_scrape_counts_what_the_test_did(tenant, finished, platform, scraper):
    before = samples(platform, scraper)
    for _ in range(3):
        tenant.get(finished)
    with pytest.raises(errors.PermissionDenied):
        tenant.tenants()  # an admin call: refused for its role
    after = samples(platform, scraper)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    get_job = dict(service="cantata.v1.Jobs", method="GetJob", code="OK")
    assert delta("cantata_rpc_calls_total", **get_job) == 3
    assert delta("cantata_rpc_duration_seconds_count", **get_job) == 3
    assert delta("cantata_refused_calls_total", reason="role") == 1
    denied = dict(service="cantata.v1.Admin", method="ListTenants", code="PERMISSION_DENIED")
    assert delta("cantata_rpc_calls_total", **denied) == 1

    assert not [name for name, _ in after if name.endswith("_created")]
    build = next(dict(labels) for name, labels in after if name == "cantata_build_info")
    python = ".".join(map(str, sys.version_info[:3]))
    assert build == {"version": cantata.__version__, "python": python, "torch": importlib.metadata.version("torch")}
    assert value(after, "process_resident_memory_bytes") > 0 and value(after, "process_open_fds") > 0

    jobs = tenant.list()
    assert value(after, "cantata_jobs", state="SUCCEEDED") == sum(j.state == "SUCCEEDED" for j in jobs) >= 1
    assert value(after, "cantata_queue_length") == 0
    assert value(after, "cantata_queue_wait_seconds_count") == len(jobs)  # every job was placed once
    assert value(after, "cantata_audit_appends_total", action="job_submitted", outcome="written") == len(jobs)
    assert value(after, "cantata_audit_append_seconds_count") >= len(jobs)
    reported = sum(r.value for j in jobs for r in tenant.metrics(j.id, ["checkpoint_bytes"]))
    assert value(after, "cantata_checkpoint_bytes_total", store="file") == reported > 0
    checkpoints = sum(len(tenant.metrics(j.id, ["checkpoint_bytes"])) for j in jobs)
    assert value(after, "cantata_checkpoint_write_seconds_count", store="file") == checkpoints


def test_only_a_live_scraper_certificate_reads_metrics(platform, tenant, scraper, env, tmp_path):
    status, text = scrape(platform, scraper)
    assert status == 200 and "cantata_rpc_calls_total" in text
    assert scrape(platform, scraper, path="/other")[0] == 404
    assert scrape(platform)[0] == 401  # no certificate
    assert scrape(platform, Profile.named(TENANT))[0] == 403
    assert scrape(platform, Profile.named("admin"))[0] == 403

    stranger = CertificateAuthority.create("Another CA").issue_bundle(
        Principal.scraper("prom"), lifetime=dt.timedelta(hours=1)
    )
    (tmp_path / "cert.pem").write_bytes(stranger.cert_pem)
    (tmp_path / "key.pem").write_bytes(stranger.key_pem)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        scrape(platform, Profile("stranger", tmp_path))  # a scraper name signed by anyone else: no handshake

    with pytest.raises(errors.PermissionDenied), tenant.__class__.from_profile("prom") as as_scraper:
        as_scraper.list()  # a scraper certificate opens no RPC

    second = json.loads(cli("admin", "scrapers", "add", "prom-b", "--json", env=platform.env).stdout)
    cli("admin", "tenants", "revoke-cert", second["serial"], env=platform.env)
    assert scrape(platform, Profile.named("prom-b"))[0] == 403  # revoked

    found = samples(platform, scraper)
    assert value(found, "cantata_refused_calls_total", reason="no_certificate") == 1
    assert value(found, "cantata_refused_calls_total", reason="not_a_scraper") == 2
    assert value(found, "cantata_refused_calls_total", reason="revoked") == 1
    assert value(found, "cantata_refused_calls_total", reason="handshake") == 1


def selectors(node) -> set[str | None]:
    """The metric names a PromQL expression's selectors name."""
    if isinstance(node, promql_parser.VectorSelector):
        return {node.name}
    children = [
        getattr(node, attr) for attr in ("lhs", "rhs", "expr", "param", "vector_selector") if hasattr(node, attr)
    ]
    children += getattr(node, "args", [])  # a call's
    return set().union(*(selectors(c) for c in children if c is not None))


def test_the_alert_rules_name_only_metrics_the_server_exposes(platform, scraper):
    status, text = scrape(platform, scraper)
    assert status == 200, text
    exposed = set(SCRAPE_SERIES)
    for family in text_string_to_metric_families(text):
        exposed |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        exposed |= {s.name for s in family.samples}
    rules = [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]
    assert len(rules) >= 10 and len({r["alert"] for r in rules}) == len(rules)
    named = set()
    for rule in rules:
        assert {"expr", "labels", "annotations"} <= rule.keys() and rule["labels"]["severity"] in (
            "warning",
            "critical",
        )
        used = selectors(promql_parser.parse(rule["expr"]))
        assert used - exposed == set(), f"{rule['alert']} names metrics the server does not expose"
        named |= used
    expected = {"cantata_audit_appends_total", "cantata_job_store_unreachable", "cantata_queue_oldest_wait_seconds"}
    assert expected | {"up", "cantata_jobs", "cantata_job_tokens_total"} <= named
