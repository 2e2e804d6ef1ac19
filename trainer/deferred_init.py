"""A model built on the meta device, its initial values generated shard by shard, as the whole model would have them.

Built the usual way (``torch.manual_seed(seed)``, then its constructors), a
model draws every initial value from the default CPU generator in one fixed
order: each module's own ``reset_parameters`` (a Linear's Kaiming-uniform, an
Embedding's normal), then the model's re-initialisation. Built on the meta
device under :class:`InitRecorder`, the same constructors allocate nothing and
the recorder notes each of those writes, in order (:class:`InitPlan`).
:func:`materialize` replays them on the generator seeded the same way, one
bounded chunk of rows at a time, and keeps of each parameter only the block of
its local shard (:func:`local_block`). Every rank draws the same stream, so
the assembled parameters are bit-identical to the model built whole, on any
mesh, and no rank holds more than its shards and one chunk at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cantata.trainer.shards import local_block

aten = torch.ops.aten
CHUNK_ELEMENTS = 1 << 22  # values generated at once (16 MiB of fp32)
NORMAL_BLOCK = 16  # normal_ on the CPU turns uniform draws into normals 16 at a time: chunks keep to whole blocks
DEFAULTS = {  # the writes a replay can follow, with the arguments their schema defaults
    aten.uniform_.default: ("uniform", (0.0, 1.0)),
    aten.normal_.default: ("normal", (0.0, 1.0)),
    aten.fill_.Scalar: ("fill", ()),
    aten.zero_.default: ("fill", (0.0,)),
}


class DeferredInitError(RuntimeError):
    """A model's initialisation does something a replay cannot reproduce exactly."""


@dataclass(frozen=True)
class InitWrite:
    """One recorded write of initial values: which parameter keeps them (None: a tensor the model dropped)."""

    name: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # "uniform" (from, to), "normal" (mean, std) or "fill" (value)
    args: tuple[float, ...]


@dataclass(frozen=True)
class InitPlan:
    """Every write of a model's construction, in the order it drew its values."""

    writes: tuple[InitWrite, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(w.name for w in self.writes if w.name is not None)


class InitRecorder(TorchDispatchMode):
    """Notes the initial-value writes of a model built on the meta device; refuses any it could not replay."""

    def __init__(self) -> None:
        super().__init__()
        self._writes: list[tuple[torch.Tensor, str, tuple[float, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DEFAULTS:
            if kwargs.get("generator") is not None:
                raise DeferredInitError(f"{func} draws from a generator of its own")
            kind, defaults = DEFAULTS[func]
            given = tuple(float(a) for a in args[1:])
            named = tuple(float(v) for k, v in kwargs.items() if k != "generator")
            self._writes.append((args[0], kind, (given + named + defaults[len(given) + len(named) :])))
        elif func._schema.is_mutable:
            raise DeferredInitError(f"{func} changes a tensor during construction: the replay cannot follow it")
        return func(*args, **kwargs)

    def plan(self, model: torch.nn.Module) -> InitPlan:
        """The recorded writes, named by the parameters of ``model`` (as built) that keep them."""
        if any(True for _ in model.buffers()):
            raise DeferredInitError(f"{type(model).__name__} has buffers: only parameters are replayed")
        names = {id(p): name for name, p in model.named_parameters()}
        writes = tuple(
            InitWrite(names.get(id(t)), tuple(t.shape), t.dtype, kind, args) for t, kind, args in self._writes
        )
        missing = set(names.values()) - {w.name for w in writes}
        if missing:
            raise DeferredInitError(f"no initial values for {sorted(missing)}")
        return InitPlan(writes)


def row_chunks(shape: tuple[int, ...], kind: str) -> int:
    """Rows of a tensor of ``shape`` generated at once: the stream stays the one a whole tensor would draw."""
    rows = shape[0] if shape else 1
    per_row = math.prod(shape[1:])
    if not rows or not per_row or math.prod(shape) % NORMAL_BLOCK:
        return max(rows, 1)  # a tensor whose normals end in a partial block is drawn whole
    step = NORMAL_BLOCK // math.gcd(per_row, NORMAL_BLOCK) if kind == "normal" else 1
    return max(step, CHUNK_ELEMENTS // per_row // step * step)


def replay(write: InitWrite, param: torch.Tensor | None) -> None:
    """Draw ``write``'s values in chunks of rows; copy into ``param``'s local block the rows and columns it holds."""
    local, offset = local_block(param) if param is not None else (None, ())
    if write.kind == "fill":
        if local is not None:
            local.fill_(write.args[0])
        return
    rows = write.shape[0] if write.shape else 1
    step = row_chunks(write.shape, write.kind)
    for first in range(0, rows, step):
        last = min(first + step, rows)
        chunk = torch.empty((last - first, *write.shape[1:]) if write.shape else (), dtype=write.dtype)
        getattr(chunk, write.kind + "_")(*write.args)
        if local is None:
            continue
        if not write.shape:
            local.copy_(chunk)
            continue
        start, stop = max(first, offset[0]), min(last, offset[0] + local.shape[0])
        if start < stop:
            columns = tuple(slice(o, o + n) for o, n in zip(offset[1:], local.shape[1:], strict=True))
            local[start - offset[0] : stop - offset[0]] = chunk[(slice(start - first, stop - first), *columns)]


def allocate(model: torch.nn.Module, device: str = "cpu") -> None:
    """``model.to_empty(device=device)`` that keeps tied parameters tied (the tensors are swapped, not replaced)."""
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)


@torch.no_grad()
def materialize(model: torch.nn.Module, plan: InitPlan, seed: int, only: frozenset[str] | None = None) -> None:
    """Give ``model`` (built under the recorder, then sharded and ``to_empty``'d) its initial values for ``seed``.

    With ``only`` (a pipeline rank's parameters) the others' values are drawn and dropped: they stay on meta.
    """
    params = {name: p for name, p in model.named_parameters() if only is None or name in only}
    if set(params) != (plan.names if only is None else plan.names & only):
        raise DeferredInitError(f"the plan initialises {sorted(plan.names ^ set(params))[:5]}, the model differs")
    last = {w.name: i for i, w in enumerate(plan.writes) if w.name is not None}
    torch.manual_seed(seed)
    for index, write in enumerate(plan.writes):
        keep = write.name in params and last[write.name] == index
        replay(write, params[write.name] if keep and write.name is not None else None)
