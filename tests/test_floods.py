"""Connection floods against a real server (as root, on loopback): every listening port holds at most its caps,
the admin and the health check still answer during the flood, and half-open connections are closed by the
handshake and request-head timeouts (docs/security.md#floods).

Two servers: ``flooded`` has a long handshake timeout, so that only the caps can bound what it holds while it is
flooded; ``impatient`` has a short one, for the slowloris tests, which wait for the server's close, never a time.
"""

from __future__ import annotations

import resource

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cantata.server.network.fd_budget import DescriptorBudgetTooSmall, reserve_descriptors
from testkit.flooding import (
    HALF_SENT_HEAD,
    PARTIAL_CLIENT_HELLO,
    Flood,
    open_files,
    server_connections,
    tls_client,
    wait_closed,
)
from testkit.platform import Platform, free_port
from testkit.waiting import wait_for

pytestmark = pytest.mark.integration

PER_ADDRESS = 24
GRPC_TOTAL = 120
HTTP_TOTAL = 60
FLOOD = 1000  # idle connections per port from one address, and as many again from many
SOURCES = [f"127.0.0.{n}" for n in range(10, 30)]  # 20 addresses: 20 x PER_ADDRESS is past every total


def _settings(handshake_timeout_s: float) -> dict:
    return {
        "dashboard_listen": f"127.0.0.1:{free_port()}",
        "metrics_listen": f"127.0.0.1:{free_port()}",
        "max_connections": GRPC_TOTAL,
        "max_connections_per_address": PER_ADDRESS,
        "http_max_connections": HTTP_TOTAL,
        "handshake_timeout_s": handshake_timeout_s,
    }


def _ports(server: Platform) -> dict[str, int]:
    settings = server.paths.load_settings()
    return {
        "grpc": server.port,
        "enrollment": int(server.enroll_address.rpartition(":")[2]),
        "dashboard": int(settings.dashboard_listen.rpartition(":")[2]),
        "metrics": int(settings.metrics_listen.rpartition(":")[2]),
    }


def _cap(name: str) -> int:
    return GRPC_TOTAL if name in ("grpc", "enrollment") else HTTP_TOTAL


@pytest.fixture(scope="module")
def flooded(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("flooded"), settings=_settings(handshake_timeout_s=600))
    platform.start()
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("impatient"), settings=_settings(handshake_timeout_s=2))
    platform.start()
    yield platform
    platform.stop()


def _held(server: Platform, port: int, sources: list[str]) -> int:
    connections = server_connections(server.proc.pid)
    return sum(count for (local, peer), count in connections.items() if local == port and peer in sources)


def _answers(server: Platform) -> None:
    """A fresh admin connection lists the tenants, a fresh anonymous one gets SERVING from the health check."""
    with server.admin() as admin:
        assert "flood-victim" in {t.name for t in admin.tenants()}
    with grpc.secure_channel(server.enroll_address, grpc.ssl_channel_credentials(server.ca_pem)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=60)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_one_address_holds_at_most_its_share_and_the_admin_still_answers(flooded):
    flooded.enroll("flood-victim").close()
    ports = _ports(flooded)
    files_before = open_files(flooded.proc.pid)
    with Flood() as flood:
        for port in ports.values():
            flood.open(port, FLOOD // 2, "127.0.0.2")
            flood.open(port, FLOOD // 2, "127.0.0.2", PARTIAL_CLIENT_HELLO)
        assert len(flood.sockets) >= 3 * FLOOD  # the kernel took them: the server had to turn them away
        for port in ports.values():  # the gRPC ports shed the excess at their next sweep: wait for it
            wait_for(lambda port=port: _held(flooded, port, ["127.0.0.2"]) <= PER_ADDRESS)
        held = {name: _held(flooded, port, ["127.0.0.2"]) for name, port in ports.items()}
        assert all(0 < count <= PER_ADDRESS for count in held.values()), held
        assert open_files(flooded.proc.pid) <= files_before + len(ports) * PER_ADDRESS + 16
        _answers(flooded)
        # The dashboard, flooded too, still serves another address: a page without a session is 401.
        page = tls_client(ports["dashboard"])
        page.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert wait_closed(page).startswith(b"HTTP/1.1 401 ")
    assert "past its" in flooded.server_log()  # the reaper said what it shed


def test_many_addresses_hold_at_most_each_ports_total(flooded):
    ports = _ports(flooded)
    with Flood() as flood:
        for source in SOURCES:
            for port in ports.values():
                flood.open(port, FLOOD // len(SOURCES), source)
        for name, port in ports.items():
            wait_for(lambda port=port: all(_held(flooded, port, [s]) <= PER_ADDRESS for s in SOURCES))
            held = _held(flooded, port, SOURCES)
            assert 0 < held <= _cap(name), (name, held)


@pytest.mark.parametrize("port_name", ["grpc", "enrollment", "dashboard", "metrics"])
def test_a_silent_connection_is_closed_by_the_handshake_timeout(impatient, port_name):
    with Flood() as flood:
        flood.open(_ports(impatient)[port_name], 1, "127.0.0.3")
        flood.open(_ports(impatient)[port_name], 1, "127.0.0.3", PARTIAL_CLIENT_HELLO)
        for sock in flood.sockets:
            assert not wait_closed(sock).startswith(b"HTTP")  # closed, with nothing served


@pytest.mark.parametrize("port_name", ["dashboard", "metrics"])
def test_a_half_sent_request_head_is_closed_by_the_head_timeout(impatient, port_name):
    slow = tls_client(_ports(impatient)[port_name], "127.0.0.4")
    slow.sendall(HALF_SENT_HEAD)
    assert wait_closed(slow) == b""  # closed before any response: the head never arrived


def test_a_handshaken_grpc_connection_without_http2_is_closed(impatient):
    slow = tls_client(_ports(impatient)["enrollment"], "127.0.0.5")
    slow.sendall(b"PRI * HTTP/2.0\r\n")  # half of the HTTP/2 preface, then nothing
    wait_closed(slow)


def test_a_budget_past_the_hard_limit_refuses_to_start():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with pytest.raises(DescriptorBudgetTooSmall, match="past the hard limit"):
        reserve_descriptors(hard, reserved=1024)
    assert reserve_descriptors(16, reserved=16) == hard  # the soft limit was raised to the hard one
