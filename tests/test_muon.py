"""Single-process Muon: agreement with torch.optim.Muon, routing, the training-loop optimizer."""

from __future__ import annotations

import functools
import io
import math

import pytest
import torch
from torch import nn

from cantata.proto.v1 import worker_pb2
from cantata.server.services.worker import optimizer_metrics
from cantata.server.store.metrics import METRICS
from cantata.trainer.optim import Muon, MuonConfig, ShardedMuon, build_optimizer
from cantata.trainer.optim.cost import newton_schulz_flops, update_cost
from cantata.trainer.optim.dp import DataParallelMuon
from cantata.trainer.optim.muon import newton_schulz, rms_matched_lr
from cantata.trainer.optim.routing import route_parameters
from cantata.trainer.reporter import optimizer_window

SHAPES = [(16, 24), (40, 8), (12, 12)]
BF16 = MuonConfig(ns_dtype=torch.bfloat16)  # as torch.optim.Muon runs Newton-Schulz


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def random_grads(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def initial_params() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(99)
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in SHAPES]


def run(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], steps: int = 20) -> list[torch.Tensor]:
    for step in range(steps):
        for param, grad in zip(params, random_grads(step), strict=True):
            param.grad = grad
        optimizer.step()
    return [p.detach() for p in params]


def relative_error(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    return max(((a - e).norm() / e.norm()).item() for a, e in zip(actual, expected, strict=True))


def test_matches_torch_muon_with_adamw_rms_matching_over_20_steps():
    expected_params = initial_params()
    expected = run(torch.optim.Muon(expected_params, lr=0.02, adjust_lr_fn="match_rms_adamw"), expected_params)
    ours_params = initial_params()
    ours = run(Muon(ours_params, lr=0.02, config=MuonConfig(ns_dtype=torch.bfloat16)), ours_params)
    assert relative_error(ours, expected) <= 1e-5
    assert relative_error(ours, [p.detach() for p in initial_params()]) > 1e-2


def test_fp32_newton_schulz_orthogonalizes():
    for shape in [(64, 32), (32, 64), (48, 48)]:
        matrix = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        singular_values = torch.linalg.svdvals(newton_schulz(matrix, MuonConfig()))
        assert singular_values.min() > 0.6 and singular_values.max() < 1.2


def test_update_scale_uses_full_shape():
    assert rms_matched_lr(0.01, (512, 2048)) == pytest.approx(0.01 * 0.2 * math.sqrt(2048))


def test_sharded_engine_on_one_process_equals_muon():
    expected_params = initial_params()
    expected = run(Muon(expected_params, lr=0.02), expected_params)
    params = initial_params()
    engine = DataParallelMuon([(f"p{i}", p) for i, p in enumerate(params)], bucket_elements=100)
    for step in range(20):
        for param, grad in zip(params, random_grads(step), strict=True):
            param.grad = grad
        engine.step(lr=0.02, weight_decay=0.1)
    assert all(torch.equal(a.detach(), e) for a, e in zip(params, expected, strict=True))


def test_a_matrix_whose_gradient_comes_and_goes_keeps_its_momentum_like_torch_muon():
    """An expert that got no tokens in a step has no gradient: neither its momentum nor its weight moves then."""

    def run_intermittent(step_fn, params: list[torch.Tensor]) -> list[torch.Tensor]:
        for step in range(8):
            for index, (param, grad) in enumerate(zip(params, random_grads(step), strict=True)):
                param.grad = None if index == 1 and step % 3 else grad  # the second gets a gradient every 3rd step
            step_fn()
        return [p.detach() for p in params]

    expected_params = initial_params()
    reference = torch.optim.Muon(expected_params, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    expected = run_intermittent(reference.step, expected_params)
    engines = {
        "Muon": lambda ps: Muon(ps, lr=0.02, config=BF16).step,
        "DataParallelMuon": lambda ps: functools.partial(
            DataParallelMuon([(f"p{i}", p) for i, p in enumerate(ps)], config=BF16).step, lr=0.02, weight_decay=0.1
        ),
        "ShardedMuon": lambda ps: functools.partial(
            ShardedMuon([(f"p{i}", p) for i, p in enumerate(ps)], mesh=None, config=BF16).step,
            lr=0.02,
            weight_decay=0.1,
        ),
    }
    for label, engine in engines.items():
        params = initial_params()
        ours = run_intermittent(engine(params), params)
        assert relative_error(ours, expected) <= 1e-5, label
    stepped_every_time = initial_params()
    always = run(torch.optim.Muon(stepped_every_time, lr=0.02, adjust_lr_fn="match_rms_adamw"), stepped_every_time, 8)
    assert relative_error([expected[1]], [always[1]]) > 1e-2  # the skipped steps made a difference


def test_rejects_parameters_that_are_not_matrices():
    with pytest.raises(ValueError, match="matrices or stacks"):
        Muon([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match="do not add up"):
        Muon([{"params": [torch.zeros(6, 4, requires_grad=True)], "splits": (4, 4)}])


def test_fused_projection_is_orthogonalized_as_its_sub_matrices():
    """A qkv of rows (8, 4, 4) steps exactly as q, k and v would as three separate matrices."""
    parts = [torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows)) for rows in (8, 4, 4)]
    fused = torch.cat(parts).requires_grad_()
    separate = [p.clone().requires_grad_() for p in parts]
    fused_muon = Muon([{"params": [fused], "splits": (8, 4, 4)}], lr=0.02)
    separate_muon = Muon(separate, lr=0.02)
    for step in range(5):
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + step + p.shape[0])) for p in parts]
        fused.grad, _ = torch.cat(grads), [setattr(p, "grad", g) for p, g in zip(separate, grads, strict=True)]
        fused_muon.step()
        separate_muon.step()
    assert torch.allclose(fused.detach(), torch.cat([p.detach() for p in separate]), rtol=0, atol=1e-6)
    split, whole = torch.cat(parts).requires_grad_(), torch.cat(parts).requires_grad_()
    split.grad = whole.grad = fused.grad
    Muon([{"params": [split], "splits": (8, 4, 4)}], lr=0.02).step()
    Muon([whole], lr=0.02).step()  # one Newton-Schulz over the fused matrix is a different update
    assert not torch.allclose(split, whole, rtol=0, atol=1e-4)


def test_expert_stack_is_updated_as_a_batch_of_matrices():
    experts = torch.randn(3, 8, 12, generator=torch.Generator().manual_seed(5)).requires_grad_()
    singles = [e.clone().requires_grad_() for e in experts.detach()]
    batched, separate = Muon([experts], lr=0.02), Muon(singles, lr=0.02)
    for step in range(5):
        grad = torch.randn(3, 8, 12, generator=torch.Generator().manual_seed(step))
        experts.grad = grad
        for single, g in zip(singles, grad, strict=True):
            single.grad = g.clone()
        batched.step()
        separate.step()
    assert torch.allclose(experts.detach(), torch.stack([s.detach() for s in singles]), rtol=0, atol=1e-5)


class Moe(nn.Module):
    muon_splits = {"qkv.weight": (8, 4, 4)}  # noqa: RUF012 - a declaration read by the router

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 16, bias=False)
        self.experts = nn.Parameter(torch.randn(2, 8, 8))
        self.conv = nn.Conv1d(8, 8, 3)
        self.idle = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)[..., :8] @ self.experts[0]


def test_routing_sends_expert_stacks_to_muon_and_reads_declared_splits():
    routing = route_parameters(Moe())
    assert [name for name, _ in routing.muon] == ["experts", "qkv.weight", "idle.weight"]
    assert "conv.weight" in {name for name, _ in routing.adamw}
    assert routing.splits == {"qkv.weight": (8, 4, 4)}
    with pytest.raises(ValueError, match="not updated by Muon"):
        route_parameters(Moe(), splits={"conv.weight": (4, 4)})
    with pytest.raises(ValueError, match="names no parameter"):
        route_parameters(Moe(), splits={"kqv.*": (8, 8)})


@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_parameters_without_gradient_are_not_stepped(name):
    """No weight decay and no momentum on a parameter that received no gradient (torch's AdamW and Muon)."""
    torch.manual_seed(0)
    model = Moe()
    idle = model.idle.weight.detach().clone()
    optimizer = build_optimizer(model, name, lr=0.01, weight_decay=0.5)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.randn(2, 8, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
    assert torch.equal(model.idle.weight, idle)
    assert not torch.equal(model.qkv.weight, Moe().qkv.weight)
    if name == "muon":
        assert optimizer.last_stats.updated_matrices == 2  # qkv and the experts
        assert optimizer.window_metrics()["optim_updated_matrices"] == 2


def test_cost_units_weigh_fused_parts_and_experts():
    assert update_cost((24, 8), unit="numel") == 192
    assert update_cost((24, 8), unit="flops", splits=(8, 16)) == newton_schulz_flops((8, 8)) + newton_schulz_flops(
        (16, 8)
    )
    assert update_cost((3, 8, 16), unit="flops") == 3 * newton_schulz_flops((8, 16))
    with pytest.raises(ValueError, match="cost unit"):
        update_cost((8, 8), unit="bytes")


class Gpt(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(32, 8)
        self.pos = nn.Embedding(4, 8)
        self.attn = nn.Linear(8, 24)
        self.mlp = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 32, bias=False)
        if tied:
            self.lm_head.weight = self.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        x = x + self.attn(x)[..., :8] + self.mlp(x)[..., :8]
        return self.lm_head(self.norm(x))


@pytest.mark.parametrize("tied", [True, False])
def test_routing_sends_hidden_matrices_to_muon_and_the_rest_to_adamw(tied):
    routing = route_parameters(Gpt(tied))
    assert [name for name, _ in routing.muon] == ["attn.weight", "mlp.weight"]
    expected_adamw = {"tok.weight", "pos.weight", "attn.bias", "mlp.bias", "norm.weight", "norm.bias"}
    assert {name for name, _ in routing.adamw} == expected_adamw | (set() if tied else {"lm_head.weight"})


def test_routing_patterns_override_the_rule():
    routing = route_parameters(Gpt(tied=False), muon_patterns=("lm_head.*",), adamw_patterns=("mlp.*",))
    assert [name for name, _ in routing.muon] == ["attn.weight", "lm_head.weight"]
    assert "mlp.weight" in {name for name, _ in routing.adamw}
    with pytest.raises(ValueError, match="not 2-D"):
        route_parameters(Gpt(tied=False), muon_patterns=("norm.*",))


def train(model: nn.Module, optimizer, steps: range) -> None:
    for step in steps:
        tokens = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(step))
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def fresh_gpt() -> Gpt:
    torch.manual_seed(0)
    return Gpt(tied=False)


@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_state_survives_weights_only_save_and_resumes_exactly(name):
    straight = fresh_gpt()
    train(straight, build_optimizer(straight, name, lr=0.01), range(8))
    resumed = fresh_gpt()
    first = build_optimizer(resumed, name, lr=0.01)
    train(resumed, first, range(4))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = build_optimizer(resumed, name, lr=0.01)
    second.load_state_dict(torch.load(buffer, weights_only=True))
    train(resumed, second, range(4, 8))
    for (n, a), (_, b) in zip(straight.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(a, b), n


def test_set_lr_zero_freezes_every_parameter():
    model = fresh_gpt()
    optimizer = build_optimizer(model, "muon", lr=0.01)
    train(model, optimizer, range(2))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.set_lr(0.0)
    train(model, optimizer, range(2, 4))
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_first_step_differs_only_on_muon_routed_matrices():
    models = {name: fresh_gpt() for name in ("muon", "adamw")}
    for name, model in models.items():
        train(model, build_optimizer(model, name, lr=0.01), range(1))
    assert not torch.allclose(models["muon"].attn.weight, models["adamw"].attn.weight)
    assert torch.equal(models["muon"].tok.weight, models["adamw"].tok.weight)


def test_unknown_optimizer_name_is_rejected():
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer(fresh_gpt(), "sgd", lr=0.1)


def test_window_metrics_travel_in_a_worker_report_under_names_of_the_metrics_history():
    model = Moe()
    optimizer = build_optimizer(model, "muon", lr=0.01)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.randn(2, 8, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
    window = optimizer.window_metrics()
    assert window["optim_owned_matrices"] == 3 and window["optim_updated_matrices"] == 2  # idle has no gradient
    assert window["optim_ns_flops_imbalance"] == 1.0 and window["optim_step_s"] >= window["optim_compute_s"] > 0
    report = worker_pb2.Progress.FromString(worker_pb2.Progress(optimizer=optimizer_window(window)).SerializeToString())
    assert optimizer_metrics(report.optimizer) == pytest.approx(window)
    assert set(window) <= set(METRICS)
    adamw = build_optimizer(model, "adamw", lr=0.01)
    adamw.step()
    assert optimizer_metrics(optimizer_window(adamw.window_metrics())).keys() == {
        "optim_step_s",
        "optim_sent_bytes",
    }  # no Muon statistics for AdamW
    assert optimizer.window_metrics()["optim_step_s"] == 0.0  # a window starts empty after each call
