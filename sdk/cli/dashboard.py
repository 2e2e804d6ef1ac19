"""``cantata dashboard``: a one-time login link to the web dashboard."""

from __future__ import annotations

import argparse
import datetime as dt

from cantata.sdk.cli.common import CommandError, client_flags, open_client, show

COMMAND = "dashboard"
HELP = "a one-time link that signs your browser in to the web dashboard"


def cmd_dashboard(args) -> int:
    """``cantata dashboard``: print (and with ``--open``, open) a one-time login link."""
    with open_client(args) as client:
        login = client.dashboard.login()
    left = max(0, int((login.expires - dt.datetime.now(dt.UTC)).total_seconds()))
    show(
        args,
        {"url": login.url, "expires": login.expires.isoformat()},
        [login.url, f"(single use, valid for {left} s)"],
    )
    if args.open:
        import webbrowser

        if not webbrowser.open(login.url):
            raise CommandError("no browser could be opened here: open the link above yourself")
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    p = root.add_parser(
        "dashboard",
        help=HELP,
        description="Asks the server (over mutual TLS) for a login link bound to the profile's identity; "
        "it expires after a minute and works once. The browser then holds a session cookie.",
    )
    p.add_argument("--open", action="store_true", help="open the link in the default browser too")
    client_flags(p, None)
    p.set_defaults(func=cmd_dashboard)
