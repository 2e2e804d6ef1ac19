"""The ``cantata`` command line.

Client commands (tenant, admin tenants, jobs, checkpoints, data sources, webhooks,
profiles) live here and talk to the server through the SDK. Commands that act
on a server's own data directory (``server``, ``audit``) or on local data
files (``data prepare``, ``data upload``) are contributed by installed
plugins (entry-point group ``cantata.cli``, each named after the command it
adds to) that add to the parsers in ``groups``, so the SDK does not import
the server.

Start-up is kept short: the parser is built only for the command being run
(the others list their help), a plugin is imported only for its command, and
each command imports what it runs (the SDK client, YAML, the progress bar) —
``benchmarks/bench_cli.py`` measures it. Shell completion (argcomplete)
builds the whole tree.
Exit code 0 on success; non-zero with a one-line reason on failure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cantata.sdk.profiles import Profile, choose_default_profile, default_profile, home

if TYPE_CHECKING:
    from cantata.sdk.client import Client
    from cantata.sdk.job import Job

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as the shell reports a reader that stopped early
PLUGIN_GROUP = "cantata.cli"
COMPLETION_TIMEOUT_S = 5.0  # a shell waits on a completion: job ids come from the server, or not at all


class CommandError(Exception):
    """A failure to report as one line and a non-zero exit."""


def _client(args) -> Client:
    from cantata.sdk.client import Client

    return Client.from_profile(args.profile)


def _print(args, rows, text_lines) -> None:
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2, default=str))
    else:
        for line in text_lines:
            print(line)


def _json_line(row: Mapping[str, Any]) -> None:
    """One JSON object per line (streams: ``jobs watch --json``, ``jobs logs --json``)."""
    print(json.dumps(row, default=str), flush=True)


# ---- tenant -------------------------------------------------------------
def cmd_tenant_request(args) -> int:
    from cantata.sdk import enroll

    ca_pem = Path(args.ca_file).read_bytes()
    status = enroll.request_tenancy(args.name, args.server, ca_pem, args.enroll_server or "")
    _print(
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
    _print(args, asdict(status), lines)
    return 0


def cmd_tenant_renew(args) -> int:
    from cantata.sdk import enroll

    expires = enroll.renew_certificate(args.name)
    _print(
        args,
        {"name": args.name, "expires": expires},
        [f"renewed {args.name}: new key and certificate, valid until {expires}"],
    )
    return 0


# ---- admin tenants ------------------------------------------------------
def _tenant_line(t) -> str:
    cert = f"  cert {t.certificate_serial} until {t.certificate_expires[:10]}" if t.certificate_serial else ""
    return (
        f"{t.name:<20} {t.status:<10} jobs {t.running_jobs}/{t.max_concurrent_jobs or '-'}  "
        f"workers<={t.max_workers_per_job or '-'}  steps<={t.max_total_steps or '-'}  gpus<={t.max_gpus or '-'}  "
        f"{t.fingerprint}{cert}"
    )


def cmd_admin_list(args) -> int:
    with _client(args) as client:
        tenants = client.tenants(args.status.upper() if args.status else "")
    _print(args, [asdict(t) for t in tenants], [_tenant_line(t) for t in tenants] or ["no tenants"])
    return 0


def cmd_admin_approve(args) -> int:
    with _client(args) as client:
        t = client.approve_tenant(
            args.name,
            args.fingerprint,
            max_concurrent_jobs=args.max_jobs,
            max_workers_per_job=args.max_workers,
            max_total_steps=args.max_steps,
            max_gpus=args.max_gpus,
        )
    _print(args, asdict(t), [f"approved {t.name}: " + _tenant_line(t)])
    return 0


def cmd_admin_set_quota(args) -> int:
    with _client(args) as client:
        t = client.set_quota(
            args.name,
            max_concurrent_jobs=args.max_jobs,
            max_workers_per_job=args.max_workers,
            max_total_steps=args.max_steps,
            max_gpus=args.max_gpus,
        )
    _print(args, asdict(t), [f"quota of {t.name}: " + _tenant_line(t)])
    return 0


def cmd_admin_set_retention(args) -> int:
    with _client(args) as client:
        t = client.set_retention(args.name, args.retention_days)
    kept = f"{t.retention_days} days" if t.retention_days else "for ever"
    _print(args, asdict(t), [f"{t.name}: ended jobs are kept {kept}"])
    return 0


def cmd_admin_revoke_cert(args) -> int:
    with _client(args) as client:
        principal = client.revoke_certificate(args.serial, args.reason)
    _print(args, {"serial": args.serial, "principal": principal}, [f"revoked certificate {args.serial} of {principal}"])
    return 0


def cmd_admin_scrapers_add(args) -> int:
    from cantata.sdk import enroll

    profile, serial = enroll.add_scraper(args.profile, args.name)
    metrics = json.loads((profile.folder / "profile.json").read_text()).get("metrics_server", "")
    lines = [
        f"scraper {args.name!r}: certificate {serial} in profile {profile.folder}",
        f"/metrics: https://{metrics}/metrics" if metrics else "the server serves no /metrics: set metrics_listen",
    ]
    _print(args, {"name": args.name, "serial": serial, "profile": str(profile.folder), "metrics": metrics}, lines)
    return 0


def cmd_admin_keys_rotate(args) -> int:
    with _client(args) as client:
        r = client.rotate_tenant_key(args.tenant, retire_unused=args.retire_unused)
    retired = f"; retired versions {r.retired}" if r.retired else ""
    _print(
        args, asdict(r), [f"{args.tenant}: key version {r.version}, {r.objects_rewrapped} objects re-wrapped{retired}"]
    )
    return 0


def cmd_admin_anomalies(args) -> int:
    with _client(args) as client:
        found = client.anomalies(args.job_id)
    _print(
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
        with _client(args) as client:
            t = getattr(client, f"{verb}_tenant")(args.name, args.reason)
        _print(args, asdict(t), [f"{t.name}: now {t.status}"])
        return 0

    return run


# ---- jobs ---------------------------------------------------------------
def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--FIELD`` flag per job field of the table; a flag overrides the file."""
    from cantata.proto import jobfields
    from cantata.proto.vocabulary import Algorithm

    group = parser.add_argument_group("job fields", "each overrides the file's value; see docs/job-fields.md")
    for f in jobfields.FIELDS:
        notes = [f.default_text() if f.sdk_default is jobfields.REQUIRED else f"default: {f.default_text()}"]
        if f.choices is None and not f.prefixes and f.allowed_text():
            notes.append(f.allowed_text())
        if f.algorithms != frozenset(Algorithm):
            notes.append(f"{f.applies_text()} only")
        helptext = f"{f.help} ({'; '.join(notes)})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": helptext.replace("%", "%%")}
        if f.kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f.kind is tuple:  # a list: the flag once per item
            kwargs.update(action="append", metavar=f.flag.upper() or None)
        else:
            kwargs["type"] = f.kind
            if f.choices is not None:
                kwargs["choices"] = [c.value for c in f.choices]
        group.add_argument("--" + (f.flag or f.name).replace("_", "-"), **kwargs)


def _job_from_args(args) -> Job:
    import yaml

    from cantata.proto import jobfields
    from cantata.sdk.job import Job

    data = {}
    if args.file:
        try:
            loaded = yaml.safe_load(Path(args.file).read_text())
        except yaml.YAMLError as exc:
            raise CommandError(f"{args.file}: not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise CommandError(f"{args.file}: expected a mapping of job fields")
        data.update(loaded)
    data.update({f.name: getattr(args, f.name) for f in jobfields.FIELDS if getattr(args, f.name) is not None})
    if "name" not in data:
        raise CommandError("a job needs a name (--name or `name:` in the file)")
    return Job.from_dict(data)


def _job_line(j) -> str:
    if j.val_loss is not None:
        loss = f"val {j.val_loss:.4f}"
    else:
        loss = f"loss {j.loss:.4f}" if j.loss is not None else ""
    reason = f"  ({j.reason})" if j.reason else ""
    tags = f"  [{', '.join(j.tags)}]" if j.tags else ""
    return f"{j.id}  {j.name:<20} {j.state:<10} step {j.step}/{j.steps}  {loss}{reason}{tags}"


def cmd_jobs_submit(args) -> int:
    job = _job_from_args(args)
    if args.dry_run:
        if args.watch:
            raise CommandError("--dry-run submits nothing to --watch")
        with _client(args) as client:
            fields = client.check(job)
        lines = [f"{name}: {json.dumps(value)}" for name, value in fields.items()]
        _print(args, fields, [f"# would run (nothing submitted): job {job.name!r} as the server checked it", *lines])
        return 0
    with _client(args) as client:
        handle = client.submit(job)
        if not args.watch:
            _print(args, {"id": handle.id}, [handle.id])
            return 0
        status = handle.wait(progress=not args.json)
    _print(args, asdict(status), [_job_line(status)])
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_jobs_list(args) -> int:
    with _client(args) as client:
        jobs = client.list(state=args.state or (), tag=args.tag or "", since=args.since)
    _print(args, [asdict(j) for j in jobs], [_job_line(j) for j in jobs] or ["no jobs"])
    return 0


def cmd_jobs_delete(args) -> int:
    with _client(args) as client:
        objects = client.delete(args.job_id)
    _print(
        args,
        {"id": args.job_id, "deleted": True, "checkpoint_objects_deleted": objects},
        [f"deleted {args.job_id}: its records, logs and {objects} checkpoint objects"],
    )
    return 0


_AGO = re.compile(r"([0-9]+)([smhd])")
_AGO_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def time_arg(text: str) -> dt.datetime:
    """An ISO 8601 time (naive is UTC) or an age such as ``30m``, ``12h`` or ``7d`` (that long ago)."""
    ago = _AGO.fullmatch(text)
    if ago:
        return dt.datetime.now(dt.UTC) - dt.timedelta(**{_AGO_UNITS[ago[2]]: int(ago[1])})
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time or an age like 12h or 7d: {text!r}") from None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment


def cmd_jobs_status(args) -> int:
    with _client(args) as client:
        job = client.get(args.job_id)
    _print(args, asdict(job), [_job_line(job)])
    return 0


def cmd_jobs_watch(args) -> int:
    with _client(args) as client:
        handle = client.job(args.job_id)
        if args.json:
            for event in handle.events():
                _json_line(asdict(event))
            status = handle.status()
        else:
            status = handle.wait(progress=True)
            print(_job_line(status))
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_jobs_cancel(args) -> int:
    with _client(args) as client:
        job = client.cancel(args.job_id)
    _print(args, asdict(job), [_job_line(job)])
    return 0


def cmd_jobs_resume(args) -> int:
    with _client(args) as client:
        handle = client.resume(
            args.job_id,
            workers=args.workers,
            dp_replicate=args.dp_replicate,
            dp_shard=args.dp_shard,
            tp=args.tp,
            steps=args.steps,
        )
        if not args.watch:
            status = handle.status()
            _print(args, asdict(status), [_job_line(status)])
            return 0
        status = handle.wait(progress=not args.json)
    _print(args, asdict(status), [_job_line(status)])
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_jobs_plot(args) -> int:
    """Several jobs' curves overlaid, from their metrics history: a running job plots as far as it got."""
    try:
        from cantata.sdk.plot import plot_metrics
    except ImportError as exc:
        raise CommandError(f"plotting needs matplotlib: pip install 'cantata[plot]' ({exc})") from None

    names = args.metric or ["loss", "val_loss"]
    with _client(args) as client:
        jobs = {job_id: (client.get(job_id), client.metrics(job_id, names)) for job_id in dict.fromkeys(args.job_ids)}
    empty = [job_id for job_id, (_, rows) in jobs.items() if not rows]
    if len(empty) == len(jobs):
        raise CommandError(f"no {' or '.join(names)} recorded yet for {', '.join(empty)}")
    print(f"wrote {plot_metrics(jobs, names, Path(args.out), x=args.x)}")
    return 0


def cmd_jobs_metrics(args) -> int:
    """The job's metrics history as CSV, JSON or Parquet, to ``--out`` or stdout."""
    if args.format == "parquet":
        try:
            import pyarrow  # noqa: F401 (checked before the download, for a clear message)
        except ImportError:
            raise CommandError("--format parquet needs pyarrow: pip install 'cantata[parquet]'") from None
    from cantata.sdk.metrics_export import export

    with _client(args) as client:
        rows = client.metrics(args.job_id, args.name or (), args.since)
    out = Path(args.out) if args.out else None
    export(args.job_id, rows, args.format, out, sys.stdout)
    if out is not None:
        print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    return 0


def cmd_jobs_logs(args) -> int:
    """The workers' logs; ``--json``: one object per line, a JSON log record's keys under ``record``."""
    with _client(args) as client:
        for worker, line in client.logs(args.job_id, follow=args.follow):
            if args.json:
                _json_line({"worker": worker, "line": line, "record": _json_record(line)})
            else:
                print(f"[{worker}] {line}", flush=True)
    return 0


def _json_record(line: str) -> dict | None:
    """A worker's JSON log record (``CANTATA_LOG_FORMAT=json``), or None for a plain line."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


# ---- checkpoints --------------------------------------------------------
def cmd_checkpoints_list(args) -> int:
    with _client(args) as client:
        ckpts = client.checkpoints(args.job_id)
    _print(
        args,
        [asdict(c) for c in ckpts],
        [f"step {c.step:>8}  {c.size_bytes:>12,} bytes  {c.created}" for c in ckpts] or ["no checkpoints"],
    )
    return 0


def cmd_checkpoints_download(args) -> int:
    with _client(args) as client:
        path = client.download_checkpoint(
            args.job_id, args.step, args.out, format=args.format, consolidate=args.consolidate
        )
    print(f"wrote {path}")
    return 0


# ---- data sources -------------------------------------------------------
S3_ENV = {
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "region": "AWS_DEFAULT_REGION",
}
S3_REQUIRED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
AZURE_CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
AZURE_ACCOUNT_ENV = "AZURE_STORAGE_ACCOUNT"
AZURE_KEY_ENV = "AZURE_STORAGE_KEY"
AZURE_SAS_ENV = "AZURE_STORAGE_SAS_TOKEN"


def data_source_credentials(kind: str, environ: Mapping[str, str]) -> dict[str, str]:
    """A data source's secrets from the variables the AWS and Azure tools read: never from flags."""
    if kind == "s3":
        missing = [name for name in S3_REQUIRED_ENV if not environ.get(name)]
        if missing:
            raise CommandError(f"S3 credentials come from the environment: set {' and '.join(missing)}")
        return {field: environ[name] for field, name in S3_ENV.items() if environ.get(name)}
    if environ.get(AZURE_CONNECTION_STRING_ENV):
        return {"connection_string": environ[AZURE_CONNECTION_STRING_ENV]}
    if environ.get(AZURE_ACCOUNT_ENV) and environ.get(AZURE_KEY_ENV):
        return {"account_name": environ[AZURE_ACCOUNT_ENV], "account_key": environ[AZURE_KEY_ENV]}
    if environ.get(AZURE_SAS_ENV):
        return {"sas_token": environ[AZURE_SAS_ENV]}
    if environ.get(AZURE_ACCOUNT_ENV):
        raise CommandError(
            f"Azure credentials come from the environment: {AZURE_ACCOUNT_ENV} is set, "
            f"set {AZURE_KEY_ENV} or {AZURE_SAS_ENV}"
        )
    raise CommandError(
        f"Azure credentials come from the environment: set {AZURE_CONNECTION_STRING_ENV}, "
        f"or {AZURE_ACCOUNT_ENV} and {AZURE_KEY_ENV}, or {AZURE_SAS_ENV}"
    )


def _azure_account_url(environ: Mapping[str, str]) -> str:
    """The account's public blob endpoint, the Azure tools' default when only the account is named."""
    account = environ.get(AZURE_ACCOUNT_ENV)
    if environ.get(AZURE_CONNECTION_STRING_ENV) or not account:
        return ""
    return f"https://{account}.blob.core.windows.net"


def _profile_dataset_key(profile: str) -> bytes:
    """The tenant's dataset key: the one ``cantata data upload --encrypt`` seals shards with (made on first use)."""
    from cantata import dataset_key as key_file

    return key_file.load_or_create(Profile.named(profile).folder / key_file.KEY_FILE, tenant=profile)[1]


def _data_source_line(s) -> str:
    key = "  dataset key" if s.has_dataset_key else ""
    return f"{s.name:<24} {s.kind:<3} {s.endpoint or '-'}  {s.created}{key}"


def cmd_data_sources_add(args) -> int:
    credentials = data_source_credentials(args.kind, os.environ)
    endpoint = args.endpoint or (_azure_account_url(os.environ) if args.kind == "az" else "")
    with _client(args) as client:
        dataset_key = _profile_dataset_key(args.profile) if args.with_dataset_key else None
        source = client.register_data_source(
            args.name,
            kind=args.kind,
            endpoint=endpoint,
            credentials=credentials,
            dataset_key=dataset_key,
            replace=args.replace,
        )
    _print(args, asdict(source), [f"registered data source {_data_source_line(source)}"])
    return 0


def cmd_data_sources_list(args) -> int:
    with _client(args) as client:
        sources = client.data_sources()
    _print(args, [asdict(s) for s in sources], [_data_source_line(s) for s in sources] or ["no data sources"])
    return 0


def cmd_data_sources_rm(args) -> int:
    with _client(args) as client:
        client.delete_data_source(args.name)
    _print(args, {"name": args.name, "deleted": True}, [f"deleted data source {args.name}"])
    return 0


# ---- webhooks -----------------------------------------------------------
def _webhook_line(w) -> str:
    return f"{w.id}  {w.url}  {', '.join(w.event_types) or 'every event'}  {w.created}"


def cmd_webhooks_add(args) -> int:
    with _client(args) as client:
        webhook = client.webhooks.add(args.url, args.event, args.description)
    lines = [
        f"added webhook {_webhook_line(webhook)}",
        f"signing secret (shown once; receivers check Cantata-Signature with it): {webhook.secret}",
    ]
    _print(args, asdict(webhook), lines)
    return 0


def cmd_webhooks_list(args) -> int:
    with _client(args) as client:
        webhooks = client.webhooks.list()
    _print(args, [asdict(w) for w in webhooks], [_webhook_line(w) for w in webhooks] or ["no webhooks"])
    return 0


def cmd_webhooks_remove(args) -> int:
    with _client(args) as client:
        client.webhooks.remove(args.id)
    _print(args, {"id": args.id, "removed": True}, [f"removed webhook {args.id}"])
    return 0


def cmd_webhooks_deliveries(args) -> int:
    with _client(args) as client:
        deliveries = client.webhooks.deliveries(args.webhook, state=args.state, limit=args.limit)
    lines = [
        f"{d.id:>6} {d.webhook_id} {d.event_type:<14} {d.job_id} {d.state:<9} attempts {d.attempts}"
        + (f"  last: {d.last_error or d.last_status}" if d.attempts else "")
        for d in deliveries
    ]
    _print(args, [asdict(d) for d in deliveries], lines or ["no deliveries"])
    return 0


# ---- audit --------------------------------------------------------------
def cmd_audit_report_remote(args) -> int:
    """``cantata audit report --profile P``: a verified report from the server."""
    since = args.since.isoformat() if args.since else ""
    until = args.until.isoformat() if args.until else ""
    with _client(args) as client:
        report = client.audit_report(tenant=args.tenant or "", since=since, until=until, fmt=args.format)
    if args.out:
        Path(args.out).write_text(report.content, encoding="utf-8")
    else:
        sys.stdout.write(report.content)
    if not report.intact:
        raise CommandError(report.verdict)
    return 0


# ---- profiles -------------------------------------------------------------
def cmd_profile_list(args) -> int:
    root = home() / "profiles"
    names = sorted(p.name for p in root.iterdir() if (p / "profile.json").exists()) if root.is_dir() else []
    current = default_profile("")
    rows = []
    for name in names:
        profile = Profile.named(name)
        rows.append(
            {"name": name, "server": profile.server, "certificate": profile.cert.exists(), "default": name == current}
        )
    lines = [
        f"{'*' if r['default'] else ' '} {r['name']:<24} {r['server']:<24} {'' if r['certificate'] else '(no certificate yet)'}"
        for r in rows
    ]
    _print(args, rows, lines or [f"no profiles in {root}"])
    return 0


def cmd_profile_use(args) -> int:
    profile = Profile.named(args.name)
    if not profile.exists:
        raise CommandError(f"no profile {args.name!r} in {profile.folder.parent}")
    choose_default_profile(args.name)
    note = (
        f" (CANTATA_PROFILE={os.environ['CANTATA_PROFILE']} still overrides it)"
        if "CANTATA_PROFILE" in os.environ
        else ""
    )
    _print(args, {"default": args.name}, [f"default profile: {args.name}{note}"])
    return 0


def cmd_completion(args) -> int:
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["cantata"], shell=args.shell))
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
    with _client(args) as client:
        events = client.audit_events(
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
    _client_flags(p, None)
    p.set_defaults(func=cmd_audit_events)


# ---- sweeps -------------------------------------------------------------
def _sweep_row(status) -> dict:
    from dataclasses import asdict

    return asdict(status)


def cmd_sweeps_submit(args) -> int:
    import yaml

    from cantata.sdk.sweeps import Sweep, print_progress, trials_table

    try:
        loaded = yaml.safe_load(Path(args.file).read_text())
    except yaml.YAMLError as exc:
        raise CommandError(f"{args.file} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise CommandError(f"{args.file} must hold a mapping (name, job, parameters, trials, ...)")
    with _client(args) as client:
        status = client.sweeps.submit(Sweep.from_dict(loaded))
        if not args.watch:
            _print(args, {"id": status.id}, [status.id])
            return 0
        status = client.sweeps.wait(status.id, on_change=None if args.json else print_progress)
    _print(args, _sweep_row(status), trials_table(status) + [status.reason])
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_sweeps_list(args) -> int:
    with _client(args) as client:
        sweeps = client.sweeps.list()
    lines = [f"{s.id}  {s.name:<20} {s.state:<10} {s.trials_wanted} trials  {s.reason}".rstrip() for s in sweeps]
    _print(args, [_sweep_row(s) for s in sweeps], lines or ["no sweeps"])
    return 0


def cmd_sweeps_show(args) -> int:
    from cantata.sdk.sweeps import print_progress, progress_line, trials_table

    with _client(args) as client:
        if args.watch:
            status = client.sweeps.wait(args.sweep_id, on_change=None if args.json else print_progress)
        else:
            status = client.sweeps.get(args.sweep_id)
    best = f"best: trial {status.best.number} ({status.best.job_id})" if status.best else "best: none yet"
    _print(args, _sweep_row(status), [progress_line(status), best, *trials_table(status)])
    return 0


def cmd_sweeps_cancel(args) -> int:
    with _client(args) as client:
        status = client.sweeps.cancel(args.sweep_id)
    _print(args, _sweep_row(status), [f"{status.id} {status.state}: {status.reason}"])
    return 0


def cmd_sweeps_plot(args) -> int:
    """The parallel-coordinates plot of the trials and their validation losses overlaid."""
    try:
        from cantata.sdk.plot import plot_metrics, plot_parallel_coordinates
    except ImportError as exc:
        raise CommandError(f"plotting needs matplotlib: pip install 'cantata[plot]' ({exc})") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with _client(args) as client:
        status = client.sweeps.get(args.sweep_id)
        jobs = {
            t.job_id: (client.get(t.job_id), client.metrics(t.job_id, ["val_loss"])) for t in status.trials if t.job_id
        }
    written = [plot_parallel_coordinates(status, out / f"{status.id}-parallel.png")]
    if jobs:
        written.append(plot_metrics(jobs, ["val_loss"], out / f"{status.id}-val_loss.png"))
    for path in written:
        print(f"wrote {path}")
    return 0


# ---- parser -------------------------------------------------------------
COMMANDS = {  # the built-in commands and their help; plugins add to these and add their own
    "tenant": "enroll as a tenant",
    "admin": "platform administration",
    "jobs": "training jobs",
    "checkpoints": "a job's checkpoints",
    "sweeps": "hyperparameter sweeps: Optuna searches whose trials are jobs",
    "data": "tenant datasets: data sources, preparing and uploading shards",
    "webhooks": "HTTPS endpoints that receive your jobs' events, signed",
    "profile": "client profiles: list them, choose the default",
    "dashboard": "a one-time link that signs your browser in to the web dashboard",
    "completion": 'print the shell completion script: eval "$(cantata completion bash)"',
}


def _command(root: argparse._SubParsersAction, name: str, help: str = "") -> argparse._SubParsersAction:
    """Add the command ``name`` (help from ``COMMANDS``); returns its sub-command set."""
    parser = root.add_parser(name, help=help or COMMANDS[name])
    return parser.add_subparsers(dest="sub", required=True, metavar="COMMAND")


def complete_profiles(prefix: str = "", **_: Any) -> list[str]:
    """Shell completion: the profiles in $CANTATA_HOME."""
    folder = home() / "profiles"
    names = (p.name for p in folder.iterdir() if (p / "profile.json").exists()) if folder.is_dir() else ()
    return sorted(n for n in names if n.startswith(prefix))


def complete_job_ids(prefix: str = "", parsed_args: argparse.Namespace | None = None, **_: Any) -> list[str]:
    """Shell completion: the ids of the profile's jobs, asked of the server (none when it cannot be asked)."""
    profile = getattr(parsed_args, "profile", None)
    if not profile:
        return []
    from cantata.sdk.client import Client
    from cantata.sdk.errors import CantataError

    try:
        with Client.from_profile(profile, timeout=COMPLETION_TIMEOUT_S) as client:
            return [j.id for j in client.list() if j.id.startswith(prefix)]
    except (CantataError, OSError):
        return []


def _job_id_argument(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    parser.add_argument(name, **kwargs).completer = complete_job_ids  # type: ignore[attr-defined]


def _client_flags(
    parser: argparse.ArgumentParser, default: str | None, json_flag: bool = True, json_help: str = ""
) -> None:
    value = default_profile(default or "")
    flag = parser.add_argument(
        "--profile",
        default=value or None,
        required=not value,
        help="client profile (default: $CANTATA_PROFILE, else the one `cantata profile use` chose"
        + (f", else {default})" if default else ")"),
    )
    flag.completer = complete_profiles  # type: ignore[attr-defined]  # argcomplete's hook
    if json_flag or json_help:
        parser.add_argument("--json", action="store_true", help=json_help or "machine-readable output")


def _build_tenant(root: argparse._SubParsersAction, groups: dict) -> None:
    tenant = _command(root, "tenant")
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


def _build_admin(root: argparse._SubParsersAction, groups: dict) -> None:
    admin = _command(root, "admin")
    tenants = admin.add_parser("tenants", help="the tenant lifecycle").add_subparsers(dest="action", required=True)
    p = tenants.add_parser("list", help="tenants with their status, quotas and usage")
    p.add_argument("--status", help="only tenants with this status (pending, approved, suspended)")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_list)
    p = tenants.add_parser("approve", help="sign a pending request whose CSR fingerprint matches")
    p.add_argument("name")
    p.add_argument("--fingerprint", required=True, help="sha256:... as printed by `cantata tenant request`")
    p.add_argument("--max-jobs", type=int, default=0, help="concurrent jobs (0: server default)")
    p.add_argument("--max-workers", type=int, default=0, help="workers per job (0: server default)")
    p.add_argument("--max-steps", type=int, default=0, help="steps per job (0: server default)")
    p.add_argument("--max-gpus", type=int, default=0, help="GPUs of all unfinished jobs together (0: no limit)")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_approve)
    p = tenants.add_parser("set-quota", help="change a tenant's limits (0 keeps a limit)")
    p.add_argument("name")
    p.add_argument("--max-jobs", type=int, default=0)
    p.add_argument("--max-workers", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--max-gpus", type=int, default=0)
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_set_quota)
    p = tenants.add_parser("set-retention", help="how long a tenant's ended jobs are kept before deletion")
    p.add_argument("name")
    p.add_argument("--retention-days", type=int, required=True, help="delete ended jobs older than this (0 keeps them)")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_set_retention)
    p = tenants.add_parser("revoke-cert", help="refuse one certificate (hex serial) from now on")
    p.add_argument("serial")
    p.add_argument("--reason", default="")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_revoke_cert)
    for verb in ("reject", "suspend", "resume"):
        p = tenants.add_parser(verb, help=f"{verb} a tenant")
        p.add_argument("name")
        p.add_argument("--reason", default="")
        _client_flags(p, "admin")
        p.set_defaults(func=_tenant_action(verb))

    keys = admin.add_parser("keys", help="tenants' checkpoint keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("rotate", help="new key version; re-wrap stored checkpoints without decrypting them")
    p.add_argument("--tenant", required=True)
    p.add_argument("--retire-unused", action="store_true", help="then destroy versions nothing uses any more")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_keys_rotate)

    scrapers = admin.add_parser("scrapers", help="Prometheus scrapers of /metrics").add_subparsers(
        dest="action", required=True
    )
    p = scrapers.add_parser("add", help="issue a scraper certificate into a new profile NAME (it reads /metrics only)")
    p.add_argument("name")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_scrapers_add)

    admin_jobs = admin.add_parser("jobs", help="jobs of every tenant").add_subparsers(dest="action", required=True)
    p = admin_jobs.add_parser("anomalies", help="updates a job's workers screened out")
    _job_id_argument(p, "job_id")
    _client_flags(p, "admin")
    p.set_defaults(func=cmd_admin_anomalies)
    groups["admin"] = admin


def _build_jobs(root: argparse._SubParsersAction, groups: dict) -> None:
    jobs = _command(root, "jobs")
    p = jobs.add_parser(
        "submit",
        help="submit a job from a YAML file and/or flags",
        description="Submit a job. Fields come from a job.yaml file (examples/ holds one per algorithm; "
        "docs/job-fields.md lists every field) and/or --FIELD flags, which override the file.",
    )
    p.add_argument("file", nargs="?", help="job.yaml: a mapping of job fields (unknown keys are refused)")
    if groups.get("sub") in (None, "submit"):
        _add_job_flags(p)
    p.add_argument("--watch", action="store_true", help="follow the job with a progress bar until it ends")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="have the server check the job as a submission (fields, defaults, data sources, quotas) and print "
        "every field as it would run; submit nothing",
    )
    _client_flags(p, None)
    p.set_defaults(func=cmd_jobs_submit)
    for verb, func, helptext in (
        ("status", cmd_jobs_status, "one job's state"),
        ("watch", cmd_jobs_watch, "follow a job live (progress bar)"),
        ("cancel", cmd_jobs_cancel, "cancel a job"),
    ):
        p = jobs.add_parser(verb, help=helptext)
        _job_id_argument(p, "job_id")
        _client_flags(p, None)
        p.set_defaults(func=func)
    p = jobs.add_parser("resume", help="resume a FAILED or CANCELLED job from its latest checkpoint, same id")
    _job_id_argument(p, "job_id")
    p.add_argument("--watch", action="store_true", help="follow the job with a progress bar until it ends")
    for flag, what in (
        ("--workers", "workers on the new mesh"),
        ("--dp-shard", "the new mesh's FSDP2 shard ranks"),
        ("--tp", "the new mesh's tensor-parallel ranks"),
        ("--dp-replicate", "the new mesh's replicas"),
        ("--steps", "train further, to this many steps (a SUCCEEDED job too)"),
    ):
        p.add_argument(flag, type=int, default=0, help=f"{what} (default: unchanged)")
    _client_flags(p, None)
    p.set_defaults(func=cmd_jobs_resume)
    p = jobs.add_parser("list", help="your jobs, filtered by the server")
    p.add_argument(
        "--state",
        action="append",
        type=str.upper,
        choices=_state_names() if groups.get("sub") in (None, "list") else None,
        help="only jobs in this state (repeat for any of several)",
    )
    p.add_argument("--tag", help="only jobs carrying this tag")
    p.add_argument("--since", type=time_arg, help="only jobs created since (ISO 8601 or an age like 12h, 7d)")
    _client_flags(p, None)
    p.set_defaults(func=cmd_jobs_list)
    p = jobs.add_parser("delete", help="delete an ended job: its records, logs and checkpoints")
    _job_id_argument(p, "job_id")
    _client_flags(p, None)
    p.set_defaults(func=cmd_jobs_delete)
    p = jobs.add_parser("plot", help="draw jobs' curves, overlaid, to a PNG (running jobs too)")
    _job_id_argument(p, "job_ids", nargs="+", metavar="JOB")
    p.add_argument("--out", required=True)
    p.add_argument("--x", choices=("step", "time"), default="step", help="against step or wall-clock (minutes)")
    p.add_argument("--metric", action="append", help="a metric to draw (repeat; default: loss and val_loss)")
    _client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_jobs_plot)
    p = jobs.add_parser("metrics", help="a job's metrics history as CSV, JSON or Parquet (for BI tools)")
    _job_id_argument(p, "job_id")
    p.add_argument("--format", choices=("csv", "json", "parquet"), default="csv")
    p.add_argument("--out", help="write to this file (parquet needs one; default: stdout)")
    p.add_argument("--name", action="append", help="only this metric (repeat): loss, val_loss, lr, tokens_per_s ...")
    p.add_argument("--since", type=time_arg, help="only points recorded since (ISO 8601 or an age like 12h)")
    _client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_jobs_metrics)
    p = jobs.add_parser("logs", help="the workers' logs: steps, evaluations, checkpoints, warnings")
    _job_id_argument(p, "job_id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    _client_flags(p, None, json_help="one JSON object per line: worker, line, and a JSON log record's keys")
    p.set_defaults(func=cmd_jobs_logs)


def _state_names() -> tuple[str, ...]:
    from cantata.proto.vocabulary import STATE_NAMES  # protobuf: loaded for `jobs list` only

    return STATE_NAMES


def _build_checkpoints(root: argparse._SubParsersAction, groups: dict) -> None:
    ckpts = _command(root, "checkpoints")
    p = ckpts.add_parser("list", help="list checkpoints")
    _job_id_argument(p, "job_id")
    _client_flags(p, None)
    p.set_defaults(func=cmd_checkpoints_list)
    p = ckpts.add_parser("download", help="download a checkpoint's model state")
    _job_id_argument(p, "job_id")
    p.add_argument("step", type=int, nargs="?", help="the checkpoint's step (default: the latest)")
    p.add_argument("--out", required=True, help="a file (torch) or a directory (safetensors, hf)")
    p.add_argument(
        "--format",
        choices=["torch", "safetensors", "hf"],
        default="torch",
        help="torch: the state dict as saved; safetensors: OUT/model.safetensors + OUT/config.json, "
        "loadable without Cantata; hf: a Hugging Face Llama/Qwen3 folder that transformers' "
        "from_pretrained loads (both need torch and safetensors here)",
    )
    p.add_argument(
        "--consolidate",
        action="store_true",
        help="join a mesh job's sharded checkpoint into one OUT/model.safetensors of full tensors "
        "(--format safetensors unless hf is given; needs torch and safetensors here)",
    )
    _client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_checkpoints_download)


def _build_data(root: argparse._SubParsersAction, groups: dict) -> None:
    data_commands = _command(root, "data")
    groups["data"] = data_commands
    sources = data_commands.add_parser(
        "sources", help="named S3 / Azure Blob credentials your jobs read datasets with"
    ).add_subparsers(dest="action", required=True)
    p = sources.add_parser(
        "add",
        help="register a data source; secrets come from the environment",
        description="Secrets are read from the environment, never from flags. S3: "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN and "
        "AWS_DEFAULT_REGION. Azure: AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT "
        "and AZURE_STORAGE_KEY, or AZURE_STORAGE_SAS_TOKEN.",
    )
    p.add_argument("name", help="the name jobs use: s3://NAME@bucket/prefix or az://NAME@container/prefix")
    p.add_argument("--kind", required=True, choices=["s3", "az"])
    p.add_argument(
        "--endpoint",
        default="",
        help="S3-compatible endpoint URL, or the Azure account URL "
        "(default: AWS S3; https://$AZURE_STORAGE_ACCOUNT.blob.core.windows.net)",
    )
    p.add_argument(
        "--with-dataset-key",
        action="store_true",
        help="also send your profile's dataset key, so jobs can read shards uploaded with --encrypt",
    )
    p.add_argument("--replace", action="store_true", help="overwrite a data source of the same name")
    _client_flags(p, None)
    p.set_defaults(func=cmd_data_sources_add)
    p = sources.add_parser("list", help="your data sources (never their secrets)")
    _client_flags(p, None)
    p.set_defaults(func=cmd_data_sources_list)
    p = sources.add_parser("rm", help="delete a data source")
    p.add_argument("name")
    _client_flags(p, None)
    p.set_defaults(func=cmd_data_sources_rm)


def _build_webhooks(root: argparse._SubParsersAction, groups: dict) -> None:
    webhooks = _command(root, "webhooks")
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
    _client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_add)
    p = webhooks.add_parser("list", help="your webhooks (never their secrets)")
    _client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_list)
    p = webhooks.add_parser("remove", help="remove a webhook; its pending deliveries are dropped")
    p.add_argument("id")
    _client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_remove)
    p = webhooks.add_parser("deliveries", help="recent deliveries, with their attempts and last error")
    p.add_argument("--webhook", default="", metavar="ID", help="of this webhook only")
    p.add_argument("--state", default="", choices=["", "pending", "delivered", "dead"])
    p.add_argument("--limit", type=int, default=100)
    _client_flags(p, None)
    p.set_defaults(func=cmd_webhooks_deliveries)


def _build_profile(root: argparse._SubParsersAction, groups: dict) -> None:
    profile = _command(root, "profile")
    p = profile.add_parser("list", help="the profiles in $CANTATA_HOME (default ~/.cantata); * marks the default")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profile_list)
    p = profile.add_parser("use", help="make a profile the default of every command ($CANTATA_PROFILE overrides it)")
    p.add_argument("name").completer = complete_profiles
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profile_use)


def cmd_dashboard(args) -> int:
    """``cantata dashboard``: print (and with ``--open``, open) a one-time login link."""
    with _client(args) as client:
        login = client.dashboard_login()
    left = max(0, int((login.expires - dt.datetime.now(dt.UTC)).total_seconds()))
    _print(
        args,
        {"url": login.url, "expires": login.expires.isoformat()},
        [login.url, f"(single use, valid for {left} s)"],
    )
    if args.open:
        import webbrowser

        if not webbrowser.open(login.url):
            raise CommandError("no browser could be opened here: open the link above yourself")
    return 0


def _build_dashboard(root: argparse._SubParsersAction, groups: dict) -> None:
    p = root.add_parser(
        "dashboard",
        help=COMMANDS["dashboard"],
        description="Asks the server (over mutual TLS) for a login link bound to the profile's identity; "
        "it expires after a minute and works once. The browser then holds a session cookie.",
    )
    p.add_argument("--open", action="store_true", help="open the link in the default browser too")
    _client_flags(p, None)
    p.set_defaults(func=cmd_dashboard)


def _build_completion(root: argparse._SubParsersAction, groups: dict) -> None:
    p = root.add_parser("completion", help=COMMANDS["completion"])
    p.add_argument("shell", choices=["bash", "zsh", "fish", "tcsh", "powershell"])
    p.set_defaults(func=cmd_completion)


def _build_sweeps(root: argparse._SubParsersAction, groups: dict) -> None:
    sweeps = _command(root, "sweeps")
    p = sweeps.add_parser("submit", help="submit a sweep from a YAML file (docs/user-guide.md#sweeps)")
    p.add_argument("file", help="sweep.yaml: name, job (job fields), parameters (field -> space), trials, ...")
    p.add_argument("--watch", action="store_true", help="show its progress until it ends, then the results")
    _client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_submit)
    p = sweeps.add_parser("list", help="your sweeps")
    _client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_list)
    p = sweeps.add_parser("show", help="a sweep's progress, best trial and results table")
    p.add_argument("sweep_id")
    p.add_argument("--watch", action="store_true", help="follow it to its end first")
    _client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_show)
    p = sweeps.add_parser("cancel", help="end a sweep: its running trials' jobs are cancelled")
    p.add_argument("sweep_id")
    _client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_cancel)
    p = sweeps.add_parser("plot", help="parallel-coordinates and validation-loss PNGs of a sweep's trials")
    p.add_argument("sweep_id")
    p.add_argument("--out", default=".", help="folder for the PNGs (default: here)")
    _client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_sweeps_plot)


BUILDERS = {
    "tenant": _build_tenant,
    "admin": _build_admin,
    "jobs": _build_jobs,
    "checkpoints": _build_checkpoints,
    "sweeps": _build_sweeps,
    "data": _build_data,
    "webhooks": _build_webhooks,
    "profile": _build_profile,
    "dashboard": _build_dashboard,
    "completion": _build_completion,
}


class _Version(argparse.Action):
    """``--version``: reads the installed distribution's metadata only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import cantata

        print(f"cantata {cantata.__version__}")
        parser.exit()


def _plugins() -> dict[str, list]:
    """The installed plugins' entry points, by the command each adds to."""
    from importlib.metadata import entry_points

    found: dict[str, list] = {}
    for plugin in entry_points(group=PLUGIN_GROUP):
        found.setdefault(plugin.name, []).append(plugin)
    return found


def build_parser(command: str | None = None, sub: str | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The ``cantata`` parser and its sub-command sets (``groups``).

    With ``command`` only that command is built in full, with its plugins; the
    others are listed (with their help when ``command`` is "": what ``cantata
    --help`` shows). With ``sub`` too, a builder may leave out what only its
    other sub-commands need (the job-field flags of ``jobs submit``). Without
    ``command``, every command is built (shell completion, tests).
    """
    parser = argparse.ArgumentParser(prog="cantata", description="Cantata: secure multi-tenant training")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    root = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, Any] = {
        "root": root,
        "remote_audit_report": cmd_audit_report_remote,
        "audit_events": add_audit_events,
        "sub": sub,
    }
    plugins = _plugins()
    listing = command == "" or (command is not None and command not in BUILDERS and command not in plugins)
    for name in sorted(
        set(BUILDERS) | set(plugins), key=lambda n: (n not in BUILDERS, list(BUILDERS).index(n) if n in BUILDERS else n)
    ):
        if command is not None and name != command:
            listed = COMMANDS.get(name) or (_plugin_help(plugins[name]) if listing else "")
            root.add_parser(name, help=listed, add_help=False)
            continue
        if name in BUILDERS:
            BUILDERS[name](root, groups)
        for plugin in plugins.get(name, ()):
            plugin.load()(groups)
    return parser, groups


def _plugin_help(entries: list) -> str:
    """A plugin command's help, from its module's ``COMMAND_HELP`` (a module that is cheap to import)."""
    import importlib

    for entry in entries:
        text = getattr(importlib.import_module(entry.module), "COMMAND_HELP", {}).get(entry.name)
        if text:
            return text
    return ""


def _command_words(argv: list[str]) -> tuple[str, str | None]:
    """The command and sub-command ``argv`` runs (its first words that are not options): "" when none."""
    words = [arg for arg in argv if not arg.startswith("-")][:2]
    return (words[0] if words else ""), (words[1] if len(words) > 1 else None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    completing = "_ARGCOMPLETE" in os.environ
    parser, _ = build_parser(*((None, None) if completing else _command_words(argv)))
    if completing:
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`cantata jobs watch J --json | head`): stop quietly, as `yes | head` does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("cantata: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        print(f"cantata: error: {_missing_extra(exc, args.command)}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"cantata: error: {_one_line(exc)}{_admin_hint(args, exc)}", file=sys.stderr)
        return 1


EXTRAS = {  # a module that only an extra installs -> the extra (pyproject.toml)
    "torch": "trainer",
    "numpy": "trainer",
    "xxhash": "trainer",
    "zlib_ng": "trainer",
    "grpc_health": "server",
    "boto3": "s3",
    "botocore": "s3",
    "azure": "azure",
    "matplotlib": "plot",
    "pyarrow": "parquet",
}


def _missing_extra(exc: ModuleNotFoundError, command: str) -> str:
    """What to install for a command whose library is missing (the base install is the SDK and the CLI only)."""
    module = (exc.name or "").partition(".")[0]
    extra = "server" if command in ("server", "audit") else EXTRAS.get(module)
    if extra is None:
        raise exc
    return f"`cantata {command}` needs {module}, which the base install leaves out: pip install 'cantata[{extra}]'"


def _admin_hint(args, exc: Exception) -> str:
    """For an admin command refused under another profile: which profile to use instead."""
    profile = getattr(args, "profile", None)
    if args.command != "admin" or not profile or profile == "admin" or "cantata.sdk.errors" not in sys.modules:
        return ""
    from cantata.sdk.errors import PermissionDenied

    if not isinstance(exc, PermissionDenied):
        return ""
    return f" (`cantata admin` needs an admin's profile, not {profile!r}: run it with --profile admin)"


def _one_line(exc: Exception) -> str:
    """The one-line reason for a failed command; anything unexpected propagates with its traceback."""
    if "cantata.sdk.errors" in sys.modules:  # an SDK error can only come from a loaded SDK
        from cantata.sdk.errors import CantataError

        if isinstance(exc, CantataError):
            rid = f" [request {exc.request_id}]" if exc.request_id and exc.request_id not in exc.message else ""
            return f"{type(exc).__name__}: {exc.message}{rid}"
    if isinstance(exc, (CommandError, OSError, ValueError)):
        return str(exc)
    raise exc


if __name__ == "__main__":
    sys.exit(main())
