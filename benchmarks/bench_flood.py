"""A connection flood against a real server: admin-call latency, connections held, descriptors and RSS, with
a no-flood control measured on the same server just before.

Run: .venv/bin/python benchmarks/bench_flood.py [--quick]

One server (the default connection caps of ``server.json``, the dashboard and /metrics on, a long handshake
timeout so that only the caps bound what it holds) is measured twice: idle (control), then while
``FLOOD`` idle TCP connections (half of them sending a partial TLS ClientHello) from ``SOURCES`` loopback
addresses are open to its four ports. Each row times ``ListTenants`` over a fresh admin connection and the
enrollment port's health check (``CALLS`` each), and reads what the server holds from /proc. A second flood row
comes from ``DISTRIBUTED`` addresses, enough to fill every port's total: new connections then wait for a slot
(the handshake timeout frees them), so that row times ``ListTenants`` over an admin connection opened before it.
The issue's target: the admin call answers within 1 s under the flood. Writes benchmarks/results/bench_flood.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import harness
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cantata.sdk.client import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testkit.platform and testkit.flooding: the test kit's real server and floods

from testkit.flooding import PARTIAL_CLIENT_HELLO, Flood, open_files, rss_mib, server_connections  # noqa: E402
from testkit.platform import Platform, free_port  # noqa: E402
from testkit.waiting import wait_for  # noqa: E402

TARGET_S = 1.0
FLOOD, QUICK_FLOOD = 10_000, 2_000
SOURCES = [f"127.0.0.{n}" for n in range(2, 12)]  # 10 addresses x the per-address cap: under each port's total
DISTRIBUTED = [f"127.0.0.{n}" for n in range(100, 140)]  # 40 addresses x the cap: past each port's total
CALLS, QUICK_CALLS = 20, 5


def _ports(server: Platform) -> dict[str, int]:
    settings = server.paths.load_settings()
    return {
        "grpc": server.port,
        "enrollment": int(server.enroll_address.rpartition(":")[2]),
        "dashboard": int(settings.dashboard_listen.rpartition(":")[2]),
        "metrics": int(settings.metrics_listen.rpartition(":")[2]),
    }


def _timed(call, count: int) -> dict:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return {
        "median_s": round(statistics.median(seconds), 4),
        "max_s": round(max(seconds), 4),
        "calls": count,
    }


def _row(server: Platform, ports: dict[str, int], calls: int, admin: Client | None = None) -> dict:
    """Latencies over fresh connections (``admin`` None), or over ``admin``'s connection, opened before."""

    def list_tenants() -> None:
        if admin is not None:
            assert admin.tenants()
            return
        with server.admin() as fresh:  # a fresh connection each time: what a new admin session costs
            assert fresh.tenants()

    def health() -> None:
        with grpc.secure_channel(server.enroll_address, grpc.ssl_channel_credentials(server.ca_pem)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=60)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

    pid = server.proc.pid
    held = server_connections(pid)
    row = {"list_tenants": _timed(list_tenants, calls)}
    if admin is None:
        row["health_check"] = _timed(health, calls)
    return row | {
        "connections_held": {name: sum(c for (p, _), c in held.items() if p == port) for name, port in ports.items()},
        "open_files": open_files(pid),
        "rss_mib": round(rss_mib(pid), 1),
    }


def _flood(server: Platform, ports: dict[str, int], size: int, sources: list[str], cap: int) -> Flood:
    flood = Flood()
    for port in ports.values():
        for index, source in enumerate(sources):
            flood.open(port, size // len(ports) // len(sources), source, PARTIAL_CLIENT_HELLO if index % 2 else b"")
    wait_for(lambda: max(server_connections(server.proc.pid).values()) <= cap)  # the reaper shed the excess
    return flood


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller flood and fewer calls (results to a temp dir)")
    args = parser.parse_args()
    flood_size = QUICK_FLOOD if args.quick else FLOOD
    calls = QUICK_CALLS if args.quick else CALLS
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as folder:
        server = Platform(
            Path(folder),
            settings={
                "dashboard_listen": f"127.0.0.1:{free_port()}",
                "metrics_listen": f"127.0.0.1:{free_port()}",
                "handshake_timeout_s": 600.0,
            },
        )
        server.start()
        try:
            server.enroll("bench").close()
            ports = _ports(server)
            settings = server.paths.load_settings()
            cap = settings.max_connections_per_address
            control = _row(server, ports, calls)
            with _flood(server, ports, flood_size, SOURCES, cap) as flood:
                flooded = _row(server, ports, calls)
                flooded["flood_connections_opened"] = len(flood.sockets) + flood.refused
                flooded["flood_sources"] = len(SOURCES)
            with server.admin() as admin:
                admin.tenants()  # connected before the flood
                with _flood(server, ports, flood_size, DISTRIBUTED, cap) as flood:
                    distributed = _row(server, ports, calls, admin)
                    distributed["flood_connections_opened"] = len(flood.sockets) + flood.refused
                    distributed["flood_sources"] = len(DISTRIBUTED)
        finally:
            server.stop()
    ratio = flooded["list_tenants"]["median_s"] / control["list_tenants"]["median_s"]
    report = {
        "benchmark": "flood",
        "machine": harness.machine(),
        "quick": args.quick,
        "caps": {
            "max_connections": settings.max_connections,
            "max_connections_per_address": settings.max_connections_per_address,
            "http_max_connections": settings.http_max_connections,
            "handshake_timeout_s": settings.handshake_timeout_s,
        },
        "target_list_tenants_s": TARGET_S,
        "rows": {"control": control, "flood": flooded, "distributed_flood_open_connection": distributed},
        "list_tenants_ratio_flood_to_control": round(ratio, 2),
        "rss_ratio_flood_to_control": round(flooded["rss_mib"] / control["rss_mib"], 2),
        "meets_target": max(flooded["list_tenants"]["max_s"], distributed["list_tenants"]["max_s"]) <= TARGET_S,
    }
    out = Path(tempfile.gettempdir()) if args.quick else harness.RESULTS
    path = out / "bench_flood.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
