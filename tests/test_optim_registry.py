"""The optimizer registry: the job field's values are its names, and an optimizer registered once is built and
stepped by build_optimizer, the loop's path, without other edits."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from cantata.proto import jobfields
from cantata.proto.vocabulary import Optimizer
from cantata.trainer import optim
from cantata.trainer.model import build_model
from cantata.trainer.optim import registry
from cantata.trainer.optim.profiling import StepStats


class SignStep:
    """A toy matrix step: signSGD on every hidden matrix, all owned by this rank."""

    def __init__(self, settings: registry.MatrixSettings) -> None:
        self.params: list[Tensor] = [param for _, param in settings.routing.muon]
        self.owned = list(range(len(self.params)))
        self.steps = 0

    @torch.no_grad()
    def step(self, *, lr: float, weight_decay: float) -> StepStats:
        for param in self.params:
            if param.grad is not None:
                param.sub_(lr * param.grad.sign())
        self.steps += 1
        return StepStats()

    def rank_flops(self) -> list[float]:
        return [0.0]

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


@pytest.fixture
def sign(monkeypatch: pytest.MonkeyPatch) -> registry.OptimizerKind:
    monkeypatch.setattr(registry, "OPTIMIZERS", dict(registry.OPTIMIZERS))
    return optim.register(optim.OptimizerKind("sign", SignStep))


def test_the_job_field_allows_exactly_the_registered_optimizers() -> None:
    field = next(f for f in jobfields.FIELDS if f.name == "optimizer")
    assert set(registry.OPTIMIZERS) == {o.value for o in Optimizer} == {str(c) for c in field.choices or ()}


def test_build_optimizer_steps_a_registered_optimizer(sign: registry.OptimizerKind) -> None:
    model = build_model("gpt-tiny", seed=0)
    optimizer = optim.build_optimizer(model, "sign", lr=0.5, weight_decay=0.0)
    assert isinstance(optimizer.muon, SignStep)
    hidden = {id(p) for p in optimizer.muon.params}
    assert hidden and not hidden & {id(p) for group in optimizer.adamw.param_groups for p in group["params"]}
    before = [p.detach().clone() for p in optimizer.muon.params]
    idx = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    optimizer.step()
    for old, param in zip(before, optimizer.muon.params, strict=True):
        assert torch.allclose((old - param).abs(), torch.full_like(old, 0.5))
    assert optimizer.state_dict()["muon"] == {"steps": 1}


def test_names_register_once_and_unknown_ones_are_refused(sign: registry.OptimizerKind) -> None:
    with pytest.raises(ValueError, match="registered already"):
        optim.register(sign)
    with pytest.raises(ValueError, match=r"unknown optimizer 'lion'; choose one of \('adamw', 'muon', 'sign'\)"):
        optim.build_optimizer(build_model("gpt-tiny", seed=0), "lion", lr=0.1)
