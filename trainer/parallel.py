"""A job's mesh of ranks on PyTorch's own building blocks: FSDP2, tensor parallelism, activation checkpointing.

``Parallelism`` (from the job's ``dp_replicate``, ``dp_shard`` and ``tp``)
builds a ``DeviceMesh`` of shape ``(dp_replicate, dp_shard, tp)``. A decoder
is parallelized the torchtitan way: each layer's attention and MLP projections
get column/row tensor-parallel plans over ``tp`` (query and key norms act on a
rank's own heads, as sequence-parallel modules whose weight gradients are
summed), each layer is compiled if the job asks (:mod:`cantata.trainer.regional_compile`),
then every layer and the root are sharded with ``fully_shard`` over
the data-parallel dimensions (HSDP when ``dp_replicate`` > 1). Ranks of one
tensor-parallel group read the same batches: the data is split over the
data-parallel ranks only. A pipeline-parallel job (``pp`` > 1, alone for now)
adds a leading ``pp`` dimension: :mod:`cantata.trainer.pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from cantata.proto.vocabulary import MixedPrecision
from cantata.trainer.checkpoint import CheckpointFormatError
from cantata.trainer.deferred_init import allocate, materialize
from cantata.trainer.model import LanguageModel, build_meta_model
from cantata.trainer.models import family_of, family_of_module
from cantata.trainer.regional_compile import compile_blocks

DIMS = ("dp_replicate", "dp_shard", "tp")
PRECISIONS = {MixedPrecision.FP32: torch.float32, MixedPrecision.BF16: torch.bfloat16}


@dataclass(frozen=True)
class Parallelism:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1

    @classmethod
    def of(cls, spec) -> Parallelism:
        return cls(spec.dp_replicate or 1, spec.dp_shard or 1, spec.tp or 1, spec.pp or 1)

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def sharded(self) -> bool:
        """Whether the model is split at all (else plain data parallelism, as before meshes)."""
        return self.dp_shard > 1 or self.tp > 1

    def mesh(self) -> DeviceMesh:
        """The job's mesh over the default process group (gloo on CPU); a pipeline's has a leading ``pp`` dimension."""
        shape = (self.dp_replicate, self.dp_shard, self.tp)
        if self.pp > 1:
            return init_device_mesh("cpu", (self.pp, *shape), mesh_dim_names=("pp", *DIMS))
        return init_device_mesh("cpu", shape, mesh_dim_names=DIMS)


def data_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """This rank's (index, count) among the data-parallel ranks: tensor-parallel peers share their batches."""
    replicate, shard = mesh["dp_replicate"], mesh["dp_shard"]
    return replicate.get_local_rank() * shard.size() + shard.get_local_rank(), replicate.size() * shard.size()


def tensor_parallel(model: LanguageModel, mesh: DeviceMesh) -> None:
    """Each block's plan from the model's family (a decoder's: one all-reduce per attention and per MLP)."""
    family = family_of_module(model)
    assert family.tp_plan is not None
    for block in family.blocks(model):
        parallelize_module(block, mesh, family.tp_plan(model.cfg, mesh.size()))


def parallelize(
    model: LanguageModel, mesh: DeviceMesh, precision: MixedPrecision, checkpointing: bool, compile: bool = False
) -> None:
    """Shard ``model`` in place over ``mesh``, compiling each layer first with ``compile`` (see the module docstring)."""
    family = family_of_module(model)
    if mesh["tp"].size() > 1:
        tensor_parallel(model, mesh["tp"])
    if family.checkpointing is not None:
        family.checkpointing(model, checkpointing)
    if compile:
        compile_blocks(model)
    dp = mesh["dp_replicate", "dp_shard"]
    policy = MixedPrecisionPolicy(param_dtype=PRECISIONS[precision], reduce_dtype=torch.float32)
    for block in family.blocks(model):
        fully_shard(block, mesh=dp, mp_policy=policy)
    fully_shard(model, mesh=dp, mp_policy=policy)


def build_sharded(
    name: str, seed: int, mesh: DeviceMesh, precision: MixedPrecision, checkpointing: bool, compile: bool = False
) -> LanguageModel:
    """The named decoder, sharded over ``mesh``, with ``build_model(name, seed)``'s values in this rank's shards.

    Built on the meta device and parallelized there, so no rank ever holds the
    whole model: each allocates its own shards and draws their initial values
    (:mod:`cantata.trainer.deferred_init`).
    """
    family = family_of(name)
    if family.tp_plan is None:
        raise ValueError(f"model {name} is {family.title}, which cannot be sharded")
    model, plan = build_meta_model(name)
    parallelize(model, mesh, precision, checkpointing, compile)
    allocate(model)
    materialize(model, plan, seed)
    return model


class MeshState:
    """A mesh job's model and optimizer as one sharded checkpoint part (DTensor shards, DCP state dicts).

    Saved by every rank through ``torch.distributed.checkpoint``, loaded in
    place on any mesh (DCP picks the stored chunks each rank's shards need).
    Saving and loading are collective: every rank calls them.
    """

    def __init__(self, model: torch.nn.Module, optimizer):
        self._model, self._optimizer = model, optimizer

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self._model, self._optimizer.adamw)
        state = {"model": model, "optim": optim, "progress": {"step": self._optimizer.steps, "lr": self._optimizer.lr}}
        if self._optimizer.muon is not None:  # Canzona's momentum: DTensors placed like their parameters
            state["muon"] = self._optimizer.muon.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(
            self._model, self._optimizer.adamw, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        if self._optimizer.muon is not None:
            self._optimizer.muon.load_state_dict(state["muon"])
        self._optimizer.steps = state["progress"]["step"]
        self._optimizer.set_lr(state["progress"]["lr"])

    def load_unsharded(self, listed: dict) -> None:
        """A checkpoint of full tensors (``model`` and ``optim`` shards, before sharded checkpoints): each rank takes its shard."""
        if "model" not in listed or "optim" not in listed:
            raise CheckpointFormatError(f"the checkpoint holds neither sharded nor full model state: {sorted(listed)}")
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self._model, listed["model"], options=options)
        set_optimizer_state_dict(self._model, self._optimizer.adamw, listed["optim"]["adamw"], options=options)
        self._optimizer.steps = listed["optim"]["step"]
        self._optimizer.set_lr(listed["optim"]["lr"])
