"""``cantata profile``: list the client profiles and choose the default."""

from __future__ import annotations

import argparse
import os

from cantata.sdk.cli.common import CommandError, command, complete_profiles, show
from cantata.sdk.profiles import Profile, choose_default_profile, default_profile, home

COMMAND = "profile"
HELP = "client profiles: list them, choose the default"


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
    show(args, rows, lines or [f"no profiles in {root}"])
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
    show(args, {"default": args.name}, [f"default profile: {args.name}{note}"])
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    profile = command(root, COMMAND, HELP)
    p = profile.add_parser("list", help="the profiles in $CANTATA_HOME (default ~/.cantata); * marks the default")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profile_list)
    p = profile.add_parser("use", help="make a profile the default of every command ($CANTATA_PROFILE overrides it)")
    p.add_argument("name").completer = complete_profiles
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profile_use)
