import math
from typing import Any

import pytest
import torch

from cantata.security.anomaly import (
    AttackConfig,
    AttackKind,
    AttackNotPermitted,
    InvalidAttackConfig,
    SpecOrigin,
    parse_attack_config,
)
from cantata.trainer.attacks import AttackView, alie_z_max, craft

torch.set_num_threads(1)

OWN = torch.tensor([1.0, -2.0, 3.0])
HONEST = torch.tensor([[1.0, 0.0, 2.0], [3.0, 2.0, 2.0], [2.0, 1.0, 5.0]])


def view(**overrides) -> AttackView:
    fields: dict[str, Any] = dict(
        own=OWN,
        honest=HONEST,
        receiver=HONEST[0],
        honest_weights=torch.tensor([0.5, 0.25, 0.0]),
        byzantine_weight=0.25,
        workers=8,
        byzantine=1,
    )
    fields.update(overrides)
    return AttackView(**fields)


def attack(kind: AttackKind, **options) -> AttackConfig:
    return AttackConfig(kind, frozenset({0}), **options)


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def test_sign_flip_scale_and_nan():
    assert torch.equal(craft(attack(AttackKind.SIGN_FLIP), view(), generator()), -OWN)
    assert torch.equal(craft(attack(AttackKind.SCALE, scale=10.0), view(), generator()), 10 * OWN)
    assert torch.isnan(craft(attack(AttackKind.NAN), view(), generator())).all()


def test_gaussian_adds_noise_of_the_configured_scale():
    big = view(own=torch.zeros(20_000))
    noisy = craft(attack(AttackKind.GAUSSIAN, sigma=0.5), big, generator())
    assert noisy.std().item() == pytest.approx(0.5, rel=0.05)
    assert noisy.mean().item() == pytest.approx(0.0, abs=0.02)
    assert torch.equal(noisy, craft(attack(AttackKind.GAUSSIAN, sigma=0.5), big, generator()))


def test_alie_is_mean_minus_z_std():
    crafted = craft(attack(AttackKind.ALIE, alie_z=1.5), view(), generator())
    expected = torch.tensor([2.0 - 1.5 * 1.0, 1.0 - 1.5 * 1.0, 3.0 - 1.5 * math.sqrt(3.0)])
    assert torch.allclose(crafted, expected)


def test_alie_default_z_is_the_papers_z_max():
    assert alie_z_max(8, 2) == pytest.approx(0.3186, abs=1e-4)  # s = 3, Phi^-1(5/8)
    assert alie_z_max(50, 24) == pytest.approx(1.7507, abs=1e-4)  # s = 2, Phi^-1(48/50)
    crafted = craft(attack(AttackKind.ALIE), view(byzantine=2), generator())
    assert torch.allclose(crafted, HONEST.mean(dim=0) - alie_z_max(8, 2) * HONEST.std(dim=0))


def test_alies_z_for_a_gossip_neighbourhood_is_small():
    # bench_anomaly takes n and f from the receiver's closed neighbourhood
    assert alie_z_max(3, 1) == pytest.approx(0.4307, abs=1e-4)  # ring: s = 1, Phi^-1(2/3)
    assert alie_z_max(8, 1) == pytest.approx(0.0, abs=1e-12)  # complete graph, f = 1: s = 4, Phi^-1(1/2)
    crafted = craft(attack(AttackKind.ALIE), view(workers=3, byzantine=1), generator())
    assert torch.allclose(crafted, HONEST.mean(dim=0) - alie_z_max(3, 1) * HONEST.std(dim=0))


def test_ipm_is_minus_epsilon_times_the_honest_mean():
    crafted = craft(attack(AttackKind.IPM, ipm_epsilon=0.1), view(), generator())
    assert torch.allclose(crafted, torch.tensor([-0.2, -0.1, -0.3]))


def test_dissensus_hand_computed():
    receiver = torch.tensor([0.0, 0.0])
    honest = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    v = view(own=receiver, honest=honest, receiver=receiver, honest_weights=torch.tensor([0.5, 0.25]))
    crafted = craft(attack(AttackKind.DISSENSUS, dissensus_epsilon=1.5), v, generator())
    # x_i - eps * sum_k W_ik (x_k - x_i) / W_byz = 0 - 1.5 * (0.25 * [2, 0]) / 0.25
    assert torch.allclose(crafted, torch.tensor([-3.0, 0.0]))


def test_dissensus_with_epsilon_one_cancels_the_receivers_gossip():
    generator_ = torch.Generator().manual_seed(3)
    receiver = torch.randn(5, generator=generator_)
    neighbours = torch.randn(2, 5, generator=generator_)
    weights = torch.tensor([0.25, 0.25])
    v = view(own=receiver, honest=neighbours, receiver=receiver, honest_weights=weights, byzantine_weight=0.25)
    crafted = craft(attack(AttackKind.DISSENSUS, dissensus_epsilon=1.0), v, generator())
    mixed = receiver + (weights[:, None] * (neighbours - receiver)).sum(dim=0) + 0.25 * (crafted - receiver)
    assert torch.allclose(mixed, receiver, atol=1e-6)


def test_attacks_start_at_their_round_and_only_for_their_workers():
    config = AttackConfig(AttackKind.SCALE, frozenset({2, 5}), start_round=3)
    assert not config.attacks(2, 2)
    assert config.attacks(2, 3)
    assert not config.attacks(1, 10)


def test_a_tenant_spec_cannot_enable_attack_simulation():
    spec = {"kind": "sign_flip", "workers": [1]}
    with pytest.raises(AttackNotPermitted) as raised:
        parse_attack_config(spec, SpecOrigin.TENANT)
    assert isinstance(raised.value, PermissionError)
    with pytest.raises(AttackNotPermitted):
        parse_attack_config({}, SpecOrigin.TENANT)
    assert parse_attack_config(None, SpecOrigin.TENANT) is None


@pytest.mark.parametrize("origin", [SpecOrigin.ADMIN, SpecOrigin.BENCHMARK])
def test_admin_and_benchmark_specs_parse_into_a_typed_config(origin):
    config = parse_attack_config({"kind": "scale", "workers": [1, 3], "scale": 20, "start_round": 2}, origin)
    assert config == AttackConfig(AttackKind.SCALE, frozenset({1, 3}), start_round=2, scale=20.0)


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "teleport", "workers": [1]},
        {"workers": [1]},
        {"kind": "nan", "workers": []},
        {"kind": "nan", "workers": [True]},
        {"kind": "nan", "workers": "1"},
        {"kind": "nan", "workers": [1], "volume": 11},
        {"kind": "scale", "workers": [1], "scale": "big"},
        {"kind": "scale", "workers": [1], "start_round": 1.5},
        {"kind": "gaussian", "workers": [1], "sigma": -1},
        "sign_flip",
    ],
)
def test_malformed_attack_sections_are_invalid(spec):
    with pytest.raises(InvalidAttackConfig):
        parse_attack_config(spec, SpecOrigin.ADMIN)
