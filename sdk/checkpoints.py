"""``client.checkpoints``: a job's checkpoints, listed (``client.checkpoints(job_id)``) and downloaded."""

from __future__ import annotations

import builtins
import hashlib
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO

import grpc

from cantata.proto.v1 import checkpoints_pb2, jobs_pb2
from cantata.proto.vocabulary import BYTE_GPTS, MODEL_SHAPES, Model, model_architecture
from cantata.sdk.errors import InvalidArgument, NotFound, StreamInterrupted
from cantata.sdk.resource import Resource

CHECKPOINT_FORMATS = ("torch", "safetensors", "hf")
CHECKPOINT_FORMAT_GROUP = "cantata.checkpoint_formats"  # entry points: format name -> converter(state, out, config)


@dataclass(frozen=True)
class Checkpoint:
    job_id: str
    step: int
    size_bytes: int
    created: str


class Checkpoints(Resource):
    """``client.checkpoints``: calling it lists a job's checkpoints (``client.checkpoints(job_id)``)."""

    def __call__(self, job_id: str) -> builtins.list[Checkpoint]:
        return self.list(job_id)

    def list(self, job_id: str) -> builtins.list[Checkpoint]:
        """The job's checkpoints by step, the latest last."""
        reply = self._call(
            self._client._checkpoints.ListCheckpoints, checkpoints_pb2.ListCheckpointsRequest(job_id=job_id)
        )
        return [Checkpoint(c.job_id, c.step, c.size_bytes, c.created.ToJsonString()) for c in reply.checkpoints]

    def download(
        self,
        job_id: str,
        step: int | None,
        path: str | os.PathLike,
        *,
        format: str = "torch",
        consolidate: bool = False,
    ) -> Path:
        """Stream checkpoint ``step``'s model state (None: the latest checkpoint) to ``path``, verifying its digest.

        ``format="torch"`` writes the state dict as ``torch.save`` made it; ``"safetensors"`` makes
        ``path`` a directory holding ``model.safetensors`` and ``config.json`` (the model's shape), which
        load with ``safetensors`` and ``torch`` alone (converting needs both installed here).
        ``"hf"`` makes it a Hugging Face Llama or Qwen3 folder (a decoder's only), which
        ``transformers.AutoModelForCausalLM.from_pretrained`` loads.
        ``consolidate=True`` (with ``"torch"``, implies ``"safetensors"``) also takes a mesh job's sharded
        checkpoint: every rank's shards are joined here into full tensors, one ``model.safetensors``.
        """
        if format not in CHECKPOINT_FORMATS:
            raise InvalidArgument(f"format: one of {', '.join(CHECKPOINT_FORMATS)}, not {format!r}")
        if consolidate and format == "torch":
            format = "safetensors"
        if step is None:
            steps = [c.step for c in self.list(job_id)]
            if not steps:
                raise NotFound(f"job {job_id!r} has no checkpoint yet")
            step = steps[-1]
        if format == "torch":
            return self._download_state(job_id, step, Path(path), consolidate=False)
        convert = _checkpoint_converter(format)
        info = self._call(self._client._jobs.GetJob, jobs_pb2.GetJobRequest(job_id=job_id))
        if format == "hf" and Model(info.spec.model) in BYTE_GPTS:
            raise InvalidArgument(f"format hf: {info.spec.model} is a byte GPT; hf takes the Llama/Qwen3 decoders")
        out = Path(path)
        state = self._download_state(job_id, step, out.with_name(out.name + ".state"), consolidate=consolidate)
        try:
            return convert(state, out, checkpoint_config(info.spec.model, job_id=job_id, step=step))
        finally:
            _remove(state)

    def _download_state(self, job_id: str, step: int, path: Path, *, consolidate: bool) -> Path:
        """The model state as one file, or (a sharded checkpoint, consolidating) a directory of its objects."""
        tmp = path.with_name(path.name + ".part")
        digest = hashlib.sha256()
        expected = ""
        try:
            with ExitStack() as files:  # a sharded checkpoint: one file per object, under the directory
                sink: IO[bytes] | None = None
                request = checkpoints_pb2.DownloadCheckpointRequest(job_id=job_id, step=step, consolidate=consolidate)
                for chunk in self._client._checkpoints.DownloadCheckpoint(
                    request, timeout=max(self._client.timeout, 600)
                ):
                    if chunk.object:
                        tmp.mkdir(exist_ok=True)
                        sink = files.enter_context(open(tmp / _object_file(chunk.object), "wb"))
                    elif sink is None:
                        sink = files.enter_context(open(tmp, "wb"))
                    sink.write(chunk.data)
                    digest.update(chunk.data)
                    expected = chunk.sha256 or expected
        except grpc.RpcError as err:
            _remove(tmp)
            raise self._client._error(err) from None
        if expected != digest.hexdigest():
            _remove(tmp)
            raise StreamInterrupted(f"download of {job_id}@{step} was incomplete or corrupted")
        if tmp.is_dir() and path.is_dir():  # our own ``OUT.state`` left by an earlier download
            shutil.rmtree(path)
        tmp.replace(path)
        return path


def checkpoint_config(model: str, *, job_id: str, step: int) -> dict[str, object]:
    """The ``config.json`` of a downloaded checkpoint: the architecture and shape of ``model``, the job and the step."""
    return {
        "architecture": model_architecture(Model(model)),
        "model": model,
        **MODEL_SHAPES[Model(model)],
        "job_id": job_id,
        "step": step,
    }


def _object_file(name: str) -> str:
    """A streamed object's file name: the server's object names are plain, but never trusted as paths."""
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise StreamInterrupted(f"the server named an object {name!r}")
    return name


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _checkpoint_converter(format: str):
    """The installed converter to ``format`` (entry point group ``cantata.checkpoint_formats``; it needs torch)."""
    found = entry_points(group=CHECKPOINT_FORMAT_GROUP, name=format)
    try:
        return next(iter(found)).load()
    except (StopIteration, ImportError) as exc:
        raise InvalidArgument(
            f"format {format!r} needs the trainer's dependencies (torch, safetensors): "
            f"pip install 'cantata[trainer]' ({exc or 'no converter installed'})"
        ) from None
