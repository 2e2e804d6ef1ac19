"""``cantata completion SHELL``: the shell completion script (argcomplete)."""

from __future__ import annotations

import argparse
import sys

COMMAND = "completion"
HELP = 'print the shell completion script: eval "$(cantata completion bash)"'


def cmd_completion(args) -> int:
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["cantata"], shell=args.shell))
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    p = root.add_parser("completion", help=HELP)
    p.add_argument("shell", choices=["bash", "zsh", "fish", "tcsh", "powershell"])
    p.set_defaults(func=cmd_completion)
