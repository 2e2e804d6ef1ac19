"""``cantata server init|start`` and the audit commands, contributed to the CLI as plugins.

The CLI imports this module only to run (or list) these commands, and each
command imports what it runs: building the parser loads nothing but argparse.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cantata.logformat import LOG_FORMAT_ENV, LogFormat, log_format
from cantata.storage.logs import LEVEL_ENV

COMMAND_HELP = {"server": "run a control-plane server", "audit": "prove the audit log intact and report on it"}


def cmd_init(args) -> int:
    from cantata.server.bootstrap import init_data_dir, parse_advertise

    profile = init_data_dir(
        Path(args.data_dir),
        listen=args.listen,
        enroll_listen=args.enroll_listen or "",
        admin=args.admin,
        dashboard_listen=args.dashboard_listen or "",
        advertise=parse_advertise(args.advertise) if args.advertise else [],
    )
    print(f"initialised {args.data_dir}: CA at {Path(args.data_dir) / 'ca.pem'}, listening on {args.listen}")
    print(f"admin profile {args.admin!r} written to {profile}")
    return 0


def cmd_start(args) -> int:
    from cantata.server import logformat
    from cantata.server.app import ControlPlane
    from cantata.storage.logs import set_third_party_log_level

    fmt = args.log_format or log_format().value
    logformat.configure(fmt)
    os.environ[LOG_FORMAT_ENV] = fmt  # the workers log in the same format
    os.environ[LEVEL_ENV] = set_third_party_log_level(args.third_party_log_level)  # the workers inherit it
    plane = ControlPlane(Path(args.data_dir), listen=args.listen, on_stop=args.on_stop)
    port = plane.start()
    print(f"cantata server listening on port {port} (data dir {args.data_dir})", flush=True)
    plane.serve_forever()
    print("cantata server stopped", flush=True)
    return 0


def cmd_rotate_cert(args) -> int:
    from cantata.server.bootstrap import parse_advertise, server_names
    from cantata.server.config import DataDir
    from cantata.server.tls import rotate_server_certificate

    paths = DataDir(Path(args.data_dir))
    settings = paths.load_settings()
    if args.advertise is not None:  # recorded, so that the next rotation names the same
        settings.advertise = parse_advertise(args.advertise) if args.advertise else []
        paths.save_settings(settings)
    dns, ips = server_names(settings.listen, settings.advertise)
    serial = rotate_server_certificate(paths, dns, ips)
    print(f"new server certificate {serial:x} for {', '.join(dns + ips)}; a running server uses it for new connections")
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
    p.add_argument("--dashboard-listen", help="HOST:PORT for the read-only web dashboard over HTTPS (default: none)")
    p.add_argument(
        "--advertise",
        metavar="HOST[,IP...]",
        help="names and addresses clients and nodes reach the server by, put in its certificate "
        "(besides localhost and a non-wildcard --listen host)",
    )
    p.set_defaults(func=cmd_init)
    p = server.add_parser("start", help="serve until SIGTERM/SIGINT")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--listen", help="override the address recorded by init")
    p.add_argument(
        "--on-stop",
        choices=["leave", "requeue"],
        help="on SIGTERM/SIGINT, leave running jobs training for the next server to re-adopt (an upgrade), or "
        "stop them and queue them again to resume from their checkpoints (default: server.json's on_stop, "
        "else leave)",
    )
    p.add_argument(
        "--log-format",
        choices=[f.value for f in LogFormat],
        help=f"text lines for people, or one JSON object per line for log shippers, in the server and its "
        f"workers (default: ${LOG_FORMAT_ENV}, else text)",
    )
    p.add_argument(
        "--third-party-log-level",
        help=f"log level of the storage SDKs (Azure, boto, urllib3) in the server and its workers "
        f"(default: ${LEVEL_ENV}, else WARNING)",
    )
    p.set_defaults(func=cmd_start)
    p = server.add_parser("rotate-cert", help="issue a new server certificate; picked up without a restart")
    p.add_argument("--data-dir", required=True)
    p.add_argument(
        "--advertise",
        metavar="HOST[,IP...]",
        help="names and addresses clients and nodes reach the server by, put in its certificate "
        '(default: those recorded by init or the last rotation; "" for none)',
    )
    p.set_defaults(func=cmd_rotate_cert)


def register_audit(groups: dict[str, argparse._SubParsersAction]) -> None:
    """``cantata audit verify|report`` (``report --profile`` asks the server through the client CLI)."""
    from cantata.server import audit_cli

    audit_cli.register(
        groups["root"], remote_report=groups.get("remote_audit_report"), add_events=groups.get("audit_events")
    )


def register_admin(groups: dict[str, argparse._SubParsersAction]) -> None:
    """``cantata admin audit rotate-key|export-anchor``, on a server's data directory."""
    from cantata.server import audit_cli

    audit_cli.register_admin(groups["admin"])
