"""What one rank (one worker process) of a job needs in memory, from its mesh: checked at submit, reserved while
it runs, enforced as a limit.

:func:`rank_estimate` is a pure function of the parsed spec (no I/O, no torch):

- **loaded** (:data:`LOADED_BYTES`): the interpreter with torch and the training modules.
- **state**: fp32 parameters, their gradients and the optimizer's state tensors (AdamW 2, Muon 1 momentum for
  the hidden matrices it updates, AdamW for the rest), and a decentralized job's outer copies
  (:data:`OUTER_COPIES`). A mesh shards it: a layer's projections over ``dp_shard x tp``, embeddings, output
  head and norms (not tensor-parallel) over ``dp_shard``; ``dp_replicate`` holds whole replicas.
- **gathered**: what FSDP2 holds unsharded at once on a mesh: the root unit (embeddings, output head, final
  norm) and two layers (the one computing and the one prefetched) in the compute dtype, with their fp32
  gradients before the reduce-scatter.
- **activations** of one micro-batch (``batch_size x seq_len`` tokens): for a decoder, what each layer keeps
  for the backward pass (the projections' inner widths split over ``tp``; with ``activation_checkpointing``
  only each layer's input, and one layer recomputed at a time), and the logits (fp32, for the loss and its
  gradient); for a byte GPT, a cost per token measured (peak RSS of one forward, backward and optimizer step,
  CPU, torch 2.13: gpt-tiny 13.3 KiB, gpt-small 40.3 KiB).
- **vocabulary**: the embedding's gradients in flight during the backward pass, each the fp32 size of the
  embedding: the lookup's, the tied head's (summed into the one parameter afterwards) and, on a mesh, the root
  unit's unsharded gradient entering the reduce-scatter (fitted to bench_memory's qwen3-0.6b peaks at D=1/2/4).

No rank builds the whole model: a mesh job's model is built on the meta device and each rank
materializes only its own shards (:mod:`cantata.trainer.deferred_init`), so a rank's peak is its training
footprint.

Parameters are counted from :data:`~cantata.proto.vocabulary.MODEL_SHAPES` (tests/test_worker_memory.py checks
them against the trainer's). :func:`refusal` says why a job cannot fit a node and which change would; a running
worker gets ``RLIMIT_AS`` of twice its estimate past its loaded size, plus headroom (threads' stacks, allocator
slack), unless ``worker_memory_mib`` sets the limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cantata.proto.jobfields import MAX_RANKS_PER_WORKER, MAX_WORKERS
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import BYTE_GPTS, DECENTRALIZED, MODEL_SHAPES, MixedPrecision, Model, Optimizer

MIB = 1 << 20
GIB = 1 << 30
LOADED_BYTES = 400 * MIB  # measured 340 MiB RSS: python, torch, the training modules
HEADROOM_BYTES = 1024 * MIB
FP32 = 4
ADAMW_STATES, MUON_STATES = 2, 1  # state tensors per parameter: AdamW's two moments, Muon's momentum
OUTER_COPIES = 4  # a decentralized round's copies of the rank's parameters: theta, the outer state, the flat
# parameters and the mixed result
ACTIVATION_BYTES_PER_TOKEN = {Model.GPT_TINY: 14 * 1024, Model.GPT_SMALL: 41 * 1024}  # measured byte GPTs
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


@dataclass(frozen=True)
class Parts:
    """A model's parameters by how a mesh splits them and which optimizer updates them."""

    matrices: int  # the layers' projections: tensor-parallel, and Muon's hidden matrices
    layer_rest: int  # the layers' norms: replicated over tp
    root: int  # embeddings, output head, final norm (FSDP2's root unit): replicated over tp

    @property
    def total(self) -> int:
        return self.matrices + self.layer_rest + self.root


def parts(model: Model) -> Parts:
    """The parameters ``cantata.trainer.model.build_model`` makes, split (tests/test_worker_memory.py checks them)."""
    s = MODEL_SHAPES[model]
    if model in BYTE_GPTS:
        width, layers = int(s["n_embd"]), int(s["n_layer"])
        return Parts(
            matrices=layers * 12 * width * width,
            layer_rest=layers * 2 * 2 * width,
            root=(2 * int(s["vocab_size"]) + int(s["block_size"])) * width + 2 * width,
        )
    dim, heads = int(s["dim"]), int(s["n_heads"]) * int(s["head_dim"])
    kv = int(s["n_kv_heads"]) * int(s["head_dim"])
    norms = 2 * dim + (2 * int(s["head_dim"]) if s["qk_norm"] else 0)
    return Parts(
        matrices=int(s["n_layers"]) * (2 * dim * heads + 2 * dim * kv + 3 * dim * int(s["ffn_dim"])),
        layer_rest=int(s["n_layers"]) * norms,
        root=int(s["vocab_size"]) * dim * (1 if s["tie_embeddings"] else 2) + dim,
    )


def parameters(model: Model) -> int:
    return parts(model).total


@dataclass(frozen=True)
class Mesh:
    """How a job's ranks split its model: ``dp_shard`` shards, ``tp`` splits the projections."""

    dp_shard: int = 1
    tp: int = 1

    @classmethod
    def of(cls, spec: common_pb2.JobSpec) -> Mesh:
        return cls(spec.dp_shard or 1, spec.tp or 1)

    @property
    def sharded(self) -> bool:
        """Whether the trainer parallelizes the model (FSDP2, tensor parallelism) at all."""
        return self.dp_shard > 1 or self.tp > 1


@dataclass(frozen=True)
class RankEstimate:
    """Bytes one rank needs at its peak, by cause (see the module docstring)."""

    optimizer: str
    loaded: int
    state: int
    gathered: int
    activations: int
    vocabulary: int

    @property
    def training(self) -> int:
        return self.state + self.gathered + self.activations + self.vocabulary

    @property
    def total(self) -> int:
        return self.loaded + self.training

    def causes(self) -> str:
        """Where the bytes go, biggest first: ``params+grads+AdamW 37.0 GiB, activations 4.0 GiB, ...``."""
        named = [
            (self.state, f"params+grads+{self.optimizer}"),
            (self.activations, "activations"),
            (self.gathered, "FSDP's unsharded layers"),
            (self.vocabulary, "the embedding's gradients in flight"),
            (self.loaded, "the process"),
        ]
        return ", ".join(f"{label} {size(amount)}" for amount, label in named if amount)


def size(amount: int) -> str:
    return f"{amount / GIB:.1f} GiB" if amount >= GIB else f"{amount // MIB} MiB"


def rank_estimate(spec: common_pb2.JobSpec) -> RankEstimate:
    """What one rank of a parsed ``spec`` is expected to use at its peak, by cause."""
    model, mesh = Model(spec.model), Mesh.of(spec)
    p = parts(model)
    matrices = -(-p.matrices // (mesh.dp_shard * mesh.tp))
    rest = -(-(p.layer_rest + p.root) // mesh.dp_shard)
    muon = spec.optimizer == Optimizer.MUON
    states = MUON_STATES * matrices + ADAMW_STATES * rest if muon else ADAMW_STATES * (matrices + rest)
    outer = OUTER_COPIES * (matrices + rest) if spec.algorithm in DECENTRALIZED else 0
    state = FP32 * (2 * (matrices + rest) + states + outer)
    return RankEstimate(
        optimizer="Muon/AdamW" if muon else "AdamW",
        loaded=LOADED_BYTES,
        state=state,
        gathered=_gathered(spec, p, mesh),
        activations=activations(spec),
        vocabulary=_vocabulary(spec, mesh),
    )


def _vocabulary(spec: common_pb2.JobSpec, mesh: Mesh) -> int:
    model = Model(spec.model)
    if model in BYTE_GPTS:
        return 0  # in the measured cost per token
    s = MODEL_SHAPES[model]
    copies = (2 if s["tie_embeddings"] else 1) + (1 if mesh.sharded else 0)
    return FP32 * copies * int(s["vocab_size"]) * int(s["dim"])


def _gathered(spec: common_pb2.JobSpec, p: Parts, mesh: Mesh) -> int:
    if not mesh.sharded:
        return 0
    compute = 2 if spec.mixed_precision == MixedPrecision.BF16 else FP32
    layers = int(MODEL_SHAPES[Model(spec.model)]["n_layers"])
    layer = (p.matrices // mesh.tp + p.layer_rest) // layers
    return compute * (p.root + 2 * layer) + FP32 * (p.root + layer)


def activations(spec: common_pb2.JobSpec) -> int:
    """Bytes of one micro-batch's activations kept for the backward pass."""
    model = Model(spec.model)
    s = MODEL_SHAPES[model]
    tokens = spec.batch_size * min(spec.seq_len, int(s.get("block_size", spec.seq_len)))
    if model in BYTE_GPTS:
        return ACTIVATION_BYTES_PER_TOKEN[model] * tokens
    mesh = Mesh.of(spec)
    bf16 = mesh.sharded and spec.mixed_precision == MixedPrecision.BF16
    inner = 4 * int(s["ffn_dim"]) + 4 * int(s["n_heads"]) * int(s["head_dim"])
    layer = 16 * int(s["dim"]) + inner // mesh.tp  # elements a token keeps in one layer
    kept = int(s["dim"]) * int(s["n_layers"]) + layer if spec.activation_checkpointing else layer * int(s["n_layers"])
    return tokens * ((2 if bf16 else FP32) * kept + FP32 * 3 * int(s["vocab_size"]))


def worker_estimate(spec: common_pb2.JobSpec) -> int:
    """Bytes one worker process (one rank) of a parsed ``spec`` is expected to use at its peak."""
    return rank_estimate(spec).total


def job_estimate(spec: common_pb2.JobSpec) -> int:
    """Bytes all of a job's worker processes need together (what one node reserves for a job it runs whole)."""
    return worker_estimate(spec) * spec.workers * spec.ranks_per_worker


def refusal(spec: common_pb2.JobSpec, capacity: int, *, one_node: bool) -> tuple[str, str] | None:
    """Why a parsed ``spec`` cannot fit ``capacity`` bytes, as (the field to blame, a message naming the cause and
    the changes that would fit); None if it fits. ``one_node``: all its processes share the node; else each rank
    may have a node of its own."""
    if _need(spec, one_node) <= capacity:
        return None
    estimate = rank_estimate(spec)
    n = spec.workers * spec.ranks_per_worker
    need = f"needs {size(estimate.total)} per rank ({estimate.causes()})"
    if one_node and n > 1:
        need = (
            f"needs {size(estimate.total * n)} on this node: {n} ranks of {size(estimate.total)} ({estimate.causes()})"
        )
    fits = fitting_changes(spec, capacity, one_node=one_node)
    advice = (
        f"{' or '.join(fits)} would fit in {size(capacity)}"
        if fits
        else f"no dp_shard, batch_size or activation_checkpointing fits it in {size(capacity)}: "
        "use a smaller model or a node with more memory"
    )
    if not fits:
        field = "model"  # no change of the mesh or the batch fits it
    elif estimate.activations >= estimate.state:
        field = "batch_size"
    elif Model(spec.model) in BYTE_GPTS:
        field = "model"  # more shards do not shrink it
    else:
        field = "dp_shard"
    return field, f"the job {need}; {advice}"


def _need(spec: common_pb2.JobSpec, one_node: bool) -> int:
    return job_estimate(spec) if one_node else worker_estimate(spec)


def _copy(spec: common_pb2.JobSpec, **changes: object) -> common_pb2.JobSpec:
    changed = common_pb2.JobSpec()
    changed.CopyFrom(spec)
    for name, value in changes.items():
        setattr(changed, name, value)
    return changed


def fitting_changes(spec: common_pb2.JobSpec, capacity: int, *, one_node: bool) -> list[str]:
    """Single changes that make a parsed ``spec`` fit ``capacity`` bytes: the smallest larger ``dp_shard``
    (a decoder), ``activation_checkpointing`` (a decoder), the largest smaller ``batch_size``."""
    found = []
    if Model(spec.model) not in BYTE_GPTS:
        decentralized = spec.algorithm in DECENTRALIZED
        others = spec.workers if decentralized else (spec.dp_replicate or 1) * (spec.tp or 1)
        most = min(MAX_RANKS_PER_WORKER, MAX_WORKERS // others) if decentralized else MAX_WORKERS // others
        for shards in range((spec.dp_shard or 1) + 1, most + 1):
            if decentralized:
                changed = _copy(spec, dp_shard=shards, ranks_per_worker=shards)
                text = f"dp_shard=ranks_per_worker={shards}"
            else:
                changed = _copy(spec, dp_shard=shards, workers=others * shards, algorithm="allreduce")
                text = f"dp_shard={shards} (workers={others * shards})"
            if _need(changed, one_node) <= capacity:
                found.append(text)
                break
        if (
            not spec.activation_checkpointing
            and _need(_copy(spec, activation_checkpointing=True), one_node) <= capacity
        ):
            found.append("activation_checkpointing=true")
    low, high = 0, spec.batch_size  # the largest smaller batch that fits lies in (low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if _need(_copy(spec, batch_size=middle), one_node) <= capacity:
            low = middle
        else:
            high = middle
    if low:
        found.append(f"batch_size={low}")
    return found


def runtime_budget(spec: common_pb2.JobSpec, override_mib: int) -> int:
    """Bytes a worker may allocate once loaded: ``override_mib`` if set, else twice its estimate plus headroom.

    A GPU worker gets no address-space cap (0): CUDA reserves virtual address space for the
    device's memory when it starts, far past any host budget, so ``RLIMIT_AS`` would stop it
    there; its model lives in device memory, which the GPU itself bounds.
    """
    if spec.gpus_per_worker > 0:
        return 0
    if override_mib > 0:
        return override_mib * MIB
    return 2 * (worker_estimate(spec) - LOADED_BYTES) + HEADROOM_BYTES


def node_capacity(setting_mib: int) -> int:
    """The node's memory for workers: ``node_memory_mib`` if set, else the machine's (or its cgroup's) memory."""
    if setting_mib > 0:
        return setting_mib * MIB
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
