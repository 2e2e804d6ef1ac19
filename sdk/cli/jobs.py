"""``cantata jobs``: submit, follow, list, resume, delete, plot and export jobs."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cantata.sdk.cli.common import (
    CommandError,
    client_flags,
    command,
    job_id_argument,
    json_line,
    open_client,
    show,
    time_arg,
)

if TYPE_CHECKING:
    from cantata.sdk.job import Job

COMMAND = "jobs"
HELP = "training jobs"


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
        with open_client(args) as client:
            fields = client.jobs.check(job)
        lines = [f"{name}: {json.dumps(value)}" for name, value in fields.items()]
        show(args, fields, [f"# would run (nothing submitted): job {job.name!r} as the server checked it", *lines])
        return 0
    with open_client(args) as client:
        handle = client.jobs.submit(job)
        if not args.watch:
            show(args, {"id": handle.id}, [handle.id])
            return 0
        status = handle.wait(progress=not args.json)
    show(args, asdict(status), [_job_line(status)])
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_jobs_list(args) -> int:
    with open_client(args) as client:
        jobs = client.jobs.list(state=args.state or (), tag=args.tag or "", since=args.since)
    show(args, [asdict(j) for j in jobs], [_job_line(j) for j in jobs] or ["no jobs"])
    return 0


def cmd_jobs_delete(args) -> int:
    with open_client(args) as client:
        objects = client.jobs.delete(args.job_id)
    show(
        args,
        {"id": args.job_id, "deleted": True, "checkpoint_objects_deleted": objects},
        [f"deleted {args.job_id}: its records, logs and {objects} checkpoint objects"],
    )
    return 0


def cmd_jobs_status(args) -> int:
    with open_client(args) as client:
        job = client.jobs.get(args.job_id)
    show(args, asdict(job), [_job_line(job)])
    return 0


def cmd_jobs_watch(args) -> int:
    with open_client(args) as client:
        handle = client.jobs.handle(args.job_id)
        if args.json:
            for event in handle.events():
                json_line(asdict(event))
            status = handle.status()
        else:
            status = handle.wait(progress=True)
            print(_job_line(status))
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_jobs_cancel(args) -> int:
    with open_client(args) as client:
        job = client.jobs.cancel(args.job_id)
    show(args, asdict(job), [_job_line(job)])
    return 0


def cmd_jobs_resume(args) -> int:
    with open_client(args) as client:
        handle = client.jobs.resume(
            args.job_id,
            workers=args.workers,
            dp_replicate=args.dp_replicate,
            dp_shard=args.dp_shard,
            tp=args.tp,
            steps=args.steps,
        )
        if not args.watch:
            status = handle.status()
            show(args, asdict(status), [_job_line(status)])
            return 0
        status = handle.wait(progress=not args.json)
    show(args, asdict(status), [_job_line(status)])
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_jobs_plot(args) -> int:
    """Several jobs' curves overlaid, from their metrics history: a running job plots as far as it got."""
    try:
        from cantata.sdk.plot import plot_metrics
    except ImportError as exc:
        raise CommandError(f"plotting needs matplotlib: pip install 'cantata[plot]' ({exc})") from None

    names = args.metric or ["loss", "val_loss"]
    with open_client(args) as client:
        jobs = {
            job_id: (client.jobs.get(job_id), client.jobs.metrics(job_id, names))
            for job_id in dict.fromkeys(args.job_ids)
        }
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

    with open_client(args) as client:
        rows = client.jobs.metrics(args.job_id, args.name or (), args.since)
    out = Path(args.out) if args.out else None
    export(args.job_id, rows, args.format, out, sys.stdout)
    if out is not None:
        print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    return 0


def cmd_jobs_logs(args) -> int:
    """The workers' logs; ``--json``: one object per line, a JSON log record's keys under ``record``."""
    with open_client(args) as client:
        for worker, line in client.jobs.logs(args.job_id, follow=args.follow):
            if args.json:
                json_line({"worker": worker, "line": line, "record": _json_record(line)})
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


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    jobs = command(root, COMMAND, HELP)
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
    client_flags(p, None)
    p.set_defaults(func=cmd_jobs_submit)
    for verb, func, helptext in (
        ("status", cmd_jobs_status, "one job's state"),
        ("watch", cmd_jobs_watch, "follow a job live (progress bar)"),
        ("cancel", cmd_jobs_cancel, "cancel a job"),
    ):
        p = jobs.add_parser(verb, help=helptext)
        job_id_argument(p, "job_id")
        client_flags(p, None)
        p.set_defaults(func=func)
    p = jobs.add_parser("resume", help="resume a FAILED or CANCELLED job from its latest checkpoint, same id")
    job_id_argument(p, "job_id")
    p.add_argument("--watch", action="store_true", help="follow the job with a progress bar until it ends")
    for flag, what in (
        ("--workers", "workers on the new mesh"),
        ("--dp-shard", "the new mesh's FSDP2 shard ranks"),
        ("--tp", "the new mesh's tensor-parallel ranks"),
        ("--dp-replicate", "the new mesh's replicas"),
        ("--steps", "train further, to this many steps (a SUCCEEDED job too)"),
    ):
        p.add_argument(flag, type=int, default=0, help=f"{what} (default: unchanged)")
    client_flags(p, None)
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
    client_flags(p, None)
    p.set_defaults(func=cmd_jobs_list)
    p = jobs.add_parser("delete", help="delete an ended job: its records, logs and checkpoints")
    job_id_argument(p, "job_id")
    client_flags(p, None)
    p.set_defaults(func=cmd_jobs_delete)
    p = jobs.add_parser("plot", help="draw jobs' curves, overlaid, to a PNG (running jobs too)")
    job_id_argument(p, "job_ids", nargs="+", metavar="JOB")
    p.add_argument("--out", required=True)
    p.add_argument("--x", choices=("step", "time"), default="step", help="against step or wall-clock (minutes)")
    p.add_argument("--metric", action="append", help="a metric to draw (repeat; default: loss and val_loss)")
    client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_jobs_plot)
    p = jobs.add_parser("metrics", help="a job's metrics history as CSV, JSON or Parquet (for BI tools)")
    job_id_argument(p, "job_id")
    p.add_argument("--format", choices=("csv", "json", "parquet"), default="csv")
    p.add_argument("--out", help="write to this file (parquet needs one; default: stdout)")
    p.add_argument("--name", action="append", help="only this metric (repeat): loss, val_loss, lr, tokens_per_s ...")
    p.add_argument("--since", type=time_arg, help="only points recorded since (ISO 8601 or an age like 12h)")
    client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_jobs_metrics)
    p = jobs.add_parser("logs", help="the workers' logs: steps, evaluations, checkpoints, warnings")
    job_id_argument(p, "job_id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    client_flags(p, None, json_help="one JSON object per line: worker, line, and a JSON log record's keys")
    p.set_defaults(func=cmd_jobs_logs)


def _state_names() -> tuple[str, ...]:
    from cantata.proto.vocabulary import STATE_NAMES  # protobuf: loaded for `jobs list` only

    return STATE_NAMES
