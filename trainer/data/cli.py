"""``cantata data prepare|upload``: a plugin (entry-point group ``cantata.cli``) adding to the CLI's ``data`` group.

The CLI imports this module only for ``cantata data ...``, and building the
parser imports neither numpy nor torch: ``prepare`` and ``upload`` import what
they run (``data sources`` stays a fast, server-only command).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cantata.proto.vocabulary import Utf8Policy
from cantata.storage import uri as stores

TOKEN_DTYPES = ("uint16", "uint32")  # the names of shards.DTYPES (tests/test_cli_startup.py checks they agree)
DEFAULT_SHARD_TOKENS = 1 << 22  # prepare.DEFAULT_SHARD_TOKENS (checked likewise)

UPLOAD_JOBS = 4  # shards (and parts of each) uploaded at once; upload.py is imported only when it runs


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_prepare(args) -> int:
    from cantata.trainer.data.prepare import prepare_shards
    from cantata.trainer.data.shards import dtype_for
    from cantata.trainer.data.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.from_file(Path(args.tokenizer)) if args.tokenizer else None
    result = prepare_shards(
        Path(args.source),
        Path(args.out),
        dtype=dtype_for(args.dtype),
        shard_tokens=args.shard_tokens,
        utf8_policy=Utf8Policy(args.on_bad_utf8),
        warn=lambda message: _say(f"warning: {message}"),
        progress=_say if not args.json else lambda message: None,
        tokenizer=tokenizer,
    )
    summary: dict[str, object] = {
        "shards": [str(p) for p in result.shards],
        "tokens": result.tokens,
        "files": result.files,
    }
    if result.tokenizer is not None:  # what a job training on these shards names
        summary.update(tokenizer=result.tokenizer.name, tokenizer_vocab=result.tokenizer.vocab_size)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"wrote {len(result.shards)} shards ({result.tokens:,} tokens from {result.files} files) to {args.out}")
        if result.tokenizer is not None:
            print(f"tokenizer {result.tokenizer.name} (vocabulary {result.tokenizer.vocab_size}): give both to the job")
    return 0


def store_options(uri: str, endpoint: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """How to reach ``uri``'s store at ``endpoint``, as ``cantata data sources add --endpoint`` names it.

    S3: an S3-compatible endpoint URL. Azure: the account URL, with the account key or SAS
    token from the environment the Azure tools read (a connection string names its own endpoint).
    """
    if not endpoint:
        return {}
    scheme = stores.SCHEMES.get(stores.scheme_of(uri))
    if scheme is not None and scheme.endpoint is not None:
        return scheme.endpoint(endpoint, environ)
    raise ValueError(f"--endpoint is for s3:// and az:// stores, not {uri!r}")


def cmd_upload(args) -> int:
    from tqdm import tqdm

    from cantata.storage import open_store
    from cantata.trainer.data.sealing import KEY_FILE, DatasetKey
    from cantata.trainer.data.sources import translated_store_errors
    from cantata.trainer.data.upload import shard_files, upload_shards

    dataset_key = None
    if args.encrypt:
        from cantata.sdk.profiles import Profile  # the tenant's profile holds its dataset key

        if not args.profile:
            raise ValueError("--encrypt needs --profile (the tenant whose dataset key seals the shards)")
        profile = Profile.named(args.profile)
        if not profile.folder.is_dir():
            raise ValueError(f"no profile {args.profile!r} in {profile.folder.parent}")
        dataset_key = DatasetKey.load_or_create(profile.folder / KEY_FILE, tenant=args.profile)
    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    options = store_options(args.store, args.endpoint, os.environ)
    if not args.store.startswith("file:"):
        options["max_concurrency"] = args.jobs  # parts of each shard, too
    with translated_store_errors(f"opening {args.store}"):
        store = open_store(args.store, **options)
    directory = Path(args.directory)
    total = sum(path.stat().st_size for path in shard_files(directory))
    # One bar for the whole upload, drawn only on a terminal (and never with --json).
    with tqdm(
        total=total, unit="B", unit_scale=True, desc="upload", disable=args.json or not sys.stderr.isatty()
    ) as bar:
        keys = upload_shards(directory, store, dataset_key=dataset_key, jobs=args.jobs, on_bytes=bar.update)
    if args.json:
        summary = {"store": store.uri, "keys": keys, "encrypted": args.encrypt, "bytes": total}
        print(json.dumps(summary, indent=2))
    else:
        print(f"uploaded {len(keys)} {'encrypted ' if args.encrypt else ''}shards ({total:,} bytes) to {store.uri}")
    return 0


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    data = groups["data"]
    p = data.add_parser("prepare", help="tokenize *.txt / *.jsonl text into token shards")
    p.add_argument("source", help="a text file or a directory of them")
    p.add_argument("--out", required=True, help="directory for the shards (must hold none yet)")
    p.add_argument("--dtype", choices=TOKEN_DTYPES, default="uint16", help="token width (default uint16)")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    p.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="a tokenizer.json (Hugging Face tokenizers) to encode with, recorded in every shard; default: UTF-8 bytes",
    )
    p.add_argument(
        "--on-bad-utf8",
        choices=[p.value for p in Utf8Policy],
        default=Utf8Policy.FAIL.value,
        help="skip (with a warning) or fail on text that is not UTF-8 (default fail)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_prepare)
    p = data.add_parser("upload", help="copy shards to file://, s3:// or az:// (credentials from the environment)")
    p.add_argument("directory", help="the directory `cantata data prepare` wrote")
    p.add_argument("--store", required=True, help="file:///dir, s3://bucket/prefix or az://container/prefix")
    p.add_argument(
        "--endpoint",
        default="",
        help="S3-compatible endpoint URL, or the Azure account URL (as for `cantata data sources add`; "
        "default: AWS S3, or the account of $AZURE_STORAGE_CONNECTION_STRING)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=UPLOAD_JOBS,
        help=f"shards uploaded at once, and parts of each shard (default {UPLOAD_JOBS})",
    )
    p.add_argument("--encrypt", action="store_true", help="seal each shard with the tenant's dataset key")
    p.add_argument("--profile", help="tenant profile holding the dataset key (made on first use)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_upload)
