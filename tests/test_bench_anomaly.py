"""bench_anomaly: which attack setting it keeps, and its simulation running the workers' own screen."""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_anomaly
import byzantine_sim

from cantata.security.anomaly import AttackConfig, AttackKind

TINY = byzantine_sim.Scale(workers=4, rounds=1, local_steps=1, batch_size=2, seq_len=8, val_windows=2)


def test_a_setting_hurts_only_when_every_seed_ends_above_the_highest_clean_loss():
    clean = [3.0, 3.1, 3.2]
    assert bench_anomaly.hurts([3.3, 3.25, math.inf], clean)  # a diverged seed is above
    assert not bench_anomaly.hurts([3.5, 3.6, 3.15], clean)  # one seed within the clean spread
    assert not bench_anomaly.hurts([3.2, 3.3, 3.4], clean)


def test_each_attack_keeps_its_first_setting_that_hurts_else_its_strongest():
    search = [
        {"topology": "ring", "attack": "ipm", "setting": "ipm_epsilon=0.1", "hurts": False},
        {"topology": "ring", "attack": "ipm", "setting": "ipm_epsilon=1", "hurts": True},
        {"topology": "ring", "attack": "ipm", "setting": "ipm_epsilon=100", "hurts": True},
        {"topology": "ring", "attack": "alie", "setting": "alie_z=paper", "hurts": False},
        {"topology": "ring", "attack": "alie", "setting": "alie_z=3", "hurts": False},
    ]
    chosen = bench_anomaly.choose(search)
    assert chosen["ring", "ipm"]["setting"] == "ipm_epsilon=1"
    assert chosen["ring", "alie"] == {**search[-1]}  # none hurts: the strongest, marked so


def test_the_search_tries_every_published_setting_undefended_on_every_seed():
    specs = bench_anomaly.search_specs(seeds=2)
    per_seed = len(bench_anomaly.PANELS) * (1 + sum(map(len, bench_anomaly.SETTINGS.values())))
    assert len(specs) == 2 * per_seed
    assert {spec.defence for *_, spec in specs} == {"undefended"}
    alie = [s for t, a, s, _ in specs if (t, a) == ("ring", "alie")]
    assert alie[0] == {"alie_z": None}  # the paper's z first
    assert bench_anomaly.setting_name({"alie_z": None}) == "alie_z=paper"


def test_the_job_is_the_server_default_job_at_the_benchmark_scale():
    spec = byzantine_sim.job_spec(byzantine_sim.Scale(), "ring", 1337)
    assert (spec.algorithm, spec.model, spec.local_steps, spec.batch_size) == ("gasloc", "gpt-tiny", 5, 8)
    assert (spec.outer_lr, spec.outer_momentum, spec.lr) == (1.0, 0.5, 3e-3)  # the server filled these in


def test_the_workers_screen_keeps_nan_out_while_undefended_mixing_diverges():
    nan = AttackConfig(AttackKind.NAN, frozenset({0}))
    screened = byzantine_sim.run(TINY, byzantine_sim.RunSpec("ring", "screened", nan, 1337))
    assert screened.byzantine_messages == 2 and screened.byzantine_blocked == 2  # worker 0's two ring neighbours
    assert screened.honest_blocked == 0 and math.isfinite(screened.val_loss)
    undefended = byzantine_sim.run(TINY, byzantine_sim.RunSpec("ring", "undefended", nan, 1337))
    assert undefended.val_loss == math.inf and undefended.byzantine_messages == 0
