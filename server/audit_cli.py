"""The audit commands of the ``cantata`` CLI.

``cantata audit verify [--data-dir D | --log PATH] [--pubkey FILE]`` and
``cantata audit report [...]`` exit 0 only when the log is intact, 1 when it
is broken (with a one-line reason on stderr; a report is still written), and
2 when the log cannot be checked at all (missing, unreadable, key missing).
``--anchor URI`` also holds the log against checkpoint copies in a blob store,
which ``cantata admin audit export-anchor --data-dir D --store URI`` makes.
``cantata admin audit rotate-key --data-dir D`` switches the signing key of a
stopped server's log. Each command stores its handler as ``args.func``,
which returns the exit status.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from datetime import UTC, datetime
from pathlib import Path

from cantata.security.audit import (
    REPORT_FORMATS,
    AuditError,
    AuditLog,
    build_report,
    export_checkpoints,
    load_public_keys_file,
    read_anchor,
    render_report,
    verify,
)
from cantata.security.audit.anchor import DEFAULT_PREFIX
from cantata.storage import StoreError, open_store

EXIT_INTACT, EXIT_BROKEN, EXIT_UNCHECKABLE = 0, 1, 2
AUDIT_SUBDIR = "audit"


def parse_iso_time(text: str) -> datetime:
    """An ISO 8601 date or time; a time without zone is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date or time: {text!r}") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _add_location(parser: argparse.ArgumentParser, *, remote: bool = False) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", type=Path, help="server data directory (its audit log is DATA_DIR/audit)")
    where.add_argument("--log", type=Path, help="audit log directory")
    if remote:
        where.add_argument("--profile", help="ask the server, as this client profile (a tenant sees its own records)")
    parser.add_argument(
        "--pubkey", type=Path, help="PEM file of trusted audit public key(s); default: the log's own root key"
    )
    parser.add_argument(
        "--anchor", metavar="URI", help="blob store (file://, s3://, az://) holding exported checkpoint copies"
    )


def register(subparsers: argparse._SubParsersAction, remote_report=None, add_events=None) -> None:
    """Add ``audit verify`` and ``audit report`` to a ``cantata`` sub-command set.

    ``remote_report(args) -> int``, given by the client CLI, serves ``report --profile``
    through the server, so this module needs no client code of its own; ``add_events(commands)``,
    also the client's, adds ``audit events`` (a lookup on the server).
    """
    audit = subparsers.add_parser("audit", help="prove the audit log intact and report on it")
    commands = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    verify_command = commands.add_parser("verify", help="verify the hash chain and signed checkpoints")
    _add_location(verify_command)
    verify_command.set_defaults(func=run_verify)
    report = commands.add_parser("report", help="verify, then summarise activity per tenant and period")
    _add_location(report, remote=remote_report is not None)
    report.add_argument("--tenant", help="only this tenant's records")
    report.add_argument("--since", type=parse_iso_time, help="from this ISO time (inclusive)")
    report.add_argument("--until", type=parse_iso_time, help="up to this ISO time (exclusive)")
    report.add_argument("--format", choices=REPORT_FORMATS, default="text")
    report.add_argument("--out", type=Path, help="write the report here instead of stdout")
    report.set_defaults(func=lambda args: remote_report(args) if getattr(args, "profile", None) else run_report(args))
    if add_events is not None:
        add_events(commands)


def register_admin(subparsers: argparse._SubParsersAction) -> None:
    """Add ``audit rotate-key`` and ``audit export-anchor`` to the ``cantata admin`` sub-command set."""
    audit = subparsers.add_parser("audit", help="manage the audit log")
    commands = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    rotate = commands.add_parser("rotate-key", help="switch the audit log to a fresh signing key")
    rotate.add_argument("--data-dir", type=Path, required=True, help="server data directory (server stopped)")
    rotate.set_defaults(func=run_rotate_key)
    export = commands.add_parser("export-anchor", help="copy new signed checkpoints to an external blob store")
    export.add_argument("--data-dir", type=Path, required=True, help="server data directory")
    export.add_argument("--store", required=True, metavar="URI", help="file://, s3:// or az:// store")
    export.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"key prefix (default {DEFAULT_PREFIX})")
    export.set_defaults(func=run_export_anchor)


def _audit_dir(args: argparse.Namespace) -> Path:
    return args.log if args.log is not None else args.data_dir / AUDIT_SUBDIR


def _fail(command: str, reason: str, status: int) -> int:
    print(f"cantata audit {command}: {reason}", file=sys.stderr)
    return status


def _trust(args: argparse.Namespace) -> dict:
    """The ``public_keys`` and ``anchored`` arguments of verification, from ``--pubkey`` and ``--anchor``."""
    keys = load_public_keys_file(args.pubkey) if args.pubkey else None
    anchored = read_anchor(_audit_dir(args), open_store(args.anchor)) if args.anchor else []
    return {"public_keys": keys, "anchored": anchored}


def run_verify(args: argparse.Namespace) -> int:
    try:
        result = verify(_audit_dir(args), **_trust(args))
    except (AuditError, StoreError) as exc:
        return _fail("verify", str(exc), EXIT_UNCHECKABLE)
    print(result.summary())
    return EXIT_INTACT if result.ok else _fail("verify", result.message, EXIT_BROKEN)


def run_report(args: argparse.Namespace) -> int:
    try:
        report = build_report(_audit_dir(args), tenant=args.tenant, since=args.since, until=args.until, **_trust(args))
    except (AuditError, StoreError) as exc:
        return _fail("report", str(exc), EXIT_UNCHECKABLE)
    rendered = render_report(report, args.format)
    if args.out is not None:
        args.out.write_text(rendered, encoding="utf-8")
    else:
        sys.stdout.write(rendered)
    verdict = report.verification
    return EXIT_INTACT if verdict.ok else _fail("report", verdict.message, EXIT_BROKEN)


def run_rotate_key(args: argparse.Namespace) -> int:
    try:
        with AuditLog.open(args.data_dir / AUDIT_SUBDIR) as log:
            new_id = log.rotate_key(actor=f"local:{getpass.getuser()}")
    except AuditError as exc:
        return _fail("rotate-key", str(exc), EXIT_UNCHECKABLE)
    print(f"audit signing key rotated; new key id {new_id}")
    return EXIT_INTACT


def run_export_anchor(args: argparse.Namespace) -> int:
    try:
        copied = export_checkpoints(args.data_dir / AUDIT_SUBDIR, open_store(args.store), prefix=args.prefix)
    except (AuditError, StoreError) as exc:
        return _fail("export-anchor", str(exc), EXIT_UNCHECKABLE)
    print(f"{copied} new checkpoint(s) copied to {args.store}")
    return EXIT_INTACT
