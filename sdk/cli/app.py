"""The ``cantata`` parser, composed of the command groups and the installed plugins, and ``main``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cantata.sdk.cli import admin, checkpoints, completion, dashboard, data, jobs, profiles, sweeps, tenant, webhooks
from cantata.sdk.cli.audit import add_audit_events, cmd_audit_report_remote
from cantata.sdk.cli.common import CommandError

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as the shell reports a reader that stopped early
PLUGIN_GROUP = "cantata.cli"
# The built-in command groups in the order `cantata --help` lists them; plugins add to these and add their own.
GROUPS = (tenant, admin, jobs, checkpoints, sweeps, data, webhooks, profiles, dashboard, completion)
BUILDERS = {group.COMMAND: group.build for group in GROUPS}
COMMANDS = {group.COMMAND: group.HELP for group in GROUPS}


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
