"""A checkpoint store outage while a job runs shows as job events and on /metrics, and the job still succeeds.

A real server and worker; the job's S3 store is a real moto server reached
through a fault proxy (tests/faultproxy.py) that refuses connections while
the test holds the outage, after the job's first checkpoint, so a later
checkpoint save retries. The test waits for the events, scrapes ``/metrics``
over TLS, ends the outage and waits for the job's end.
"""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import boto3
import pytest

from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from testkit.platform import Platform, cli, free_port
from tests.faultproxy import FaultProxy
from tests.services import S3_TEST_CREDENTIALS
from tests.test_metrics import samples, value

pytestmark = pytest.mark.integration

# Checkpoints often, so that saves are still to come when the test sees the first one.
JOB = dict(steps=400, eval_every=400, eval_batches=1, checkpoint_every=10, keep_last=1, batch_size=4, seq_len=16)


@pytest.fixture(scope="module")
def proxy(moto_service):
    port = urlsplit(moto_service.endpoint).port
    assert port is not None
    proxy = FaultProxy(port)
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def bucket(moto_service) -> str:
    name = f"outage-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def platform(tmp_path_factory, proxy):
    env = {
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    p = Platform(tmp_path_factory.mktemp("platform"), env=env, settings={"metrics_listen": f"127.0.0.1:{free_port()}"})
    p.start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def scraper(platform) -> Profile:
    cli("admin", "scrapers", "add", "prom", "--json", env=platform.env)
    return Profile.named("prom")


def test_a_store_outage_is_shown_while_it_lasts_and_the_job_succeeds(platform, tenant, scraper, proxy, bucket):
    store = f"s3://{bucket}/jobs"
    handle = tenant.submit(Job(name="outage", checkpoint_store=store, **JOB))
    events = handle.events()
    first = next(e for e in events if e.kind == "CHECKPOINT" or e.terminal)
    assert first.kind == "CHECKPOINT", first
    proxy.set("refuse")
    try:
        began = next(e for e in events if "unreachable" in e.message or e.terminal)
        assert not began.terminal, f"the job ended without telling the outage: {began}"
        assert began.kind == "MESSAGE" and began.worker == 0
        assert began.message.startswith(f"checkpoint store {store} unreachable (")
        assert "S3 unreachable" in began.message and "retrying for up to 60 s" in began.message
        found = samples(platform, scraper)
        assert value(found, "cantata_job_store_unreachable", tenant="acme", job_id=handle.id) == 1
        assert value(found, "cantata_store_outages_total", store="s3") == 1
        assert handle.status().state == "RUNNING"
    finally:
        proxy.set("pass")
    ended = next(e for e in events if "reachable again" in e.message or e.terminal)
    assert ended.message.startswith(f"checkpoint store {store} reachable again after "), ended
    assert value(samples(platform, scraper), "cantata_job_store_unreachable", tenant="acme", job_id=handle.id) == 0
    rest = list(events)
    assert not any("unreachable" in e.message for e in rest)  # one outage, told once each way
    assert rest[-1].terminal and rest[-1].state == "SUCCEEDED", rest[-1]
    assert [c.step for c in tenant.checkpoints(handle.id)] == [400]
