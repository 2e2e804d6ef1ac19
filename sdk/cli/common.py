"""What the command groups share: the client a command opens, its output, its common flags, completion."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cantata.sdk.profiles import default_profile, home

if TYPE_CHECKING:
    from cantata.sdk.client import Client

COMPLETION_TIMEOUT_S = 5.0  # a shell waits on a completion: job ids come from the server, or not at all


class CommandError(Exception):
    """A failure to report as one line and a non-zero exit."""


def open_client(args) -> Client:
    """The client of the command's ``--profile`` (the SDK loads when a command first talks to the server)."""
    from cantata.sdk.client import Client

    return Client.from_profile(args.profile)


def show(args, rows, text_lines) -> None:
    """``rows`` as JSON with ``--json``, else ``text_lines``."""
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2, default=str))
    else:
        for line in text_lines:
            print(line)


def json_line(row: Mapping[str, Any]) -> None:
    """One JSON object per line (streams: ``jobs watch --json``, ``jobs logs --json``)."""
    print(json.dumps(row, default=str), flush=True)


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


def command(root: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """Add the command ``name``; returns its sub-command set."""
    parser = root.add_parser(name, help=help)
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
            return [j.id for j in client.jobs.list() if j.id.startswith(prefix)]
    except (CantataError, OSError):
        return []


def job_id_argument(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    parser.add_argument(name, **kwargs).completer = complete_job_ids  # type: ignore[attr-defined]


def client_flags(
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
