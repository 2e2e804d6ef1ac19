"""``cantata server init``: create a data directory from nothing.

Makes the platform CA, the server's TLS certificate, the audit signing key,
the SQLite database, and the first admin's client profile.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cantata.security import audit
from cantata.security.keys import MASTER_KEY_ENV, MasterKey
from cantata.security.pki import CertificateAuthority, Principal
from cantata.server.config import (
    DataDir,
    ServerSettings,
    check_ports,
    enrollment_address,
    settings_ports,
    write_private,
)
from cantata.server.store import Store
from cantata.server.workers.sandbox import check_passable

_DNS_NAME = re.compile(r"(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def cantata_home() -> Path:
    return Path(os.environ.get("CANTATA_HOME") or Path.home() / ".cantata")


def parse_advertise(text: str) -> list[str]:
    """``HOST[,IP...]`` as ``--advertise`` takes it: the names and addresses clients and nodes reach the server by.

    Raises ``ValueError`` for an empty entry, a wildcard address, or a name that is no DNS name.
    """
    names = [part.strip().strip("[]") for part in text.split(",")]
    for name in names:
        try:
            wildcard = ipaddress.ip_address(name).is_unspecified
        except ValueError:
            if not _DNS_NAME.fullmatch(name):
                raise ValueError(f"--advertise: {name!r} is neither an IP address nor a DNS name") from None
            continue
        if wildcard:
            raise ValueError(f"--advertise: {name!r} is a wildcard, not an address clients can reach")
    return names


def server_names(listen: str, advertise: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """DNS names and IPs the server certificate covers: loopback, its listen address, and what it advertises."""
    dns, ips = ["localhost"], ["127.0.0.1", "::1"]
    for host in [listen.rsplit(":", 1)[0], *advertise]:
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
            if str(ip) not in ips and not ip.is_unspecified:
                ips.append(str(ip))
        except ValueError:
            if host and host not in dns:
                dns.append(host)
    return dns, ips


def write_profile(name: str, address: str, enroll_address: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> Path:
    """Write a client profile in the layout docs/user-guide.md#enrolling describes."""
    folder = cantata_home() / "profiles" / name
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    (folder / "profile.json").write_text(
        json.dumps({"name": name, "server": address, "enroll_server": enroll_address}, indent=2) + "\n"
    )
    (folder / "ca.pem").write_bytes(ca_pem)
    (folder / "cert.pem").write_bytes(cert_pem)
    write_private(folder / "key.pem", key_pem)
    return folder


def init_data_dir(
    root: Path,
    *,
    listen: str,
    enroll_listen: str = "",
    admin: str = "admin",
    dashboard_listen: str = "",
    advertise: Sequence[str] = (),
) -> Path:
    """Create a new data directory; refuse to overwrite an existing one, or listeners that share a port."""
    paths = DataDir(root)
    if paths.exists():
        raise FileExistsError(f"{root} already holds a Cantata server")
    settings = ServerSettings(
        listen=listen,
        enroll_listen=enroll_listen or enrollment_address(listen),
        dashboard_listen=dashboard_listen,
        advertise=list(advertise),
    )
    check_ports(settings_ports(settings))
    check_passable(root)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)

    ca = CertificateAuthority.create()
    paths.ca_cert.write_bytes(ca.cert_pem)
    paths.trust_bundle.write_bytes(ca.cert_pem)
    write_private(paths.ca_key, ca.key_pem)

    dns, ips = server_names(listen, settings.advertise)
    server = ca.issue_bundle(None, lifetime=dt.timedelta(days=365), dns_names=dns, ips=ips, server=True)
    paths.server_cert.write_bytes(server.cert_pem)
    write_private(paths.server_key, server.key_pem)

    audit.init_audit(paths.audit)
    if not os.environ.get(MASTER_KEY_ENV):
        MasterKey.create_file(paths.master_key)
    paths.jobs.mkdir()
    paths.checkpoints.mkdir()

    store = Store(paths.database)
    bundle = ca.issue_bundle(Principal.admin(admin), lifetime=dt.timedelta(days=365))
    cert = bundle.certificate
    store.record_certificate(cert.serial_number, Principal.admin(admin).uri, cert.not_valid_after_utc)
    store.close()

    paths.save_settings(settings)

    def connect(address: str) -> str:
        return address.replace("0.0.0.0", "127.0.0.1")  # noqa: S104 (maps a wildcard to loopback)

    return write_profile(
        admin, connect(listen), connect(settings.enroll_listen), ca.cert_pem, bundle.cert_pem, bundle.key_pem
    )
