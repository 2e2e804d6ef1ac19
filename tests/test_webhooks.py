"""Webhooks end to end: a real server POSTs signed job events to real HTTPS receivers (a test CA's certificate).

The server may reach loopback only because its ``webhook_allowed_networks`` says so, and trusts the
receivers' certificate only through ``webhook_ca_file``; retries wait milliseconds, not seconds.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import queue
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.sdk.webhooks import InvalidSignature, verify_signature
from cantata.security.keys import LocalKeyring, MasterKey
from cantata.server.database import Database
from cantata.server.store import Store
from cantata.server.webhooks.delivery import signature
from cantata.server.webhooks.store import WebhookStore
from cantata.server.webhooks.targets import AddressPolicy, InvalidWebhook, parse_url
from testkit.platform import Platform, cli
from testkit.waiting import JOB_TIMEOUT_S, wait_for

QUICK = dict(model="gpt-tiny", steps=10, eval_every=10, checkpoint_every=10, batch_size=8, seq_len=32)
MAX_ATTEMPTS = 3


def _cert(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory) -> dict[str, Path]:
    """A CA of the test's own and a receiver certificate it signed for localhost and 127.0.0.1."""
    folder = tmp_path_factory.mktemp("webhook-ca")
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook test CA")])
    ca_cert = _cert("webhook test CA", ca_key, ca_name, ca_key, ca=True)
    leaf = _cert("localhost", leaf_key, ca_name, ca_key, ca=False)
    paths = {"ca": folder / "ca.pem", "cert": folder / "receiver.pem", "key": folder / "receiver.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


class Receiver:
    """An HTTPS server: records every POST by path; ``/flaky`` answers 503 twice, ``/down`` always 500."""

    def __init__(self, cert: Path, key: Path):
        self.received: dict[str, queue.Queue] = {}
        self.calls: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                calls = receiver.calls[self.path] = receiver.calls.get(self.path, 0) + 1
                status = 500 if self.path == "/down" else 503 if self.path == "/flaky" and calls <= 2 else 200
                if status == 200:
                    receiver.received.setdefault(self.path, queue.Queue()).put((dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://localhost:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next(self, path: str) -> tuple[dict, bytes]:
        """The next delivery that ``path`` accepted (waits for it)."""
        return wait_for(lambda: self.received.get(path)).get()


@pytest.fixture(scope="module")
def receiver(test_ca):
    r = Receiver(test_ca["cert"], test_ca["key"])
    yield r
    r.server.shutdown()


@pytest.fixture(scope="module")
def platform(tmp_path_factory, test_ca):
    settings = {
        "webhook_allowed_networks": ["127.0.0.0/8", "::1/128"],
        "webhook_ca_file": str(test_ca["ca"]),
        "webhook_max_endpoints": 3,
        "webhook_max_attempts": MAX_ATTEMPTS,
        "webhook_backoff_s": 0.05,
        "webhook_backoff_max_s": 0.2,
    }
    p = Platform(tmp_path_factory.mktemp("platform"), settings=settings)
    p.start()
    yield p
    p.stop()


def test_signed_events_of_a_job_reach_receivers_with_retries(platform, tenant, receiver):
    hook = tenant.webhooks.add(f"{receiver.url}/hook", description="all events")
    flaky = tenant.webhooks.add(f"{receiver.url}/flaky", ["job.succeeded"])
    down = tenant.webhooks.add(f"{receiver.url}/down", ["job.queued"])
    assert hook.secret.startswith("whsec_") and len({hook.secret, flaky.secret, down.secret}) == 3
    assert [w.id for w in tenant.webhooks.list()] == [hook.id, flaky.id, down.id]
    assert all(not w.secret for w in tenant.webhooks.list())  # shown once, when added

    job = tenant.submit(Job(name="hooked", **QUICK))
    assert job.wait().state == "SUCCEEDED"

    seen = []
    while not seen or seen[-1]["type"] != "job.succeeded":
        headers, body = receiver.next("/hook")
        verify_signature(hook.secret, headers, body)  # the SDK's check, as a receiver makes it
        event = json.loads(body)
        assert headers["Cantata-Event-Id"] == event["id"] and headers["Cantata-Event-Type"] == event["type"]
        seen.append(event)
    assert [e["type"] for e in seen] == ["job.queued", "job.running", "job.succeeded"]
    assert {e["data"]["job_id"] for e in seen} == {job.id} and {e["tenant"] for e in seen} == {"acme"}
    assert seen[-1]["data"]["state"] == "succeeded" and seen[-1]["data"]["terminal"]

    headers, body = receiver.next("/flaky")  # after two 503s
    verify_signature(flaky.secret, headers, body)
    assert json.loads(body)["id"] == seen[-1]["id"]  # the same event id as the other endpoint got
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_signature(hook.secret, headers, body)  # another endpoint's secret
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_signature(flaky.secret, headers, body.replace(b"succeeded", b"failed"))
    stale = {"Cantata-Signature": signature(flaky.secret, int(time.time()) - 600, body)}
    verify_signature(flaky.secret, stale, body, tolerance=900)
    with pytest.raises(InvalidSignature, match="from now"):
        verify_signature(flaky.secret, stale, body)  # a replay ten minutes later: past the default 300 s
    with pytest.raises(InvalidSignature, match="no Cantata-Signature"):
        verify_signature(flaky.secret, {}, body)

    [delivered] = tenant.webhooks.deliveries(flaky.id)
    assert (delivered.state, delivered.attempts, delivered.last_status) == ("delivered", 3, 200)
    assert delivered.event_type == "job.succeeded" and delivered.job_id == job.id
    [dead] = wait_for(lambda: tenant.webhooks.deliveries(down.id, state="dead"), timeout=JOB_TIMEOUT_S)
    assert (dead.attempts, dead.last_status, dead.last_error) == (MAX_ATTEMPTS, 500, "HTTP 500")
    assert receiver.calls["/down"] == MAX_ATTEMPTS
    assert {d.state for d in tenant.webhooks.deliveries(hook.id)} == {"delivered"}

    with pytest.raises(errors.QuotaExceeded) as limit:  # three endpoints is this server's cap
        tenant.webhooks.add(f"{receiver.url}/fourth")
    assert (limit.value.what, limit.value.limit, limit.value.used) == ("webhook endpoints", 3, 3)

    secrets = (hook.secret, flaky.secret, down.secret)
    added = list(tenant.audit_events(action="webhook_added"))
    assert [(e.resource, e.details["url"]) for e in added] == [(w.id, w.url) for w in (hook, flaky, down)]
    for w in (flaky, down):
        tenant.webhooks.remove(w.id)
    removed = list(tenant.audit_events(action="webhook_removed"))
    assert [e.resource for e in removed] == [flaky.id, down.id] and {e.tenant for e in removed} == {"acme"}
    assert [w.id for w in tenant.webhooks.list()] == [hook.id]
    records = json.dumps([e.details for e in tenant.audit_events()])
    log = platform.server_log()
    assert not any(s in records or s in log for s in secrets)  # never in the audit log nor a log line


def test_another_tenant_cannot_see_or_remove_webhooks(platform, tenant, receiver):
    mine = tenant.webhooks.add(f"{receiver.url}/mine")
    with platform.enroll("beta") as beta:
        assert beta.webhooks.list() == []
        with pytest.raises(errors.NotFound):
            beta.webhooks.remove(mine.id)
        assert beta.webhooks.deliveries(mine.id) == []
        theirs = beta.webhooks.add(f"{receiver.url}/theirs")
        assert [w.id for w in beta.webhooks.list()] == [theirs.id]
        with pytest.raises(errors.NotFound):
            tenant.webhooks.remove(theirs.id)
    assert mine.id in [w.id for w in tenant.webhooks.list()]
    tenant.webhooks.remove(mine.id)
    with pytest.raises(errors.NotFound):
        tenant.webhooks.remove(mine.id)


def test_the_cli_adds_lists_and_removes_webhooks(platform, tenant, receiver):
    def run(*args: str, check: bool = True):
        return cli("webhooks", *args, "--profile", "acme", env=platform.env, check=check)

    added = json.loads(run("add", f"{receiver.url}/cli", "--event", "job.failed", "--json").stdout)
    assert added["event_types"] == ["job.failed"] and added["secret"].startswith("whsec_")
    listed = json.loads(run("list", "--json").stdout)
    assert [w["id"] for w in listed if w["url"].endswith("/cli")] == [added["id"]]
    assert all(not w["secret"] for w in listed)
    refused = run("add", "http://localhost/cli", check=False)
    assert refused.returncode != 0 and "must be https" in refused.stderr
    run("remove", added["id"])
    assert added["id"] not in run("list").stdout


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://localhost/hook", "must be https"),
        ("https://10.1.2.3/hook", "10.1.2.3, an address webhooks may not reach"),
        ("https://169.254.169.254/latest/meta-data", "link-local|may not reach"),
        ("https://[::ffff:192.168.0.1]/hook", "may not reach"),
        ("https://user:pw@localhost/hook", "user or password"),
        ("https://localhost/" + "a" * 2100, "longer than 2048"),
        ("https://localhost:99999/hook", "port"),
        ("https://no-such-host.invalid/hook", "does not resolve"),
    ],
)
def test_bad_urls_are_refused_with_a_typed_error(tenant, url, why):
    with pytest.raises(errors.InvalidWebhook, match=why):
        tenant.webhooks.add(url)


def test_unknown_event_types_are_refused(tenant, receiver):
    with pytest.raises(errors.InvalidWebhook, match="unknown"):
        tenant.webhooks.add(f"{receiver.url}/hook", ["job.exploded"])


def test_without_an_allowance_loopback_and_private_addresses_are_refused():
    policy = AddressPolicy()
    for url in ("https://127.0.0.1/", "https://localhost/", "https://[::1]/", "https://192.168.1.1/"):
        with pytest.raises(InvalidWebhook, match="may not reach"):
            policy.resolve(parse_url(url))
    assert policy.resolve(parse_url("https://8.8.8.8/")) == ["8.8.8.8"]
    assert AddressPolicy(["127.0.0.0/8"]).resolve(parse_url("https://127.0.0.2:8443/")) == ["127.0.0.2"]


def test_events_are_queued_in_their_transaction_by_type_and_bounded(tmp_path):
    """The outbox, without a server: which job events become deliveries, the per-endpoint bound, key rotation."""
    keyring = LocalKeyring(tmp_path / "keyring.sealed", MasterKey(bytes(range(32))))
    keyring.ensure_tenant("acme")
    db = Database(tmp_path / "state.db")
    store, webhooks = Store(db), WebhookStore(db, keyring, max_pending=1)
    store.on_event = webhooks.enqueue
    store.add_tenancy_request("acme", b"csr", "sha256:x")
    acme = store.approve_tenant("acme", "sha256:x", b"cert", common_pb2.Quota(max_concurrent_jobs=2), "root")
    anomalies, _ = webhooks.add("acme", "https://receiver.example/a", ["job.anomaly"])
    everything, secret = webhooks.add("acme", "https://receiver.example/all")
    job, _ = store.submit_job(acme, "request-0001", common_pb2.JobSpec(name="j", steps=10))

    store.append_event(job.id, jobs_pb2.JobEvent(kind=jobs_pb2.PROGRESS, step=1))  # never delivered
    store.append_event(job.id, jobs_pb2.JobEvent(kind=jobs_pb2.ANOMALY, step=3, message="worker 1 quarantined"))
    queued = {(d.webhook_id, d.event_type, d.state, d.last_error) for d in webhooks.deliveries("acme")}
    assert queued == {
        (everything.id, "job.queued", "pending", ""),
        (anomalies.id, "job.anomaly", "pending", ""),
        (everything.id, "job.anomaly", "dead", "queue full"),  # its one pending slot holds job.queued
    }
    [due] = webhooks.due(time.time() + 1, 10, busy=[d.id for d in webhooks.deliveries("acme", anomalies.id)])
    assert (due.event_type, due.secret) == ("job.queued", secret)  # the sealed secret opens
    assert json.loads(due.body)["data"] == {
        "job_id": job.id,
        "seq": 1,
        "state": "queued",
        "terminal": False,
        "step": 0,
        "total_steps": 10,
        "message": "queued",
    }
    assert webhooks.deliveries("other") == []

    keyring.rotate("acme")
    assert webhooks.rewrap("acme") == 2 and webhooks.key_versions_in_use("acme") == {2}
    keyring.retire_unused("acme", webhooks.key_versions_in_use("acme") | {2})
    assert webhooks.due(time.time() + 1, 10)[0].secret == secret

    with db.transaction() as tx:  # a secret moved to another endpoint's row does not open there
        tx.execute(
            "UPDATE webhook_endpoints SET sealed = (SELECT sealed FROM webhook_endpoints WHERE id = ?) WHERE id = ?",
            (anomalies.id, everything.id),
        )
    assert [d.event_type for d in webhooks.due(time.time() + 1, 10)] == ["job.anomaly"]
    dead = {d.event_type: d.last_error for d in webhooks.deliveries("acme", everything.id, "dead")}
    assert "does not decrypt" in dead["job.queued"] and dead["job.anomaly"] == "queue full"
    db.close()
