"""``cantata checkpoints``: list and download a job's checkpoints."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from cantata.sdk.cli.common import client_flags, command, job_id_argument, open_client, show

COMMAND = "checkpoints"
HELP = "a job's checkpoints"


def cmd_checkpoints_list(args) -> int:
    with open_client(args) as client:
        ckpts = client.checkpoints.list(args.job_id)
    show(
        args,
        [asdict(c) for c in ckpts],
        [f"step {c.step:>8}  {c.size_bytes:>12,} bytes  {c.created}" for c in ckpts] or ["no checkpoints"],
    )
    return 0


def cmd_checkpoints_download(args) -> int:
    with open_client(args) as client:
        path = client.checkpoints.download(
            args.job_id, args.step, args.out, format=args.format, consolidate=args.consolidate
        )
    print(f"wrote {path}")
    return 0


def build(root: argparse._SubParsersAction, groups: dict) -> None:
    ckpts = command(root, COMMAND, HELP)
    p = ckpts.add_parser("list", help="list checkpoints")
    job_id_argument(p, "job_id")
    client_flags(p, None)
    p.set_defaults(func=cmd_checkpoints_list)
    p = ckpts.add_parser("download", help="download a checkpoint's model state")
    job_id_argument(p, "job_id")
    p.add_argument("step", type=int, nargs="?", help="the checkpoint's step (default: the latest)")
    p.add_argument("--out", required=True, help="a file (torch) or a directory (safetensors, hf)")
    p.add_argument(
        "--format",
        choices=["torch", "safetensors", "hf"],
        default="torch",
        help="torch: the state dict as saved; safetensors: OUT/model.safetensors + OUT/config.json, "
        "loadable without Cantata; hf: a Hugging Face Llama/Qwen3 folder that transformers' "
        "from_pretrained loads (both need torch and safetensors here)",
    )
    p.add_argument(
        "--consolidate",
        action="store_true",
        help="join a mesh job's sharded checkpoint into one OUT/model.safetensors of full tensors "
        "(--format safetensors unless hf is given; needs torch and safetensors here)",
    )
    client_flags(p, None, json_flag=False)
    p.set_defaults(func=cmd_checkpoints_download)
