"""The ``cantata`` command line: one module per command group, composed by :mod:`cantata.sdk.cli.app`.

Each group module (``tenant``, ``admin``, ``jobs``, ``checkpoints``,
``sweeps``, ``data``, ``webhooks``, ``profiles``, ``dashboard``,
``completion``; ``audit`` adds to the server plugin's ``audit``) holds its
command's parser (``build``) beside the handlers it runs, and talks to the
server through the SDK's resources. Commands that act on a server's own data
directory (``server``, ``audit``) or on local data files (``data prepare``,
``data upload``) are contributed by installed plugins (entry-point group
``cantata.cli``, each named after the command it adds to) that add to the
parsers in ``groups``, so the SDK does not import the server.

Start-up is kept short: the parser is built only for the command being run
(the others list their help), a plugin is imported only for its command, and
each command imports what it runs (the SDK client, YAML, the progress bar) —
``benchmarks/bench_cli.py`` measures it. Shell completion (argcomplete)
builds the whole tree.
Exit code 0 on success; non-zero with a one-line reason on failure.
"""

from cantata.sdk.cli.app import build_parser, main
from cantata.sdk.cli.common import CommandError
from cantata.sdk.cli.data import S3_ENV, cmd_data_sources_rm, data_source_credentials
from cantata.sdk.cli.jobs import _job_from_args

__all__ = [  # what code outside the package imports from cantata.sdk.cli
    "S3_ENV",
    "CommandError",
    "_job_from_args",
    "build_parser",
    "cmd_data_sources_rm",
    "data_source_credentials",
    "main",
]
