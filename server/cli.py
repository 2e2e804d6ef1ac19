"""``cantata server init|start`` (and the audit commands), contributed to the CLI as a plugin."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cantata.server import audit_cli, logformat
from cantata.server.bootstrap import init_data_dir, server_names
from cantata.server.config import DataDir
from cantata.server.tls import rotate_server_certificate
from cantata.storage.logs import LEVEL_ENV, set_third_party_log_level


def cmd_init(args) -> int:
    profile = init_data_dir(
        Path(args.data_dir), listen=args.listen, enroll_listen=args.enroll_listen or "", admin=args.admin
    )
    print(f"initialised {args.data_dir}: CA at {Path(args.data_dir) / 'ca.pem'}, listening on {args.listen}")
    print(f"admin profile {args.admin!r} written to {profile}")
    return 0


def cmd_start(args) -> int:
    from cantata.server.app import ControlPlane

    logformat.configure(args.log_format)
    os.environ[LEVEL_ENV] = set_third_party_log_level(args.third_party_log_level)  # the workers inherit it
    plane = ControlPlane(Path(args.data_dir), listen=args.listen)
    port = plane.start()
    print(f"cantata server listening on port {port} (data dir {args.data_dir})", flush=True)
    plane.serve_forever()
    print("cantata server stopped", flush=True)
    return 0


def cmd_rotate_cert(args) -> int:
    paths = DataDir(Path(args.data_dir))
    dns, ips = server_names(paths.load_settings().listen)
    serial = rotate_server_certificate(paths, dns, ips)
    print(f"new server certificate {serial:x}; a running server uses it for new connections")
    return 0


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    server = (
        groups["root"].add_parser("server", help="run a control-plane server").add_subparsers(dest="sub", required=True)
    )
    p = server.add_parser("init", help="create a data directory: CA, server certificate, admin profile")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--listen", default="127.0.0.1:7443", help="HOST:PORT to serve on (mutual TLS)")
    p.add_argument(
        "--enroll-listen", help="HOST:PORT for enrollment without a client certificate (default: the --listen port + 1)"
    )
    p.add_argument("--admin", default="admin", help="name of the first admin (and its profile)")
    p.set_defaults(func=cmd_init)
    p = server.add_parser("start", help="serve until SIGTERM/SIGINT")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--listen", help="override the address recorded by init")
    p.add_argument(
        "--log-format",
        choices=logformat.FORMATS,
        default="text",
        help="text lines for people, or one JSON object per line for log shippers (default: text)",
    )
    p.add_argument(
        "--third-party-log-level",
        help=f"log level of the storage SDKs (Azure, boto, urllib3) in the server and its workers "
        f"(default: ${LEVEL_ENV}, else WARNING)",
    )
    p.set_defaults(func=cmd_start)
    p = server.add_parser("rotate-cert", help="issue a new server certificate; picked up without a restart")
    p.add_argument("--data-dir", required=True)
    p.set_defaults(func=cmd_rotate_cert)
    audit_cli.register(
        groups["root"], remote_report=groups.get("remote_audit_report"), add_events=groups.get("audit_events")
    )
    audit_cli.register_admin(groups["admin"])
