"""Errors carry google.rpc details (ErrorInfo, BadRequest, QuotaFailure, RequestInfo) that the SDK reads."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from cantata.proto.v1 import admin_pb2, common_pb2, jobs_pb2
from cantata.sdk import errors
from cantata.sdk.client import Client
from cantata.security.anomaly.attack_policy import InvalidAttackConfig
from cantata.security.audit import AuditLogUnavailable
from cantata.security.keys import UnknownTenantError
from cantata.security.pki import InvalidCSR, InvalidName, Principal
from cantata.server import errors as server_errors
from cantata.server.dashboard.signin import LoginsLimited
from cantata.server.database import DatabaseUnavailable
from cantata.server.datasource_store import (
    DataSourceExists,
    DataSourceNotFound,
    InvalidDataSource,
    SealedSecretsError,
)
from cantata.server.enrollment import EnrollmentLimited
from cantata.server.errors import ErrorInterceptor
from cantata.server.jobs.jobspec import InvalidField
from cantata.server.network.serving import ServingLoop
from cantata.server.store import Conflict, NotFound, QuotaExceeded, RequestIdReused, StoreError
from cantata.server.webhooks.targets import InvalidWebhook
from cantata.storage import StoreFull, StoreNotFound, StorePermissionError, StoreUnavailableError
from testkit.platform import free_port

Code = grpc.StatusCode

# Every mapped class, one instance each, and the code and ErrorInfo reason it must become.
EXPECTED = [
    (NotFound("job 'x' not found"), Code.NOT_FOUND, "NOT_FOUND"),
    (UnknownTenantError("no tenant"), Code.NOT_FOUND, "NOT_FOUND"),
    (DataSourceNotFound("data source 'x' not found"), Code.NOT_FOUND, "DATA_SOURCE_NOT_FOUND"),
    (Conflict("tenant 'x' is APPROVED, not PENDING"), Code.FAILED_PRECONDITION, "CONFLICT"),
    (server_errors.AlreadyExists("tenant 'x' already exists"), Code.ALREADY_EXISTS, "ALREADY_EXISTS"),
    (RequestIdReused("request-0001", "job-1"), Code.ALREADY_EXISTS, "REQUEST_ID_REUSED"),
    (DataSourceExists("data source 'x' exists"), Code.ALREADY_EXISTS, "DATA_SOURCE_EXISTS"),
    (QuotaExceeded("concurrent jobs", 2, 2), Code.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED"),
    (EnrollmentLimited("pending requests", 100, 3600), Code.RESOURCE_EXHAUSTED, "ENROLLMENT_LIMITED"),
    (LoginsLimited("login links per minute", 10, 10, 12.5), Code.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED"),
    (InvalidField("steps", "must be positive"), Code.INVALID_ARGUMENT, "INVALID_JOB"),
    (server_errors.InvalidRequest("empty report"), Code.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    (InvalidDataSource("kind: S3 or AZURE_BLOB is required"), Code.INVALID_ARGUMENT, "INVALID_DATA_SOURCE"),
    (InvalidName("bad name"), Code.INVALID_ARGUMENT, "INVALID_NAME"),
    (InvalidWebhook("url: must be https://"), Code.INVALID_ARGUMENT, "INVALID_WEBHOOK"),
    (InvalidCSR("CSR too large"), Code.INVALID_ARGUMENT, "INVALID_CSR"),
    (InvalidAttackConfig("the job has 2 workers"), Code.INVALID_ARGUMENT, "INVALID_ATTACK"),
    (server_errors.Refused("a worker may only report for itself"), Code.PERMISSION_DENIED, "PERMISSION_DENIED"),
    (server_errors.Unavailable("checkpoint store unavailable"), Code.UNAVAILABLE, "UNAVAILABLE"),
    (server_errors.DataLoss("checkpoint failed verification"), Code.DATA_LOSS, "DATA_LOSS"),
    (StoreUnavailableError("S3 unreachable"), Code.UNAVAILABLE, "UNAVAILABLE"),
    (StoreNotFound("the bucket does not exist"), Code.FAILED_PRECONDITION, "STORE_NOT_FOUND"),
    (StorePermissionError("access denied"), Code.PERMISSION_DENIED, "STORE_PERMISSION_DENIED"),
    (StoreFull("store file:///s is full"), Code.RESOURCE_EXHAUSTED, "STORE_FULL"),
    (AuditLogUnavailable("the audit log cannot be written: No space left on device"), Code.UNAVAILABLE, "UNAVAILABLE"),
    (
        DatabaseUnavailable("the control-plane database cannot be written: database or disk is full (SQLITE_FULL)"),
        Code.UNAVAILABLE,
        "UNAVAILABLE",
    ),
]


class _FailedCall(grpc.RpcError, grpc.Call):
    """What a stub raises, made from a server-side status, for tests without a server."""

    def __init__(self, status: grpc.Status | None, *, code=None, details="", trailers=()):
        self._code = status.code if status else code
        self._details = status.details if status else details
        self._trailers = status.trailing_metadata if status else trailers

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def _rich(status_or_call) -> dict[type, object]:
    """The google.rpc details of a call, by type; asserts the RequestInfo matches the trailer."""
    rich = rpc_status.from_call(status_or_call)
    assert rich is not None, "no google.rpc status in the trailers"
    found: dict[type, Any] = {}
    for packed in rich.details:
        for kind in (
            error_details_pb2.ErrorInfo,
            error_details_pb2.BadRequest,
            error_details_pb2.QuotaFailure,
            error_details_pb2.RequestInfo,
        ):
            if packed.Is(kind.DESCRIPTOR):
                found[kind] = kind()
                packed.Unpack(found[kind])
    trailer = dict(status_or_call.trailing_metadata())["cantata-request-id"]
    assert trailer
    assert found[error_details_pb2.RequestInfo].request_id == trailer
    assert found[error_details_pb2.ErrorInfo].domain == "cantata"
    return found


# ---- the mapping table, without a server ------------------------------------------------------
def test_every_mapped_class_is_expected_here():
    assert {type(exc) for exc, _, _ in EXPECTED} == set(server_errors.MAPPING)


@pytest.mark.parametrize(("exc", "code", "reason"), EXPECTED, ids=[type(e).__name__ for e, _, _ in EXPECTED])
def test_each_domain_error_becomes_its_code_and_reason(exc, code, reason):
    status = server_errors.status_of(exc, request_id="rid-1", principal=Principal.tenant("acme"))
    assert status is not None and status.code == code
    assert status.details == f"{exc} (request rid-1)"
    details = _rich(_FailedCall(status))
    assert details[error_details_pb2.ErrorInfo].reason == reason
    assert details[error_details_pb2.RequestInfo].request_id == "rid-1"


def test_a_subclass_maps_like_its_base_and_unmapped_errors_do_not_map():
    class JobGone(NotFound):
        pass

    status = server_errors.status_of(JobGone("gone"), request_id="r")
    assert status is not None and status.code == Code.NOT_FOUND
    for unmapped in (ValueError("x"), StoreError("x"), SealedSecretsError("x"), KeyError("x")):
        assert server_errors.status_of(unmapped, request_id="r") is None


def test_field_and_quota_details_and_what_the_sdk_makes_of_them():
    invalid = _FailedCall(server_errors.status_of(InvalidField("lr", "must be finite"), request_id="r"))
    bad = _rich(invalid)[error_details_pb2.BadRequest]
    assert [(v.field, v.description) for v in bad.field_violations] == [("lr", "lr: must be finite")]
    sdk_error = errors.from_rpc_error(invalid)
    assert type(sdk_error) is errors.InvalidJob and sdk_error.field == "lr" and sdk_error.request_id == "r"

    quota = _FailedCall(
        server_errors.status_of(QuotaExceeded("workers per job", 4, 6), request_id="q", principal=Principal.tenant("t"))
    )
    details = _rich(quota)
    assert dict(details[error_details_pb2.ErrorInfo].metadata) == {"what": "workers per job", "limit": "4", "used": "6"}
    (violation,) = details[error_details_pb2.QuotaFailure].violations
    assert violation.subject == "tenant:t" and "workers per job" in violation.description
    sdk_error = errors.from_rpc_error(quota)
    assert type(sdk_error) is errors.QuotaExceeded
    assert (sdk_error.what, sdk_error.limit, sdk_error.used, sdk_error.request_id) == ("workers per job", 4, 6, "q")


def test_an_enrollment_limit_is_an_sdk_enrollment_limited_with_when_to_retry():
    limited = _FailedCall(
        server_errors.status_of(EnrollmentLimited("requests per minute from this address", 10, 42.4), request_id="e")
    )
    sdk_error = errors.from_rpc_error(limited)
    assert type(sdk_error) is errors.EnrollmentLimited and isinstance(sdk_error, errors.QuotaExceeded)
    assert (sdk_error.what, sdk_error.limit, sdk_error.retry_after_s) == (
        "requests per minute from this address",
        10,
        42,
    )
    assert sdk_error.code == Code.RESOURCE_EXHAUSTED and sdk_error.request_id == "e"


def test_a_login_link_limit_is_an_sdk_quota_error_that_says_when_to_retry():
    limited = _FailedCall(
        server_errors.status_of(
            LoginsLimited("login links per minute", 10, 10, 12.5), request_id="l", principal=Principal.tenant("t")
        )
    )
    details = _rich(limited)
    assert dict(details[error_details_pb2.ErrorInfo].metadata) == {
        "what": "login links per minute",
        "limit": "10",
        "used": "10",
        "retry_after_s": "12",
    }
    (violation,) = details[error_details_pb2.QuotaFailure].violations
    assert violation.subject == "tenant:t"
    sdk_error = errors.from_rpc_error(limited)
    assert type(sdk_error) is errors.QuotaExceeded
    assert (sdk_error.what, sdk_error.limit, sdk_error.used, sdk_error.retry_after_s) == (
        "login links per minute",
        10,
        10,
        12,
    )


def test_a_full_store_is_not_mistaken_for_an_oversized_request():
    full = _FailedCall(
        server_errors.status_of(
            StoreFull("store file:///srv/ckpt is full: no space left at /srv/ckpt/x.partial"), request_id="f"
        )
    )
    sdk_error = errors.from_rpc_error(full)
    assert type(sdk_error) is errors.StoreFull and "/srv/ckpt" in sdk_error.message
    assert sdk_error.code == Code.RESOURCE_EXHAUSTED and sdk_error.request_id == "f"


def test_a_reused_request_id_names_itself_and_its_job_and_is_a_conflict_in_the_sdk():
    reused = _FailedCall(server_errors.status_of(RequestIdReused("request-0001", "job-1"), request_id="r"))
    info = _rich(reused)[error_details_pb2.ErrorInfo]
    assert dict(info.metadata) == {"request_id": "request-0001", "job_id": "job-1"}
    sdk_error = errors.from_rpc_error(reused)
    assert type(sdk_error) is errors.Conflict and "request-0001" in sdk_error.message


def test_the_sdk_ignores_reasons_of_another_domain():
    status = server_errors.status_of(InvalidField("lr", "must be finite"), request_id="r")
    rich = rpc_status.from_call(_FailedCall(status))
    rich.details[0].Pack(error_details_pb2.ErrorInfo(reason="INVALID_JOB", domain="example.com"))
    foreign = _FailedCall(
        None, code=status.code, details=status.details, trailers=rpc_status.to_status(rich).trailing_metadata
    )
    assert type(errors.from_rpc_error(foreign)) is errors.InvalidArgument


def test_errors_without_details_map_by_code_and_keep_the_trailer_request_id():
    too_large = _FailedCall(None, code=Code.RESOURCE_EXHAUSTED, details="message larger than max", trailers=())
    sdk_error = errors.from_rpc_error(too_large)
    assert type(sdk_error) is errors.InvalidArgument and "too large" in sdk_error.message
    unmapped = _FailedCall(None, code=Code.UNKNOWN, details="boom", trailers=(("cantata-request-id", "u1"),))
    sdk_error = errors.from_rpc_error(unmapped)
    assert type(sdk_error) is errors.CantataError and sdk_error.request_id == "u1"


def _fails(request: bytes, context):
    raise ValueError("a bug")


def _fails_mid_stream(request: bytes, context):
    yield b"first"
    raise NotFound("job 'x' not found")


@pytest.fixture
def bare_server():
    """A plaintext in-process server with only the error interceptor, for one unary and one streaming method."""
    serving = ServingLoop(2, "test")
    serving.start()
    server = serving.server(interceptors=[ErrorInterceptor(lambda: "r-42")])
    handlers = {
        "Fail": grpc.unary_unary_rpc_method_handler(_fails),
        "Stream": grpc.unary_stream_rpc_method_handler(_fails_mid_stream),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Errors", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    serving.run(server.start())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel
    serving.run(server.stop(None))
    serving.stop()


def test_an_unmapped_error_stays_unknown_and_is_logged_with_its_traceback(bare_server, caplog):
    with pytest.raises(grpc.RpcError) as caught:
        bare_server.unary_unary("/test.Errors/Fail")(b"", timeout=30)
    assert caught.value.code() == Code.UNKNOWN
    assert rpc_status.from_call(caught.value) is None
    (record,) = [r for r in caplog.records if r.name == "cantata.server.errors"]
    assert "/test.Errors/Fail" in record.getMessage() and "r-42" in record.getMessage()
    assert record.exc_info and record.exc_info[0] is ValueError


def test_a_domain_error_mid_stream_ends_the_stream_with_its_status(bare_server):
    stream = bare_server.unary_stream("/test.Errors/Stream")(b"", timeout=30)
    assert next(stream) == b"first"
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)
    assert caught.value.code() == Code.NOT_FOUND
    assert _rich(caught.value)[error_details_pb2.ErrorInfo].reason == "NOT_FOUND"


# ---- against a real server ---------------------------------------------------------------------
def _raw_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        result = call(request, timeout=60)
        if isinstance(result, grpc.Call):
            list(result)  # a stream fails when read
    return caught.value


def test_an_invalid_job_carries_bad_request_with_the_field(tenant):
    request = jobs_pb2.SubmitJobRequest(request_id=uuid.uuid4().hex, spec=common_pb2.JobSpec(name="x", steps=-5))
    err = _raw_error(tenant._jobs.SubmitJob, request)
    assert err.code() == Code.INVALID_ARGUMENT
    details = _rich(err)
    assert details[error_details_pb2.ErrorInfo].reason == "INVALID_JOB"
    assert details[error_details_pb2.ErrorInfo].metadata["field"] == "steps"
    assert [v.field for v in details[error_details_pb2.BadRequest].field_violations] == ["steps"]

    bad_id = jobs_pb2.SubmitJobRequest(request_id="short", spec=common_pb2.JobSpec(name="x", steps=10))
    details = _rich(_raw_error(tenant._jobs.SubmitJob, bad_id))
    assert [v.field for v in details[error_details_pb2.BadRequest].field_violations] == ["request_id"]


def test_a_quota_refusal_carries_quota_failure_and_error_info(platform):
    with platform.enroll("frugal", max_workers_per_job=1) as client:
        job = jobs_pb2.SubmitJobRequest(
            request_id=uuid.uuid4().hex,
            spec=common_pb2.JobSpec(name="x", steps=10, workers=2, algorithm="allreduce"),
        )
        err = _raw_error(client._jobs.SubmitJob, job)
        assert err.code() == Code.RESOURCE_EXHAUSTED
        details = _rich(err)
        info = details[error_details_pb2.ErrorInfo]
        assert info.reason == "QUOTA_EXCEEDED"
        assert dict(info.metadata) == {"what": "workers per job", "limit": "1", "used": "2"}
        (violation,) = details[error_details_pb2.QuotaFailure].violations
        assert violation.subject == "tenant:frugal"


def test_not_found_carries_its_reason_on_unary_and_streaming_calls(tenant):
    for call, request in [
        (tenant._jobs.GetJob, jobs_pb2.GetJobRequest(job_id="job-nope")),
        (tenant._jobs.WatchJob, jobs_pb2.WatchJobRequest(job_id="job-nope")),
        (tenant._jobs.ReadLogs, jobs_pb2.ReadLogsRequest(job_id="job-nope")),
    ]:
        err = _raw_error(call, request)
        assert err.code() == Code.NOT_FOUND
        assert _rich(err)[error_details_pb2.ErrorInfo].reason == "NOT_FOUND"


def test_a_missing_data_source_has_its_own_reason(tenant):
    request = jobs_pb2.SubmitJobRequest(
        request_id=uuid.uuid4().hex, spec=common_pb2.JobSpec(name="x", steps=10, dataset="s3://nosuch@bucket/data")
    )
    err = _raw_error(tenant._jobs.SubmitJob, request)
    assert err.code() == Code.NOT_FOUND
    assert _rich(err)[error_details_pb2.ErrorInfo].reason == "DATA_SOURCE_NOT_FOUND"


def test_an_authorization_refusal_carries_the_same_details(tenant):
    err = _raw_error(tenant._admin.ListTenants, admin_pb2.ListTenantsRequest())
    assert err.code() == Code.PERMISSION_DENIED
    assert _rich(err)[error_details_pb2.ErrorInfo].reason == "PERMISSION_DENIED"


def test_the_sdk_raises_typed_errors_with_the_request_id_on_every_path(tenant, tmp_path):
    attempts = [
        lambda: tenant.get("job-nope"),
        lambda: list(tenant.events("job-nope")),
        lambda: list(tenant.logs("job-nope")),
        lambda: tenant.checkpoints("job-nope"),
        lambda: tenant.download_checkpoint("job-nope", 1, tmp_path / "model.pt"),
    ]
    for attempt in attempts:
        with pytest.raises(errors.NotFound) as caught:
            attempt()
        assert caught.value.code == Code.NOT_FOUND
        assert caught.value.request_id and caught.value.request_id in caught.value.message
    assert not (tmp_path / "model.pt.part").exists()


def test_a_client_without_a_server_raises_unavailable_without_details(platform):
    with (
        Client(f"127.0.0.1:{free_port()}", ca=platform.ca_pem, timeout=2) as nowhere,
        pytest.raises(errors.Unavailable) as caught,
    ):
        nowhere.get("job-x")
    assert caught.value.request_id == ""
