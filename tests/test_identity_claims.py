"""Identity comes from verified certificates only, over a real server.

What a worker reports about someone else is a claim, kept apart from the
record's actor; a renewed certificate falls with the one it renewed; and an
anonymous status poll learns nothing about whether a name exists.
"""

from __future__ import annotations

import datetime as dt
import time

import grpc
import pytest
from cryptography import x509
from grpc_status import rpc_status

from cantata.proto.v1 import jobs_pb2, jobs_pb2_grpc, tenancy_pb2, tenancy_pb2_grpc, worker_pb2, worker_pb2_grpc
from cantata.sdk import enroll
from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from cantata.security import pki
from cantata.security.audit import Action, read_records
from cantata.security.pki import CertificateAuthority, Principal
from testkit.platform import Platform

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """A server that starts no workers: a submitted job stays QUEUED, so a worker certificate for it stays valid."""
    platform = Platform(tmp_path_factory.mktemp("claims"), settings={"max_workers_on_node": 0})
    platform.start()
    yield platform
    platform.stop()


def _ca(platform: Platform) -> CertificateAuthority:
    return CertificateAuthority.load(platform.paths.ca_cert.read_bytes(), platform.paths.ca_key.read_bytes())


def _channel(platform: Platform, bundle: pki.Bundle) -> grpc.Channel:
    return grpc.secure_channel(
        platform.address, grpc.ssl_channel_credentials(platform.ca_pem, bundle.key_pem, bundle.cert_pem)
    )


def _profile_bundle(platform: Platform, name: str) -> pki.Bundle:
    profile = Profile.named(name)
    return pki.Bundle(profile.cert.read_bytes(), profile.key.read_bytes(), platform.ca_pem)


def test_a_worker_cannot_set_the_actor_of_its_refusal_report(quiet):
    with quiet.enroll("reported-co") as tenant:
        job = tenant.submit(Job(name="queued", steps=100_000, batch_size=4, seq_len=16))
    worker = _ca(quiet).issue_bundle(Principal.worker(job.id, 0), lifetime=dt.timedelta(hours=1))
    forged = "spiffe://cantata/admin/root"
    with _channel(quiet, worker) as channel:
        worker_pb2_grpc.WorkerStub(channel).Report(
            worker_pb2.WorkerReport(
                job_id=job.id,
                worker=0,
                refused=worker_pb2.GossipRefused(address="ipv4:10.9.9.9:443", principal=forged, reason="made up"),
            ),
            timeout=30,
        )
    (record,) = [
        r for r in read_records(quiet.data_dir / "audit") if r.action == Action.AUTHZ_DENIED and r.resource == job.id
    ]
    assert record.actor == Principal.worker(job.id, 0).uri  # the verified certificate's principal
    assert forged not in (record.actor, record.peer) and "10.9.9.9" not in record.peer
    assert record.peer.startswith("ipv4:127.0.0.1:")  # the reporter's own connection
    assert record.details["reported"] is True
    assert (record.details["reported_principal"], record.details["reported_address"]) == (forged, "ipv4:10.9.9.9:443")


def _serial(bundle: pki.Bundle) -> str:
    return format(x509.load_pem_x509_certificate(bundle.cert_pem).serial_number, "x")


def _renew(platform: Platform, bundle: pki.Bundle) -> pki.Bundle:
    """Renew as whoever holds ``bundle``: a new key, the certificate the server issues for it."""
    key = pki.new_key()
    with _channel(platform, bundle) as channel:
        reply = tenancy_pb2_grpc.TenancyStub(channel).RenewCertificate(
            tenancy_pb2.RenewCertificateRequest(csr_pem=pki.make_csr(key, "renewal")), timeout=30
        )
    return pki.Bundle(reply.certificate_pem, pki.key_to_pem(key), platform.ca_pem)


def _list_jobs(platform: Platform, bundle: pki.Bundle) -> grpc.StatusCode:
    with _channel(platform, bundle) as channel:
        try:
            jobs_pb2_grpc.JobsStub(channel).ListJobs(jobs_pb2.ListJobsRequest(), timeout=30)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def test_a_stolen_key_renewed_before_the_revocation_does_not_survive_it(quiet):
    quiet.enroll("stolen-co").close()
    owner = _profile_bundle(quiet, "stolen-co")
    thief = pki.Bundle(owner.cert_pem, owner.key_pem, owner.ca_pem)  # a copy of the key and certificate
    renewed = _renew(quiet, thief)  # the thief renews first: a certificate for a key only the thief has
    assert _list_jobs(quiet, renewed) == grpc.StatusCode.OK
    assert _list_jobs(quiet, owner) == grpc.StatusCode.UNAUTHENTICATED  # superseded: the owner notices at once
    with quiet.admin() as admin:
        admin.revoke_certificate(_serial(owner), reason="key stolen")  # the serial the owner knows
    assert _list_jobs(quiet, renewed) == grpc.StatusCode.UNAUTHENTICATED  # the thief's renewal fell with it
    (revoked,) = [
        r
        for r in read_records(quiet.data_dir / "audit")
        if r.action == Action.CERTIFICATE_REVOKED and r.details.get("reason") == "key stolen"
    ]
    assert revoked.details["renewals_revoked"] == [_serial(renewed)]


def test_an_old_key_cannot_renew_once_its_owner_renewed(quiet):
    quiet.enroll("careful-owner").close()
    old = _profile_bundle(quiet, "careful-owner")
    current = _renew(quiet, old)
    with pytest.raises(grpc.RpcError) as refused:
        _renew(quiet, old)  # what a thief holding the old key would try
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _list_jobs(quiet, current) == grpc.StatusCode.OK


def _status_answer(platform: Platform, name: str, unix_time: int, signature: bytes) -> tuple:
    """What an anonymous caller sees: code, message (without the name and request id), error reason."""
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel:
        try:
            tenancy_pb2_grpc.TenancyStub(channel).GetTenancyStatus(
                tenancy_pb2.GetTenancyStatusRequest(name=name, unix_time=unix_time, signature=signature), timeout=30
            )
        except grpc.RpcError as err:
            rich = rpc_status.from_call(err)
            reasons = [d.value for d in rich.details][:1] if rich else []
            message = err.details().split(" (request ")[0].replace(name, "NAME")
            return err.code(), message, reasons
    return grpc.StatusCode.OK, "", []


def test_a_status_poll_does_not_tell_whether_a_name_exists(quiet):
    enroll.request_tenancy("existing-co", quiet.address, quiet.ca_pem, quiet.enroll_address)
    now = int(time.time())
    stranger = pki.new_key()
    probes = {
        "stale time": (now - 3600, b"\x30\x06\x02\x01\x01\x02\x01\x01"),
        "garbage signature": (now, b"garbage"),
        "no signature": (now, b""),
        "another key's signature": (now, None),
    }
    for what, (unix_time, signature) in probes.items():
        answers = []
        for name in ("existing-co", "missing-co"):
            signed = signature
            if signed is None:
                signed = pki.sign_message(stranger, pki.tenancy_status_message(name, unix_time))
            answers.append(_status_answer(quiet, name, unix_time, signed))
        assert answers[0] == answers[1], f"{what}: an existing name answers {answers[0]}, a missing one {answers[1]}"
        assert answers[0][0] != grpc.StatusCode.OK


def test_a_worker_cannot_claim_to_join_past_its_jobs_last_round(quiet):
    # A restarted worker says from which round it takes part (its peers stop waiting for it before that); the
    # claim is bounded by the job's own number of rounds, so it cannot make the job's round look further on.
    with quiet.enroll("rounds-co") as tenant:
        job = tenant.submit(
            Job(name="rounds", algorithm="gasloc", workers=2, local_steps=5, steps=100, batch_size=4, seq_len=16)
        )
    worker = _ca(quiet).issue_bundle(Principal.worker(job.id, 0), lifetime=dt.timedelta(hours=1))
    with _channel(quiet, worker) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)

        def join(first_round: int) -> None:
            endpoint = worker_pb2.GossipEndpoint(address="127.0.0.1:1", first_round=first_round)
            stub.Report(worker_pb2.WorkerReport(job_id=job.id, worker=0, gossip=endpoint), timeout=30)

        with pytest.raises(grpc.RpcError) as err:
            join(21)  # 100 steps of 5 a round: rounds 0..19
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "gossip.first_round" in err.value.details()
        join(20)
