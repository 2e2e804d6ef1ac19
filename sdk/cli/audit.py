"""``cantata audit report --profile`` and ``audit events``: the server's audit log, from a client.

The ``audit`` command itself is the server plugin's; it adds these from ``groups``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from cantata.sdk.cli.common import CommandError, client_flags, open_client, time_arg


def cmd_audit_report_remote(args) -> int:
    """``cantata audit report --profile P``: a verified report from the server."""
    since = args.since.isoformat() if args.since else ""
    until = args.until.isoformat() if args.until else ""
    with open_client(args) as client:
        report = client.audit.report(tenant=args.tenant or "", since=since, until=until, fmt=args.format)
    if args.out:
        Path(args.out).write_text(report.content, encoding="utf-8")
    else:
        sys.stdout.write(report.content)
    if not report.intact:
        raise CommandError(report.verdict)
    return 0


def _audit_event_line(e) -> str:
    rid = f"  request {e.request_id}" if e.request_id else ""
    details = json.dumps({k: v for k, v in e.details.items() if k != "request_id"}, sort_keys=True)
    return (
        f"{e.seq:>7} {e.time}  {e.action:<24} {e.outcome:<7} {e.tenant or '-':<16} {e.resource or '-'}  "
        f"{e.actor}{rid}  {details}"
    )


def cmd_audit_events(args) -> int:
    """``cantata audit events``: individual records from the server (a tenant sees its own)."""
    with open_client(args) as client:
        events = client.audit.events(
            tenant=args.tenant or "",
            action=args.action or "",
            since=args.since,
            until=args.until,
            request_id=args.request_id or "",
        )
        if args.json:  # one JSON object per line: a stream a log tool can read as it comes
            for e in events:
                print(json.dumps(asdict(e)), flush=True)
            return 0
        lines = [_audit_event_line(e) for e in events]
    print("\n".join(lines) if lines else "no audit records match")
    return 0


def add_audit_events(commands: argparse._SubParsersAction) -> None:
    """Add ``events`` to the ``audit`` command set (which the server plugin makes)."""
    p = commands.add_parser(
        "events",
        help="look up individual audit records on the server (tenants see their own)",
        description="Records oldest first; filters combine with AND. Not a proof: `audit report` verifies.",
    )
    p.add_argument("--tenant", help="only this tenant's records (admins; a tenant always gets its own)")
    p.add_argument("--action", help="only this action, e.g. job_submitted, job_deleted, authz_denied")
    p.add_argument("--since", type=time_arg, help="from this time (ISO 8601 or an age like 12h), inclusive")
    p.add_argument("--until", type=time_arg, help="up to this time (ISO 8601 or an age like 12h), exclusive")
    p.add_argument("--request-id", help="only records of the call that returned this request id")
    client_flags(p, None)
    p.set_defaults(func=cmd_audit_events)
