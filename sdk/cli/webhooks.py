"""``cantata webhooks``: HTTPS endpoints that receive the tenant's job events."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from cantata.sdk.cli.common import client_flags, command, open_client, show

COMMAND = "webhooks"
HELP = "HTTPS endpoints that receive your jobs' events, signed"


def _webhook_line(w) -> str:
    return f"{w.id}  {w.url}  {', '.join(w.event_types) or 'every event'}  {w.created}"


def cmd_webhooks_add(args) -> int:
    with open_client(args) as client:
        webhook = client.webhooks.add(args.url, args.event, args.description)
    lines = [
        f"added webhook {_webhook_line(webhook)}",
        f"signing secret (shown once; receivers check Cantata-Signature with it): {webhook.secret}",
    ]
    show(args, asdict(webhook), lines)
    return 0


def cmd_webhooks_list(args) -> int:
    with open_client(args) as client:
        webhooks = client.webhooks.list()
    show(args, [asdict(w) for w in webhooks], [_webhook_line(w) for w in webhooks] or ["no webhooks"])
    return 0


def cmd_webhooks_remove(args) -> int:
    with open_client(args) as client:
        client.webhooks.remove(args.id)
    show(args, {"id": args.id, "removed": True}, [f"removed webhook {args.id}"])
    return 0


def cmd_webhooks_deliveries(args) -> int:
    with open_client(args) as client:
        deliveries = client.webhooks.deliveries(args.webhook, state=args.state, limit=args.limit)
    lines = [
        f"{d.id:>6} {d.webhook_id} {d.event_type:<14} {d.job_id} {d.state:<9} attempts {d.attempts}"
        + (f"  last: {d.last_error or d.last_status}" if d.attempts else "")
        for d in deliveries
    ]
    show(args, [asdict(d) for d in deliveries], lines or ["no deliveries"])
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    webhooks = command(root, COMMAND, HELP)
    p = webhooks.add_parser(
        "add",
        help="register an https endpoint; prints its signing secret once",
        description="Job events (job.queued, job.running, job.succeeded, job.failed, job.cancelled, "
        "job.anomaly, job.rollback) are POSTed as JSON, signed with HMAC-SHA256 (Cantata-Signature), and retried with "
        "backoff until the endpoint answers 2xx.",
    )
    p.add_argument("url", help="https://HOST[:PORT]/PATH")
    p.add_argument(
        "--event", action="append", default=[], metavar="TYPE", help="an event type to send (repeat; default: all)"
    )
    p.add_argument("--description", default="")
    client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_add)
    p = webhooks.add_parser("list", help="your webhooks (never their secrets)")
    client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_list)
    p = webhooks.add_parser("remove", help="remove a webhook; its pending deliveries are dropped")
    p.add_argument("id")
    client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_remove)
    p = webhooks.add_parser("deliveries", help="recent deliveries, with their attempts and last error")
    p.add_argument("--webhook", default="", metavar="ID", help="of this webhook only")
    p.add_argument("--state", default="", choices=["", "pending", "delivered", "dead"])
    p.add_argument("--limit", type=int, default=100)
    client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_deliveries)
