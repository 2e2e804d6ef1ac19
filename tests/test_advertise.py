"""The server certificate names what clients reach it by: a tenant enrolls from another network namespace.

The server listens on every address (``--listen 0.0.0.0:P``) and advertises the
address of its end of a veth pair; a tenant in a network namespace of its own
reaches it only over that pair, and verifies the server's certificate against it.
Needs root (``ip netns``), as CI runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cantata.server.bootstrap import parse_advertise, server_names
from testkit.platform import Platform, cli

SUFFIX = os.getpid() % 100_000
OCTET = os.getpid() % 200 + 20  # this run's own /30, so that parallel runs do not collide
SERVER_IP, TENANT_IP = f"10.218.{OCTET}.1", f"10.218.{OCTET}.2"
NETNS, HOST_END, NS_END = f"cantata-adv-{SUFFIX}", f"cadv{SUFFIX}h", f"cadv{SUFFIX}n"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A network namespace joined to this one by a veth pair: SERVER_IP here, TENANT_IP there."""
    ip("netns", "add", NETNS)
    try:
        ip("link", "add", HOST_END, "type", "veth", "peer", "name", NS_END)
        ip("link", "set", NS_END, "netns", NETNS)
        ip("addr", "add", f"{SERVER_IP}/30", "dev", HOST_END)
        ip("link", "set", HOST_END, "up")
        ip("-n", NETNS, "addr", "add", f"{TENANT_IP}/30", "dev", NS_END)
        ip("-n", NETNS, "link", "set", NS_END, "up")
        ip("-n", NETNS, "link", "set", "lo", "up")
        yield NETNS
    finally:
        subprocess.run(["ip", "link", "del", HOST_END], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


@pytest.fixture(scope="module")
def remote_platform(tmp_path_factory, netns):
    p = Platform(
        tmp_path_factory.mktemp("advertised"), listen_host="0.0.0.0", init=("--advertise", f"cantata.test,{SERVER_IP}")
    )
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def in_netns(platform: Platform, home: Path, *args: str) -> subprocess.CompletedProcess:
    """The real ``cantata`` CLI, run inside the tenant's namespace with its own CANTATA_HOME."""
    env = {**platform.env, "CANTATA_HOME": str(home)}
    command = ["ip", "netns", "exec", NETNS, sys.executable, "-m", "cantata.sdk.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env)


def test_advertised_names_are_checked_and_join_the_certificate():
    assert parse_advertise("cantata.example.com,10.0.0.5, ::1 ") == ["cantata.example.com", "10.0.0.5", "::1"]
    for bad in ("0.0.0.0", "host,,10.0.0.1", "under_score!", "[::]"):
        with pytest.raises(ValueError, match="--advertise"):
            parse_advertise(bad)
    dns, ips = server_names("0.0.0.0:7443", ["cantata.example.com", "10.0.0.5"])
    assert (dns, ips) == (["localhost", "cantata.example.com"], ["127.0.0.1", "::1", "10.0.0.5"])


@pytest.mark.integration
def test_a_tenant_enrolls_from_another_namespace_over_the_advertised_address(remote_platform, tmp_path):
    p = remote_platform
    port, enroll_port = p.address.rsplit(":", 1)[1], p.enroll_address.rsplit(":", 1)[1]
    server, enroll_server = f"{SERVER_IP}:{port}", f"{SERVER_IP}:{enroll_port}"
    ca = p.data_dir / "ca.pem"
    home = tmp_path / "remote-home"

    # Without the address in the certificate, the tenant's TLS refuses the server.
    cli("server", "rotate-cert", "--data-dir", str(p.data_dir), "--advertise", "", env=p.env)
    refused = in_netns(p, home, "tenant", "request", "far", "--server", server, "--enroll-server", enroll_server,
                       "--ca-file", str(ca))  # fmt: skip
    assert refused.returncode != 0
    with p.admin() as admin:
        assert "far" not in {t.name for t in admin.tenants()}

    rotated = cli("server", "rotate-cert", "--data-dir", str(p.data_dir), "--advertise", f"cantata.test,{SERVER_IP}",
                  env=p.env)  # fmt: skip
    assert SERVER_IP in rotated.stdout and p.paths.load_settings().advertise == ["cantata.test", SERVER_IP]
    asked = in_netns(p, home / "2", "tenant", "request", "far", "--server", server, "--enroll-server",
                     enroll_server, "--ca-file", str(ca), "--json")  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    fingerprint = json.loads(asked.stdout)["fingerprint"]
    with p.admin() as admin:
        admin.approve_tenant("far", fingerprint)
    status = in_netns(p, home / "2", "tenant", "status", "far", "--json")
    assert status.returncode == 0 and '"certificate_installed": true' in status.stdout, status.stderr
    listed = in_netns(p, home / "2", "jobs", "list", "--profile", "far", "--json")  # mutual TLS, same address
    assert listed.returncode == 0, listed.stderr
