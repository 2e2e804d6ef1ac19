"""``cantata admin``: tenants, keys, scrapers and jobs of every tenant (an admin's profile)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from cantata.sdk.cli.common import client_flags, command, job_id_argument, open_client, show

COMMAND = "admin"
HELP = "platform administration"


def _tenant_line(t) -> str:
    cert = f"  cert {t.certificate_serial} until {t.certificate_expires[:10]}" if t.certificate_serial else ""
    return (
        f"{t.name:<20} {t.status:<10} jobs {t.running_jobs}/{t.max_concurrent_jobs or '-'}  "
        f"workers<={t.max_workers_per_job or '-'}  steps<={t.max_total_steps or '-'}  gpus<={t.max_gpus or '-'}  "
        f"{t.fingerprint}{cert}"
    )


def cmd_admin_list(args) -> int:
    with open_client(args) as client:
        tenants = client.tenants.list(args.status.upper() if args.status else "")
    show(args, [asdict(t) for t in tenants], [_tenant_line(t) for t in tenants] or ["no tenants"])
    return 0


def cmd_admin_approve(args) -> int:
    with open_client(args) as client:
        t = client.tenants.approve(
            args.name,
            args.fingerprint,
            max_concurrent_jobs=args.max_jobs,
            max_workers_per_job=args.max_workers,
            max_total_steps=args.max_steps,
            max_gpus=args.max_gpus,
        )
    show(args, asdict(t), [f"approved {t.name}: " + _tenant_line(t)])
    return 0


def cmd_admin_set_quota(args) -> int:
    with open_client(args) as client:
        t = client.tenants.set_quota(
            args.name,
            max_concurrent_jobs=args.max_jobs,
            max_workers_per_job=args.max_workers,
            max_total_steps=args.max_steps,
            max_gpus=args.max_gpus,
        )
    show(args, asdict(t), [f"quota of {t.name}: " + _tenant_line(t)])
    return 0


def cmd_admin_set_retention(args) -> int:
    with open_client(args) as client:
        t = client.tenants.set_retention(args.name, args.retention_days)
    kept = f"{t.retention_days} days" if t.retention_days else "for ever"
    show(args, asdict(t), [f"{t.name}: ended jobs are kept {kept}"])
    return 0


def cmd_admin_revoke_cert(args) -> int:
    with open_client(args) as client:
        principal = client.admin.revoke_certificate(args.serial, args.reason)
    show(args, {"serial": args.serial, "principal": principal}, [f"revoked certificate {args.serial} of {principal}"])
    return 0


def cmd_admin_scrapers_add(args) -> int:
    from cantata.sdk import enroll

    profile, serial = enroll.add_scraper(args.profile, args.name)
    metrics = json.loads((profile.folder / "profile.json").read_text()).get("metrics_server", "")
    lines = [
        f"scraper {args.name!r}: certificate {serial} in profile {profile.folder}",
        f"/metrics: https://{metrics}/metrics" if metrics else "the server serves no /metrics: set metrics_listen",
    ]
    show(args, {"name": args.name, "serial": serial, "profile": str(profile.folder), "metrics": metrics}, lines)
    return 0


def cmd_admin_keys_rotate(args) -> int:
    with open_client(args) as client:
        r = client.tenants.rotate_key(args.tenant, retire_unused=args.retire_unused)
    retired = f"; retired versions {r.retired}" if r.retired else ""
    show(
        args, asdict(r), [f"{args.tenant}: key version {r.version}, {r.objects_rewrapped} objects re-wrapped{retired}"]
    )
    return 0


def cmd_admin_anomalies(args) -> int:
    with open_client(args) as client:
        found = client.admin.anomalies(args.job_id)
    show(
        args,
        [asdict(a) for a in found],
        [
            f"round {a.round:>5}  worker {a.reporter} {a.verdict}ed worker {a.peer} ({a.check}, score {a.score:.3g})"
            + ("  QUARANTINED" if a.quarantined else "")
            for a in found
        ]
        or ["no anomalies"],
    )
    return 0


def _tenant_action(verb: str):
    def run(args) -> int:
        with open_client(args) as client:
            t = getattr(client.tenants, verb)(args.name, args.reason)
        show(args, asdict(t), [f"{t.name}: now {t.status}"])
        return 0

    return run


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    admin = command(root, COMMAND, HELP)
    tenants = admin.add_parser("tenants", help="the tenant lifecycle").add_subparsers(dest="action", required=True)
    p = tenants.add_parser("list", help="tenants with their status, quotas and usage")
    p.add_argument("--status", help="only tenants with this status (pending, approved, suspended)")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_list)
    p = tenants.add_parser("approve", help="sign a pending request whose CSR fingerprint matches")
    p.add_argument("name")
    p.add_argument("--fingerprint", required=True, help="sha256:... as printed by `cantata tenant request`")
    p.add_argument("--max-jobs", type=int, default=0, help="concurrent jobs (0: server default)")
    p.add_argument("--max-workers", type=int, default=0, help="workers per job (0: server default)")
    p.add_argument("--max-steps", type=int, default=0, help="steps per job (0: server default)")
    p.add_argument("--max-gpus", type=int, default=0, help="GPUs of all unfinished jobs together (0: no limit)")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_approve)
    p = tenants.add_parser("set-quota", help="change a tenant's limits (0 keeps a limit)")
    p.add_argument("name")
    p.add_argument("--max-jobs", type=int, default=0)
    p.add_argument("--max-workers", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--max-gpus", type=int, default=0)
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_set_quota)
    p = tenants.add_parser("set-retention", help="how long a tenant's ended jobs are kept before deletion")
    p.add_argument("name")
    p.add_argument("--retention-days", type=int, required=True, help="delete ended jobs older than this (0 keeps them)")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_set_retention)
    p = tenants.add_parser("revoke-cert", help="refuse one certificate (hex serial) from now on")
    p.add_argument("serial")
    p.add_argument("--reason", default="")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_revoke_cert)
    for verb in ("reject", "suspend", "resume"):
        p = tenants.add_parser(verb, help=f"{verb} a tenant")
        p.add_argument("name")
        p.add_argument("--reason", default="")
        client_flags(p, "admin")
        p.set_defaults(func=_tenant_action(verb))

    keys = admin.add_parser("keys", help="tenants' checkpoint keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("rotate", help="new key version; re-wrap stored checkpoints without decrypting them")
    p.add_argument("--tenant", required=True)
    p.add_argument("--retire-unused", action="store_true", help="then destroy versions nothing uses any more")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_keys_rotate)

    scrapers = admin.add_parser("scrapers", help="Prometheus scrapers of /metrics").add_subparsers(
        dest="action", required=True
    )
    p = scrapers.add_parser("add", help="issue a scraper certificate into a new profile NAME (it reads /metrics only)")
    p.add_argument("name")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_scrapers_add)

    admin_jobs = admin.add_parser("jobs", help="jobs of every tenant").add_subparsers(dest="action", required=True)
    p = admin_jobs.add_parser("anomalies", help="updates a job's workers screened out")
    job_id_argument(p, "job_id")
    client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_anomalies)
    groups["admin"] = admin
