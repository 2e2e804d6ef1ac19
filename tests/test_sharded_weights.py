"""``init_from`` on a mesh: each rank reads the header and only its shard's rows of each tensor, from a local file or S3.

Two real gloo processes (dp_shard = 2) load qwen3-tiny weights through
:func:`load_weights`; the bytes each rank fetched are counted at the reader,
and the assembled parameters are the saved ones.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from cantata.proto.vocabulary import MixedPrecision
from cantata.storage import open_store
from cantata.trainer.data import SourceCredentials
from cantata.trainer.model import build_model
from cantata.trainer.parallel import Parallelism, build_sharded
from cantata.trainer.process_exit import exit_without_finalizing
from cantata.trainer.weights import WeightObjects, WeightsError, load_weights, local_weights, open_weights
from tests.services import S3_TEST_CREDENTIALS

MODEL = "qwen3-tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _counted(objects: WeightObjects, tally: list[int]) -> WeightObjects:
    def read_range(key: str, offset: int, length: int) -> bytes:
        data = objects.read_range(key, offset, length)
        tally.append(len(data))
        return data

    return replace(objects, read_range=read_range)


def _ranks(rank: int, world: int, port: int, init_from: str, credentials: dict | None, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = build_sharded(MODEL, 1, Parallelism(1, world, 1).mesh(), MixedPrecision.FP32, checkpointing=False)
    roots = (Path(init_from.removeprefix("file://")).parent,)
    source = SourceCredentials.from_dict(credentials) if credentials else None
    tally: list[int] = []
    load_weights(model, _counted(open_weights(init_from, roots=roots, credentials=source), tally))
    shard_bytes = sum(cast(DTensor, p).to_local().numel() * 4 for p in model.parameters())
    full = {name: cast(DTensor, p).full_tensor() for name, p in model.named_parameters()}
    reads: list = [None] * world
    dist.all_gather_object(reads, (sum(tally), len(tally), shard_bytes))
    if rank == 0:
        torch.save({"full": full, "reads": reads}, out)
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


def _saved(directory: Path) -> tuple[dict[str, torch.Tensor], int]:
    """qwen3-tiny's weights (seed 7) as one Hugging Face style file; the bytes of its header."""
    state = {n: t.clone() for n, t in build_model(MODEL, seed=7).state_dict().items() if n != "lm_head.weight"}
    path = directory / "model.safetensors"
    save_file({f"model.{n}": t for n, t in state.items()}, str(path))
    return state, path.stat().st_size - sum(t.numel() * 4 for t in state.values())


def _load_on_two_ranks(init_from: str, credentials: dict | None, tmp_path: Path) -> dict:
    out = tmp_path / "out.pt"
    mp.spawn(_ranks, args=(2, _free_port(), init_from, credentials, str(out)), nprocs=2)
    return torch.load(out)


def _check(result: dict, state: dict[str, torch.Tensor], header: int) -> None:
    for name, tensor in state.items():
        assert torch.equal(result["full"][name], tensor), name
    for fetched, reads, shard_bytes in result["reads"]:
        assert reads == 2 + len(state)  # the header's length, the header, then one range per tensor
        assert fetched == header + shard_bytes  # the header and this rank's shards: nothing of the other rank's


@pytest.mark.integration  # real gloo processes
def test_each_rank_reads_only_its_shard_of_a_local_file(tmp_path):
    state, header = _saved(tmp_path)
    _check(_load_on_two_ranks((tmp_path / "model.safetensors").as_uri(), None, tmp_path), state, header)


def test_each_rank_reads_only_its_shard_of_an_s3_object(tmp_path, moto_service):
    state, header = _saved(tmp_path)
    bucket = f"weights-{uuid.uuid4().hex[:12]}"
    options = {"endpoint_url": moto_service.endpoint, **S3_TEST_CREDENTIALS}
    store = open_store(f"s3://{bucket}/w", **options)
    store.client.create_bucket(Bucket=bucket)
    store.put("model.safetensors", (tmp_path / "model.safetensors").read_bytes())
    secrets = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}  # moto's
    credentials = {"name": "hub", "kind": "s3", "endpoint": moto_service.endpoint, "secrets": secrets}
    _check(_load_on_two_ranks(f"s3://hub@{bucket}/w", credentials, tmp_path), state, header)


def test_a_truncated_or_malformed_object_is_refused_naming_it(tmp_path):
    state, _ = _saved(tmp_path)
    whole = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "model.safetensors").write_bytes(whole[:-100])
    with pytest.raises(WeightsError, match=r"cut/model\.safetensors: tensor '.*' ends past the end of the object"):
        load_weights(build_model(MODEL, seed=1), local_weights(tmp_path / "cut"))
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"[1,2]")
    with pytest.raises(WeightsError, match=r"json/model\.safetensors: not a safetensors file \(its header"):
        load_weights(build_model(MODEL, seed=1), local_weights(tmp_path / "json"))
    assert state  # the good file loads whole on one process
    model = build_model(MODEL, seed=1)
    assert load_weights(model, local_weights(tmp_path / "model.safetensors")) == 1
    assert all(torch.equal(model.state_dict()[n], t) for n, t in state.items())
