"""Every RPC of a live server, called as every identity with generated requests: none ends in UNKNOWN or INTERNAL.

An unmapped exception in Cantata's code becomes ``UNKNOWN`` (see
``cantata.server.errors``), so this catches any request field whose range or
shape a servicer does not check. Requests are built from the generated
descriptors, so a new method or field is fuzzed without touching this file.
Strings and bytes are drawn partly from values the server knows (the
tenant's job id, tenant names, a real CSR), so calls get past lookups.
Each identity runs a bounded, derandomized number of examples (reproducible
in CI; about a minute in all on two cores).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cantata.proto.v1 import common_pb2
from cantata.sdk import enroll
from cantata.sdk.job import Job
from cantata.sdk.profiles import Profile
from cantata.security.pki import CertificateAuthority, Principal, make_csr, new_key
from cantata.server.auth import ADMIN, PUBLIC, RULES, TENANT, WORKER
from testkit.platform import Platform
from tests.test_auth import SERVICE_MODULES

pytestmark = pytest.mark.integration

EXAMPLES_PER_IDENTITY = 120
STREAM_TIMEOUT_S = 2.0  # a stream that sends nothing (a log follow on a queued job) ends as DEADLINE_EXCEEDED
UNARY_TIMEOUT_S = 60.0
FORBIDDEN = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
IDENTITIES = ("anonymous", "tenant", "other_tenant", "worker", "admin")  # admin last: it may suspend the others

INT_EDGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def methods() -> list[tuple[str, Descriptor, bool]]:
    """(full name, request descriptor, server-streaming) of every Cantata method and the health service."""
    found = [
        (f"/{service.full_name}/{m.name}", m.input_type, m.server_streaming)
        for module in (*SERVICE_MODULES, health_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
    ]
    assert len(found) > 30
    return found


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (lo, hi, -1, 0, 1, 2, 100, 1001, 10**6) if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def field_values(field: FieldDescriptor, known: dict, depth: int) -> st.SearchStrategy:
    if field.type in INT_EDGES:
        return integers(*INT_EDGES[field.type])
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from([0.0, -1.0, 1e308, float("nan"), float("inf")]), st.floats(width=32))
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [99, -1])
    if field.type == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(known["strings"]), st.text(max_size=40))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.sampled_from(known["bytes"]), st.binary(max_size=80))
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, known, depth + 1)
    raise AssertionError(f"no strategy for {field.full_name}")


def messages(descriptor: Descriptor, known: dict, depth: int = 0) -> st.SearchStrategy:
    """Messages of ``descriptor`` with any subset of their fields set (nested ones to a small depth)."""
    cls = message_factory.GetMessageClass(descriptor)
    if depth > 3:
        return st.just(cls())
    optional = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue  # no request has a map
        values = field_values(field, known, depth)
        optional[field.name] = st.lists(values, max_size=4) if _repeated(field) else values

    def build(chosen: dict) -> Any:
        message = cls()
        for name, value in chosen.items():
            field = descriptor.fields_by_name[name]
            target = getattr(message, name) if _repeated(field) or field.message_type else None
            if _repeated(field) and field.message_type:
                for item in value:
                    target.add().CopyFrom(item)
            elif _repeated(field):
                target.extend(value)
            elif field.message_type:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    generated = st.fixed_dictionaries({}, optional=optional).map(build)
    if descriptor.full_name == common_pb2.JobSpec.DESCRIPTOR.full_name:  # also: a valid spec with a few fields changed
        return st.one_of(generated, generated.map(lambda changes: _merged(known["spec"], changes)))
    return generated


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _merged(base: common_pb2.JobSpec, changes: common_pb2.JobSpec) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec()
    spec.CopyFrom(base)
    spec.MergeFrom(changes)
    return spec


def call(channel: grpc.Channel, method: str, request, streaming: bool) -> grpc.StatusCode:
    serialize, keep = type(request).SerializeToString, (lambda b: b)
    try:
        if streaming:
            replies = channel.unary_stream(method, request_serializer=serialize, response_deserializer=keep)(
                request, timeout=STREAM_TIMEOUT_S
            )
            for count, _ in enumerate(replies):
                if count == 2:
                    replies.cancel()
                    break
        else:
            channel.unary_unary(method, request_serializer=serialize, response_deserializer=keep)(
                request, timeout=UNARY_TIMEOUT_S
            )
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    """A server that never starts workers (so jobs stay QUEUED), two tenants, queued jobs and a worker of each.

    The fuzz may end its worker's job (a report that says finished) and suspend its tenants (which cancels
    their jobs); the parse test calls as a third tenant and a worker of that tenant's job, whose names the
    fuzz never learns, so they stay callers the methods admit.
    """
    platform = Platform(tmp_path_factory.mktemp("fuzz"), settings={"max_workers_on_node": 0})
    platform.start()
    with platform.enroll("acme") as acme, platform.enroll("bob"), platform.enroll("quiet") as quiet:
        job = acme.submit(Job(name="target", steps=100_000, batch_size=4, seq_len=16))
        untouched = quiet.submit(Job(name="untouched", steps=100_000, batch_size=4, seq_len=16))
    pending = enroll.request_tenancy("victim", platform.address, platform.ca_pem, platform.enroll_address)
    ca = CertificateAuthority.load(platform.paths.ca_cert.read_bytes(), platform.paths.ca_key.read_bytes())
    worker = ca.issue_bundle(Principal.worker(job.id, 0), lifetime=dt.timedelta(hours=1))
    parse_worker = ca.issue_bundle(Principal.worker(untouched.id, 0), lifetime=dt.timedelta(hours=1))
    csr = make_csr(new_key(), "squatter")
    spec = common_pb2.JobSpec(name="fuzz", model="gpt-tiny", dataset="builtin:pystdlib", steps=10, batch_size=2)
    known = {
        "strings": [job.id, "acme", "bob", "victim", "admin", pending.fingerprint, "job-0000000000000000", ""],
        "bytes": [csr, b""],
        "spec": spec,
    }

    def credentials(name: str) -> grpc.ChannelCredentials:
        profile = Profile.named(name)
        return grpc.ssl_channel_credentials(platform.ca_pem, profile.key.read_bytes(), profile.cert.read_bytes())

    channels = {
        "anonymous": grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem)),
        "tenant": grpc.secure_channel(platform.address, credentials("acme")),
        "other_tenant": grpc.secure_channel(platform.address, credentials("bob")),
        "parse_tenant": grpc.secure_channel(platform.address, credentials("quiet")),
        "worker": grpc.secure_channel(
            platform.address, grpc.ssl_channel_credentials(platform.ca_pem, worker.key_pem, worker.cert_pem)
        ),
        "parse_worker": grpc.secure_channel(
            platform.address,
            grpc.ssl_channel_credentials(platform.ca_pem, parse_worker.key_pem, parse_worker.cert_pem),
        ),
        "admin": grpc.secure_channel(platform.address, credentials("admin")),
    }
    yield channels, known
    for channel in channels.values():
        channel.close()
    platform.stop()
    assert "unmapped error" not in platform.server_log()


def numeric_leaves(descriptor: Descriptor, path: tuple[FieldDescriptor, ...] = ()) -> list[tuple[FieldDescriptor, ...]]:
    """Paths to every numeric field of a request, through nested messages (not through repeated ones)."""
    found = []
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE and not _repeated(field) and len(path) < 3:
            found += numeric_leaves(field.message_type, (*path, field))
        elif field.type in INT_EDGES or field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            found.append((*path, field))
    return found


def edge_values(field: FieldDescriptor) -> list:
    if field.type in INT_EDGES:
        lo, hi = INT_EDGES[field.type]
        return sorted(v for v in {lo, -1, 0, 1, 2**31 - 1, hi} if lo <= v <= hi)
    return [float("nan"), float("inf"), -float("inf"), -1.0, 1e308]


# Who may call each service: the edge sweep calls every method as an identity that gets past authorization.
CALLER = {"Tenancy": "anonymous", "Admin": "admin", "Worker": "worker", "grpc.health.v1.Health": "anonymous"}


def edge_cases() -> list[tuple[str, str, bool, tuple[FieldDescriptor, ...], object]]:
    cases = [
        (CALLER.get(name.split("/")[1].removeprefix("cantata.v1."), "tenant"), name, streaming, path, value)
        for name, request, streaming in methods()
        for path in numeric_leaves(request)
        for value in edge_values(path[-1])
    ]
    return sorted(cases, key=lambda case: case[3][0].name == "finished")  # a finished report ends the worker's job


def _with(descriptor: Descriptor, path: tuple[FieldDescriptor, ...], value, known: dict):
    message = message_factory.GetMessageClass(descriptor)()
    if descriptor.full_name == SUBMIT:
        message.request_id = "edge-case-0001"
        message.spec.CopyFrom(known["spec"])
    if descriptor.fields_by_name.get("job_id") is not None:
        message.job_id = known["strings"][0]
    target = message
    for field in path[:-1]:
        target = getattr(target, field.name)
    if _repeated(path[-1]):
        getattr(target, path[-1].name).append(value)
    else:
        setattr(target, path[-1].name, value)
    return message


SUBMIT = "cantata.v1.SubmitJobRequest"


def test_every_numeric_field_at_its_edges(fuzzed):
    """Each numeric field of each request, alone at each edge of its type, as a caller the method admits."""
    channels, known = fuzzed
    failures = []
    for identity, method, streaming, path, value in edge_cases():
        request = _with(path[0].containing_type, path, value, known)
        code = call(channels[identity], method, request, streaming)
        if code in FORBIDDEN:
            failures.append(f"{identity} {method} {'.'.join(f.name for f in path)}={value!r}: {code.name}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_generated_request_makes_the_server_fail(fuzzed, identity):
    channels, known = fuzzed
    channel = channels[identity]
    cases = st.one_of(
        [
            st.tuples(st.just(name), messages(request, known), st.just(streaming))
            for name, request, streaming in methods()
        ]
    )

    @settings(
        max_examples=EXAMPLES_PER_IDENTITY,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=cases)
    def no_failure(case):
        method, request, streaming = case
        code = call(channel, method, request, streaming)
        assert code not in FORBIDDEN, f"{identity} {method}({request!r}) ended in {code.name}"

    no_failure()


ALLOWED_CALLER = (
    (PUBLIC, "anonymous"),
    (ADMIN, "admin"),
    (TENANT, "parse_tenant"),
    (WORKER, "parse_worker"),
)  # by role
MALFORMED = b"\x0a\x05ab"  # field 1, length-delimited, 5 bytes announced and 2 sent: no message type parses it


@pytest.mark.parametrize(("method", "request_type", "streaming"), methods(), ids=lambda v: getattr(v, "name", v))
def test_a_body_that_does_not_parse_is_invalid_argument(fuzzed, method, request_type, streaming):
    channels, _ = fuzzed
    allowed = RULES[method]
    caller = next(who for role, who in ALLOWED_CALLER if role in allowed)
    raw, keep = (lambda b: b), (lambda b: b)
    with pytest.raises(grpc.RpcError) as refused:
        if streaming:
            list(channels[caller].unary_stream(method, request_serializer=raw, response_deserializer=keep)(MALFORMED))
        else:
            channels[caller].unary_unary(method, request_serializer=raw, response_deserializer=keep)(
                MALFORMED, timeout=UNARY_TIMEOUT_S
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (caller, method, refused.value.details())
    assert f"not a valid {request_type.full_name} message" in refused.value.details()
