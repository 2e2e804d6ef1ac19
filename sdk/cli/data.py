"""``cantata data sources``: named S3 / Azure Blob credentials; ``data prepare|upload`` come from a plugin."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import asdict

from cantata.sdk.cli.common import CommandError, client_flags, command, open_client, show
from cantata.sdk.profiles import Profile

COMMAND = "data"
HELP = "tenant datasets: data sources, preparing and uploading shards"

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
    with open_client(args) as client:
        dataset_key = _profile_dataset_key(args.profile) if args.with_dataset_key else None
        source = client.data_sources.register(
            args.name,
            kind=args.kind,
            endpoint=endpoint,
            credentials=credentials,
            dataset_key=dataset_key,
            replace=args.replace,
        )
    show(args, asdict(source), [f"registered data source {_data_source_line(source)}"])
    return 0


def cmd_data_sources_list(args) -> int:
    with open_client(args) as client:
        sources = client.data_sources.list()
    show(args, [asdict(s) for s in sources], [_data_source_line(s) for s in sources] or ["no data sources"])
    return 0


def cmd_data_sources_rm(args) -> int:
    with open_client(args) as client:
        client.data_sources.delete(args.name)
    show(args, {"name": args.name, "deleted": True}, [f"deleted data source {args.name}"])
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    data_commands = command(root, COMMAND, HELP)
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
    client_flags(p, None)
    p.set_defaults(func=cmd_data_sources_add)
    p = sources.add_parser("list", help="your data sources (never their secrets)")
    client_flags(p, None)
    p.set_defaults(func=cmd_data_sources_list)
    p = sources.add_parser("rm", help="delete a data source")
    p.add_argument("name")
    client_flags(p, None)
    p.set_defaults(func=cmd_data_sources_rm)
