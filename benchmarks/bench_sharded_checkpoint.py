"""Sharded sealed checkpoints (DCP, every rank sealing its own shards) against gathering full tensors on rank 0.

Four gloo processes shard one decoder over a 2 x 2 (dp_shard x tp) mesh,
take one AdamW step, then save and load the model and optimizer both ways in
one run, interleaved, into a local store, every object sealed:

- ``gathered`` (the format before sharded checkpoints): every rank gathers the
  full state dicts, rank 0 seals them as ``model`` and ``optim``, and every
  rank reads both back whole to take its shard;
- ``sharded``: the job's ``TrainingState`` with its ``SHARDED`` part: every
  rank seals its own DTensor shards through ``torch.distributed.checkpoint``
  and reads back only the chunks it needs.

Reported per case: the checkpoint time (the slowest rank), each rank's own
write time and sealed bytes, and the load time; the ratio gathered/sharded.

    .venv/bin/python benchmarks/bench_sharded_checkpoint.py            # ~21M parameters
    .venv/bin/python benchmarks/bench_sharded_checkpoint.py --quick    # ~3M parameters

Writes benchmarks/results/bench_sharded_checkpoint.json (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import harness  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from cantata.proto.vocabulary import MixedPrecision  # noqa: E402
from cantata.security.keys import JobKeys, LocalKeyring, MasterKey  # noqa: E402
from cantata.security.sealed_checkpoint import SHARDED_PART  # noqa: E402
from cantata.trainer.checkpoint import JobCheckpoints, Scope, TrainingState  # noqa: E402
from cantata.trainer.decoder import Decoder, DecoderConfig  # noqa: E402
from cantata.trainer.optim import build_optimizer  # noqa: E402
from cantata.trainer.parallel import MeshState, Parallelism, parallelize  # noqa: E402
from cantata.trainer.process_exit import exit_without_finalizing  # noqa: E402

WORLD = 4
SIZES = {  # dim, layers, ffn, vocabulary
    "full": (512, 4, 1536, 8192),
    "quick": (256, 2, 768, 2048),
}


def _config(quick: bool) -> DecoderConfig:
    dim, layers, ffn, vocab = SIZES["quick" if quick else "full"]
    return DecoderConfig(
        dim=dim,
        n_layers=layers,
        n_heads=8,
        n_kv_heads=4,
        head_dim=dim // 8,
        ffn_dim=ffn,
        vocab_size=vocab,
        block_size=64,
        rope_theta=10_000.0,
        norm_eps=1e-6,
        tie_embeddings=False,
        qk_norm=True,
    )


class _Gathered:
    """The format before sharded checkpoints: full tensors gathered on every rank, sealed by rank 0."""

    def __init__(self, model, optimizer, checkpoints: JobCheckpoints, rank: int):
        self.model, self.optimizer, self.checkpoints, self.rank = model, optimizer, checkpoints, rank
        self.options = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def save(self, step: int) -> None:
        self.checkpoints.begin(step, self.rank, dist.group.WORLD)
        model = get_model_state_dict(self.model, options=self.options)
        optim = get_optimizer_state_dict(self.model, self.optimizer.adamw, options=self.options)
        shards = {"model": model, "optim": {"adamw": optim, "step": 1, "lr": 1e-3}} if self.rank == 0 else {}
        self.checkpoints.commit(step, self.rank, shards, dist.group.WORLD, [])

    def load(self, step: int) -> None:
        listed = self.checkpoints.load(step)
        MeshState(self.model, self.optimizer).load_unsharded(listed)


def _rank(rank: int, port: int, store: str, keys: str, quick: bool, trials: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Decoder(_config(quick))
    parallelize(model, Parallelism(1, 2, 2).mesh(), MixedPrecision.FP32, checkpointing=False)
    optimizer = build_optimizer(model, "adamw", lr=1e-3)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(rank // 2))
    model(tokens[:, :-1], tokens[:, 1:])[1].backward()
    optimizer.step()
    checkpoints = JobCheckpoints(store, "tenant", "job", JobKeys.from_json(keys), keep_last=2)
    state = TrainingState(checkpoints, rank=rank, process=rank, group=dist.group.WORLD, commits=True)
    state.register(SHARDED_PART, Scope.SHARDED, MeshState(model, optimizer))
    gathered = _Gathered(model, optimizer, checkpoints, rank)
    step = iter(range(1, 10_000))

    def timed(save, load, sealed):
        def case(trial: int) -> dict:
            at = next(step)
            dist.barrier()
            began = time.perf_counter()
            save(at)
            own = time.perf_counter() - began
            dist.barrier()
            saved = time.perf_counter() - began
            began = time.perf_counter()
            load(at)
            dist.barrier()
            return {"save_s": saved, "own_write_s": own, "load_s": time.perf_counter() - began, "bytes": sealed(at)}

        return case

    def sharded_bytes(at: int) -> int:
        return checkpoints.last_sharded[1]

    def gathered_bytes(at: int) -> int:
        info = checkpoints.manifest(at)
        return sum(shard.sealed_size for shard in info.shards) if rank == 0 else 0

    cases = {
        "gathered": timed(gathered.save, gathered.load, gathered_bytes),
        "sharded": timed(state.save, state.restore, sharded_bytes),
    }
    samples = harness.interleave(cases, trials, warmup=1)
    everyone: list = [None] * WORLD
    dist.all_gather_object(everyone, samples)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())  # local shards: summed below over the mesh
        torch.save({"samples": everyone, "local_params": params}, out)
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=3)
    harness.add_output_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        ring = LocalKeyring(Path(scratch) / "keyring", MasterKey(os.urandom(32)))
        ring.ensure_tenant("tenant")
        keys = ring.job_keys("tenant", "job").to_json()
        store, out = f"file://{scratch}/store", str(Path(scratch) / "samples.pt")
        mp.start_processes(
            _rank,
            args=(_free_port(), store, keys, args.quick, args.trials, out),
            nprocs=WORLD,
            start_method="spawn",
        )
        collected = torch.load(out)
    per_rank = collected["samples"]
    parameters = sum(p.numel() for p in Decoder(_config(args.quick)).parameters())
    report: dict = {"quick": args.quick, "trials": args.trials, "world": WORLD, "mesh": "dp_shard 2 x tp 2"}
    report["parameters"] = parameters
    for case in ("gathered", "sharded"):
        trials = range(args.trials)
        report[case] = {
            "save_s": harness.median(max(r[case][t]["save_s"] for r in per_rank) for t in trials),
            "load_s": harness.median(max(r[case][t]["load_s"] for r in per_rank) for t in trials),
            "own_write_s_per_rank": [harness.median(r[case][t]["own_write_s"] for t in trials) for r in per_rank],
            "sealed_bytes_per_rank": [r[case][0]["bytes"] for r in per_rank],
        }
    report["ratio_save_gathered_over_sharded"] = report["gathered"]["save_s"] / report["sharded"]["save_s"]
    report["ratio_load_gathered_over_sharded"] = report["gathered"]["load_s"] / report["sharded"]["load_s"]
    path = harness.write_results("sharded_checkpoint", report, harness.output_dir(args.out, args.quick))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
