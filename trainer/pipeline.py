"""Pipeline parallelism: a decoder's layers split into stages over the mesh's ``pp`` ranks.

On ``torch.distributed.pipelining``, after torchtitan's pipelining module. The
stages share out the decoder's units in order (the embedding, each layer, the
final norm with the head; the embedding and the head weigh one layer each, as
torchtitan counts them), as evenly as they go. Rank r of ``pp`` holds stage r
(``1f1b``: ``Schedule1F1B``), or stages r and r + pp (``interleaved-1f1b``:
``ScheduleInterleaved1F1B``, torchtitan's "loop" placement). With ``tp`` > 1 each
stage's layers are tensor-parallel, with ``dp_shard`` > 1 each stage is sharded
with FSDP2 over its data-parallel ranks (mesh ``pp`` x ``dp_shard`` x ``tp``).

Each stage keeps the whole decoder's module names, so a rank's part of a
checkpoint holds the unpipelined model's keys: its parameters and its
optimizer state (flattened per parameter) go through the same DCP state as a
sharded mesh job's, with the pipeline's layout, which a resume must match.
Every rank reads the job's batches; the first stage takes their tokens, the
last stage their targets and computes the loss, broadcast to the other ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils.checkpoint import checkpoint

from cantata.proto.jobfields import pipeline_stages, server_default
from cantata.proto.vocabulary import MixedPrecision, PipelineSchedule
from cantata.trainer.checkpoint import CheckpointFormatError
from cantata.trainer.data import Feed
from cantata.trainer.decoder import Decoder, rotary
from cantata.trainer.deferred_init import allocate, materialize
from cantata.trainer.model import build_meta_model
from cantata.trainer.models.decoder import tp_plan
from cantata.trainer.parallel import PRECISIONS, MeshState

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)  # per-parameter keys: each rank's are its own


class PipelineLayoutError(CheckpointFormatError):
    """A checkpoint was written by a pipeline of another layout (``pp``, stages) than the resuming job's."""


def stage_units(n_layers: int, stages: int) -> list[range]:
    """Each stage's units (0: the embedding, 1..n_layers: the layers, n_layers + 1: the norm and head), in order."""
    units = n_layers + 2
    if not 1 <= stages <= units:
        raise ValueError(f"{stages} stages do not fit {n_layers} layers plus the embedding and the head")
    base, extra = divmod(units, stages)
    bounds = [0]
    for stage in range(stages):
        bounds.append(bounds[-1] + base + (stage < extra))
    return [range(bounds[s], bounds[s + 1]) for s in range(stages)]


class DecoderStage(nn.Module):
    """Some of a decoder's units under their names in the decoder: ``forward(tokens or hidden) -> hidden or logits``."""

    def __init__(self, model: Decoder, units: Sequence[int], checkpointing: bool):
        super().__init__()
        n_layers = model.cfg.n_layers
        self.cfg = model.cfg
        self.embed_tokens = model.embed_tokens if 0 in units else None
        self.layers = nn.ModuleDict({str(u - 1): model.layers[u - 1] for u in units if 1 <= u <= n_layers})
        last = n_layers + 1 in units
        self.norm: nn.Module | None = model.norm if last else None
        self.lm_head: nn.Module | None = model.lm_head if last else None
        self.checkpoint_layers = checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        cos, sin = rotary(x.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.device)
        for layer in self.layers.values():
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if self.checkpoint_layers else layer(x, cos, sin)
        if self.lm_head is not None and self.norm is not None:
            x = self.lm_head(self.norm(x))
        return x


class Pipeline:
    """This rank's stages of ``model`` on the mesh's ``pp`` dimension and the job's schedule over them.

    With ``tp`` > 1 each stage's layers are tensor-parallel; with ``dp_shard`` > 1 each stage is
    sharded with FSDP2 over its data-parallel ranks (the schedule reduces its gradients once, after
    the last micro-batch).

    ``part`` is the rank's modules as one (what the optimizer steps and the checkpoint holds).
    """

    def __init__(self, model: Decoder, mesh: DeviceMesh, spec, device: torch.device):
        pp = mesh["pp"]
        self.group, rank, size = pp.get_group(), pp.get_local_rank(), pp.size()
        self.stages = pipeline_stages(spec)
        per_rank = self.stages // size
        mine = [rank + k * size for k in range(per_rank)]
        units = stage_units(model.cfg.n_layers, self.stages)
        checkpointing = spec.activation_checkpointing
        modules = [DecoderStage(model, units[i], checkpointing) for i in mine]
        if mesh["tp"].size() > 1:  # each layer's projections column/row-parallel, as in a mesh job
            plan = tp_plan(model.cfg, mesh["tp"].size())
            for module in modules:
                for layer in module.layers.values():
                    parallelize_module(layer, mesh["tp"], plan)
        if mesh["dp_shard"].size() > 1 or mesh["tp"].size() > 1:  # FSDP2 on each stage: its layers, then the rest
            # (over one rank beside tp: every parameter a DTensor, as in a mesh job)
            precision = MixedPrecision(spec.mixed_precision or server_default("mixed_precision"))
            policy = MixedPrecisionPolicy(param_dtype=PRECISIONS[precision], reduce_dtype=torch.float32)
            for module in modules:
                for layer in module.layers.values():
                    fully_shard(layer, mesh=mesh["dp_shard"], mp_policy=policy)
                fully_shard(module, mesh=mesh["dp_shard"], mp_policy=policy)
        self.part = DecoderStage(model, [u for i in mine for u in units[i]], checkpointing)
        self.layout = {"pp": size, "stages": self.stages}
        self.first, self.last = 0 in mine, self.stages - 1 in mine
        self.last_rank = (self.stages - 1) % size
        self.loss_factor = 1.0  # an admin's injected fault (evaluation only) multiplies each micro-batch's loss
        self.schedule: _PipelineSchedule
        stages: list = [
            PipelineStage(m, i, self.stages, device, group=self.group) for m, i in zip(modules, mine, strict=True)
        ]
        if PipelineSchedule(spec.pp_schedule) is PipelineSchedule.INTERLEAVED_1F1B:
            self.schedule = ScheduleInterleaved1F1B(stages, spec.pp_microbatches, loss_fn=self._loss)
        else:
            self.schedule = Schedule1F1B(stages[0], spec.pp_microbatches, loss_fn=self._loss)

    @classmethod
    def build(cls, spec, mesh: DeviceMesh, device: torch.device) -> Pipeline:
        """The job's pipeline with ``build_model(spec.model, spec.seed)``'s values in this rank's stages.

        Built on the meta device: a rank allocates and initialises only its stages (or its shards
        of them), drawing the same stream of initial values as the whole model would.
        """
        model, plan = build_meta_model(spec.model)
        pipeline = cls(model, mesh, spec, device)  # type: ignore[arg-type]  # the submit rules allow decoders only
        allocate(pipeline.part, device.type)
        materialize(model, plan, spec.seed, only=frozenset(name for name, _ in pipeline.part.named_parameters()))
        return pipeline

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return loss * self.loss_factor if self.loss_factor != 1.0 else loss

    def _run(self, inputs: torch.Tensor, targets: torch.Tensor, *, train: bool) -> float:
        """One pass of the batch through the schedule; the micro-batches' mean loss, on every rank."""
        losses: list[torch.Tensor] = []
        run = self.schedule.step if train else self.schedule.eval
        args = (inputs,) if self.first else ()
        run(*args, target=targets if self.last else None, losses=losses if self.last else None)
        box = torch.stack([loss.detach().float() for loss in losses]).mean().reshape(1) if self.last else torch.zeros(1)
        dist.broadcast(box, group=self.group, group_src=self.last_rank)
        return box.item()

    def train_step(self, optimizer, feed: Feed, step: int, lr: float, *, trace: bool) -> float:
        """One optimizer step over a batch of the feed, its micro-batches through the pipeline; returns its loss."""
        optimizer.set_lr(lr)
        batch = feed.next_batch()
        if trace:
            print(f"samples step={step} ids={','.join(map(str, batch.sample_ids.tolist()))}", flush=True)
        loss = self._run(batch.inputs, batch.targets, train=True)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    @torch.no_grad()
    def evaluate(self, feed: Feed, batches: int) -> float:
        """The mean validation loss over ``batches`` of the feed's validation split, forward only."""
        self.part.eval()
        losses = [self._run(batch.inputs, batch.targets, train=False) for batch in feed.validation(batches)]
        self.part.train()
        return sum(losses) / len(losses)


class PipelineState(MeshState):
    """A pipeline rank's stages and optimizer as its part of the job's DCP state, with the pipeline's layout.

    Resuming on another layout (another ``pp``, another schedule's stages) is refused: each rank
    would need other layers' optimizer state than its own, which is not resharded yet.
    """

    def __init__(self, pipeline: Pipeline, optimizer):
        super().__init__(pipeline.part, optimizer)
        self._layout = pipeline.layout

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self._model, self._optimizer.adamw, options=FLAT)
        progress = {"step": self._optimizer.steps, "lr": self._optimizer.lr}
        return {"model": model, "optim": optim, "progress": progress, "pipeline": dict(self._layout)}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("pipeline")
        if saved != self._layout:
            raise PipelineLayoutError(
                f"the checkpoint was written by a pipeline of {_layout_text(saved)}, and this job runs "
                f"{_layout_text(self._layout)}: a job resumes on its own pp degree and schedule"
            )
        set_state_dict(
            self._model,
            self._optimizer.adamw,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=FLAT,
        )
        self._optimizer.steps = state["progress"]["step"]
        self._optimizer.set_lr(state["progress"]["lr"])


def _layout_text(layout: dict | None) -> str:
    if not layout:
        return "no pipeline (pp 1)"
    return f"pp {layout['pp']} with {layout['stages']} stages"
