"""`cantata server init` and `server start` refuse listeners that share a port, before they bind anything."""

from __future__ import annotations

import json

import pytest

from cantata.server.config import PortCollision, check_ports
from testkit.platform import cli, free_port, passable


def test_init_refuses_the_dashboard_on_the_enrollment_port_and_writes_nothing(tmp_path):
    port = free_port()
    data = tmp_path / "d"
    refused = cli(
        "server", "init", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}",
        "--dashboard-listen", f"127.0.0.1:{port + 1}", check=False,
    )  # fmt: skip
    assert refused.returncode == 1
    assert f"dashboard_listen 127.0.0.1:{port + 1} and enroll_listen 127.0.0.1:{port + 1}" in refused.stderr
    assert "Traceback" not in refused.stderr and not data.exists()


def test_start_refuses_a_metrics_port_that_a_wildcard_listener_takes(tmp_path):
    port = free_port()
    data = passable(tmp_path) / "d"
    cli("server", "init", "--data-dir", str(data), "--listen", f"0.0.0.0:{port}")
    config = data / "server.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "metrics_listen": f"127.0.0.1:{port}"}))
    refused = cli("server", "start", "--data-dir", str(data), check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"metrics_listen 127.0.0.1:{port} and listen 0.0.0.0:{port} use the same port" in refused.stderr


def test_distinct_hosts_or_ports_and_any_free_port_pass():
    check_ports({"listen": "10.0.0.1:7443", "enroll_listen": "10.0.0.2:7443", "metrics_listen": ""})
    check_ports({"listen": "127.0.0.1:0", "enroll_listen": "127.0.0.1:0", "dashboard_listen": "[::1]:7445"})
    with pytest.raises(PortCollision, match="enroll_listen"):
        check_ports({"listen": "[::]:7443", "enroll_listen": "[::1]:7443"})
