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

COMMAND_HELP = {
    "server": "run a control-plane server",
    "audit": "prove the audit log intact and report on it",
    "cluster": "credentials of the Ray cluster the server runs jobs on",
}


def _executor(name: str) -> str:
    """The name of an executor of the registry (loaded only when ``--executor`` is given)."""
    from cantata.server.executors.registry import EXECUTORS

    if name not in EXECUTORS:
        raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join(EXECUTORS)})")
    return name


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
    if args.ray_token:
        from cantata.server.config import DataDir
        from cantata.server.executors.tokens import write_token

        path = DataDir(Path(args.data_dir)).ray_token
        write_token(path)
        print(f"Ray cluster token written to {path} (give it to every Ray node as RAY_AUTH_TOKEN_PATH)")
    return 0


def cmd_node_cert(args) -> int:
    from cantata.server.config import DataDir
    from cantata.server.executors.tokens import write_node_certificate

    paths = DataDir(Path(args.data_dir))
    out = Path(args.out)
    serial = write_node_certificate(paths, args.node_ip, out, days=args.days)
    print(f"node certificate {serial:x} for {args.node_ip} written to {out} (node.pem, node.key, ca.pem)")
    return 0


def cmd_start(args) -> int:
    from cantata.server import logformat
    from cantata.server.app import ControlPlane
    from cantata.storage.logs import set_third_party_log_level

    fmt = args.log_format or log_format().value
    logformat.configure(fmt)
    os.environ[LOG_FORMAT_ENV] = fmt  # the workers log in the same format
    os.environ[LEVEL_ENV] = set_third_party_log_level(args.third_party_log_level)  # the workers inherit it
    plane = ControlPlane(
        Path(args.data_dir),
        listen=args.listen,
        executor=args.executor,
        ray_address=args.ray_address,
        gpus=args.gpus,
        on_stop=args.on_stop,
    )
    port = plane.start()
    print(f"cantata server listening on port {port} (data dir {args.data_dir})", flush=True)
    plane.serve_forever()
    print("cantata server stopped", flush=True)
    return 0


def cmd_tenant_gid(args) -> int:
    from cantata.server.config import DataDir
    from cantata.server.workers.tenant_groups import TenantGroups

    paths = DataDir(Path(args.data_dir))
    settings = paths.load_settings()
    print(TenantGroups(paths.tenant_gids, settings.tenant_gid_base, settings.tenant_gid_count).gid(args.tenant))
    return 0


def cmd_rotate_cert(args) -> int:
    from cantata.server.bootstrap import parse_advertise, server_names
    from cantata.server.config import DataDir
    from cantata.server.network.tls import rotate_server_certificate

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
    p.add_argument("--ray-token", action="store_true", help="also mint a Ray cluster token into DATA_DIR/ray/token")
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
        "--executor", type=_executor, help="where workers run: local or ray (default: server.json, else local)"
    )
    p.add_argument("--ray-address", help="HOST:PORT of the Ray cluster's GCS (default: server.json)")
    p.add_argument("--gpus", type=int, help="GPUs of this node for the local executor (default: count them)")
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
    p = server.add_parser(
        "tenant-gid", help="the gid of a tenant's workers, for its file:// data (`chgrp` it; given now if it has none)"
    )
    p.add_argument("--data-dir", required=True)
    p.add_argument("tenant")
    p.set_defaults(func=cmd_tenant_gid)
    p = server.add_parser("rotate-cert", help="issue a new server certificate; picked up without a restart")
    p.add_argument("--data-dir", required=True)
    p.add_argument(
        "--advertise",
        metavar="HOST[,IP...]",
        help="names and addresses clients and nodes reach the server by, put in its certificate "
        '(default: those recorded by init or the last rotation; "" for none)',
    )
    p.set_defaults(func=cmd_rotate_cert)


def register_cluster(groups: dict[str, argparse._SubParsersAction]) -> None:
    """``cantata cluster node-cert``: a Ray node's TLS certificate from the platform CA."""
    cluster = (
        groups["root"].add_parser("cluster", help=COMMAND_HELP["cluster"]).add_subparsers(dest="sub", required=True)
    )
    p = cluster.add_parser("node-cert", help="issue a Ray node's TLS certificate (RAY_USE_TLS) from the platform CA")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--node-ip", required=True, help="the node's cluster address (its certificate names it)")
    p.add_argument("--out", required=True, help="folder for node.pem, node.key (0600) and ca.pem")
    p.add_argument("--days", type=int, default=365)
    p.set_defaults(func=cmd_node_cert)


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
