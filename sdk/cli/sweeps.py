"""``cantata sweeps``: hyperparameter sweeps whose trials are jobs."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from cantata.sdk.cli.common import CommandError, client_flags, command, open_client, show

COMMAND = "sweeps"
HELP = "hyperparameter sweeps: Optuna searches whose trials are jobs"


def _sweep_row(status) -> dict:

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
    with open_client(args) as client:
        status = client.sweeps.submit(Sweep.from_dict(loaded))
        if not args.watch:
            show(args, {"id": status.id}, [status.id])
            return 0
        status = client.sweeps.wait(status.id, on_change=None if args.json else print_progress)
    show(args, _sweep_row(status), trials_table(status) + [status.reason])
    return 0 if status.state == "SUCCEEDED" else 1


def cmd_sweeps_list(args) -> int:
    with open_client(args) as client:
        sweeps = client.sweeps.list()
    lines = [f"{s.id}  {s.name:<20} {s.state:<10} {s.trials_wanted} trials  {s.reason}".rstrip() for s in sweeps]
    show(args, [_sweep_row(s) for s in sweeps], lines or ["no sweeps"])
    return 0


def cmd_sweeps_show(args) -> int:
    from cantata.sdk.sweeps import print_progress, progress_line, trials_table

    with open_client(args) as client:
        if args.watch:
            status = client.sweeps.wait(args.sweep_id, on_change=None if args.json else print_progress)
        else:
            status = client.sweeps.get(args.sweep_id)
    best = f"best: trial {status.best.number} ({status.best.job_id})" if status.best else "best: none yet"
    show(args, _sweep_row(status), [progress_line(status), best, *trials_table(status)])
    return 0


def cmd_sweeps_cancel(args) -> int:
    with open_client(args) as client:
        status = client.sweeps.cancel(args.sweep_id)
    show(args, _sweep_row(status), [f"{status.id} {status.state}: {status.reason}"])
    return 0


def cmd_sweeps_plot(args) -> int:
    """The parallel-coordinates plot of the trials and their validation losses overlaid."""
    try:
        from cantata.sdk.plot import plot_metrics, plot_parallel_coordinates
    except ImportError as exc:
        raise CommandError(f"plotting needs matplotlib: pip install 'cantata[plot]' ({exc})") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open_client(args) as client:
        status = client.sweeps.get(args.sweep_id)
        jobs = {
            t.job_id: (client.jobs.get(t.job_id), client.jobs.metrics(t.job_id, ["val_loss"]))
            for t in status.trials
            if t.job_id
        }
    written = [plot_parallel_coordinates(status, out / f"{status.id}-parallel.png")]
    if jobs:
        written.append(plot_metrics(jobs, ["val_loss"], out / f"{status.id}-val_loss.png"))
    for path in written:
        print(f"wrote {path}")
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    sweeps = command(root, COMMAND, HELP)
    p = sweeps.add_parser("submit", help="submit a sweep from a YAML file (docs/user-guide.md#sweeps)")
    p.add_argument("file", help="sweep.yaml: name, job (job fields), parameters (field -> space), trials, ...")
    p.add_argument("--watch", action="store_true", help="show its progress until it ends, then the results")
    client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_submit)
    p = sweeps.add_parser("list", help="your sweeps")
    client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_list)
    p = sweeps.add_parser("show", help="a sweep's progress, best trial and results table")
    p.add_argument("sweep_id")
    p.add_argument("--watch", action="store_true", help="follow it to its end first")
    client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_show)
    p = sweeps.add_parser("cancel", help="end a sweep: its running trials' jobs are cancelled")
    p.add_argument("sweep_id")
    client_flags(p, None)
    p.set_defaults(func=cmd_sweeps_cancel)
    p = sweeps.add_parser("plot", help="parallel-coordinates and validation-loss PNGs of a sweep's trials")
    p.add_argument("sweep_id")
    p.add_argument("--out", default=".", help="folder for the PNGs (default: here)")
    client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_sweeps_plot)
