"""``cantata tenant``: enroll as a tenant (request, status, renew)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from cantata.sdk.cli.common import command, show

COMMAND = "tenant"
HELP = "enroll as a tenant"


def cmd_tenant_request(args) -> int:
    from cantata.sdk import enroll

    ca_pem = Path(args.ca_file).read_bytes()
    status = enroll.request_tenancy(args.name, args.server, ca_pem, args.enroll_server or "")
    show(
        args,
        asdict(status),
        [
            f"requested tenancy {status.name}: {status.status}",
            f"CSR fingerprint: {status.fingerprint}",
            "ask an admin to approve it with this fingerprint",
        ],
    )
    return 0


def cmd_tenant_status(args) -> int:
    from cantata.sdk import enroll

    status = enroll.fetch_status(args.name)
    lines = [f"tenant {status.name}: {status.status}"]
    if status.certificate_installed:
        lines.append(f"certificate installed in profile {status.name}")
    show(args, asdict(status), lines)
    return 0


def cmd_tenant_renew(args) -> int:
    from cantata.sdk import enroll

    expires = enroll.renew_certificate(args.name)
    show(
        args,
        {"name": args.name, "expires": expires},
        [f"renewed {args.name}: new key and certificate, valid until {expires}"],
    )
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    tenant = command(root, COMMAND, HELP)
    p = tenant.add_parser("request", help="make a key and CSR locally and request tenancy")
    p.add_argument("name")
    p.add_argument("--server", required=True, help="HOST:PORT of the control plane")
    p.add_argument("--ca-file", required=True, help="the platform CA certificate (PEM)")
    p.add_argument("--enroll-server", help="HOST:PORT taking enrollment requests (default: --server port + 1)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tenant_request)
    p = tenant.add_parser("status", help="check the request; install the certificate once approved")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tenant_status)
    p = tenant.add_parser("renew", help="replace the key and certificate before they expire")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tenant_renew)
