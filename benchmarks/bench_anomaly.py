"""Gradient-anomaly screening under attack, through the product's own workers (``byzantine_sim``).

8 GASLoC workers train the product's ``gpt-tiny`` on the built-in corpus with a
job's server defaults (optimizer, schedule, outer step, the workers' own
screening settings), on the ring with 1 Byzantine worker and on the complete
graph with 2, for a few rounds (``byzantine_sim.Scale``). Two phases, over
every seed:

1. **Search** (undefended): each attack at each of its published settings in
   ``SETTINGS``, weakest first. A setting *hurts* when every seed's final
   validation loss is above the highest clean loss (a diverged run counts as
   above), so the harm is larger than the seeds' spread. Each attack keeps its
   first setting that hurts; if none does, its strongest, marked as not
   hurting.
2. **Defences**: the clean runs and every attack at its kept setting,
   undefended and screened (the workers' ``UpdateScreen``); the screened runs
   give the detection TPR (Byzantine messages blocked: rejected or from a
   quarantined peer) and FPR (honest ones).

    nice .venv/bin/python benchmarks/bench_anomaly.py [--seeds 3] [--processes 2] [--rounds N] [--out DIR]

writes ``benchmarks/results/bench_anomaly.json`` (``--out`` elsewhere) with the
device, the torch version, the scale and every setting the workers used.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from byzantine_sim import RunResult, RunSpec, Scale, job_spec, run

from cantata.security.anomaly import AttackConfig, AttackKind, QuarantinePolicy
from cantata.trainer.attacks import alie_z_max
from cantata.trainer.decentralized import WORKER_SCREENING

PANELS = {"ring": frozenset({0}), "complete": frozenset({0, 4})}  # topology -> its Byzantine workers
# per attack, the settings tried, weakest first ({}: the attack has none). ALIE: the paper's z (None, Baruch
# et al. 2019) and larger; IPM: Xie et al. 2020's 0.1 and 100, and 1 between; dissensus: He et al. 2022's 1.5;
# scale and gaussian: AttackConfig's defaults
SETTINGS: dict[str, tuple[dict, ...]] = {
    "nan": ({},),
    "sign_flip": ({},),
    "scale": ({"scale": AttackConfig.scale},),
    "gaussian": ({"sigma": AttackConfig.sigma},),
    "alie": ({"alie_z": None}, {"alie_z": 1.0}, {"alie_z": 3.0}),
    "ipm": ({"ipm_epsilon": 0.1}, {"ipm_epsilon": 1.0}, {"ipm_epsilon": 100.0}),
    "dissensus": ({"dissensus_epsilon": AttackConfig.dissensus_epsilon},),
}
DEFENCES = ("undefended", "screened")
SEED_BASE = 1337  # run seed s is the job seed SEED_BASE + s (the job field's default is 1337)


def attack(name: str, setting: dict, workers: frozenset[int]) -> AttackConfig:
    return AttackConfig(AttackKind(name), workers, **setting)


def setting_name(setting: dict) -> str:
    """``alie_z=paper``, ``ipm_epsilon=0.1``; ``default`` for an attack without settings."""
    return ",".join(f"{k}={'paper' if v is None else f'{v:g}'}" for k, v in setting.items()) or "default"


def search_specs(seeds: int) -> list[tuple[str, str, dict, RunSpec]]:
    """Seed by seed: (topology, attack, setting, spec) of every clean and searched undefended run."""
    specs = []
    for seed in range(SEED_BASE, SEED_BASE + seeds):
        for topology, workers in PANELS.items():
            specs.append((topology, "clean", {}, RunSpec(topology, "undefended", None, seed)))
            for name, settings in SETTINGS.items():
                specs += [
                    (topology, name, s, RunSpec(topology, "undefended", attack(name, s, workers), seed))
                    for s in settings
                ]
    return specs


def hurts(losses: list[float], clean: list[float]) -> bool:
    """Every seed's loss above the highest clean loss (a diverged run, ``inf``, is above)."""
    return min(losses) > max(clean)


def choose(search: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (topology, attack): its first searched setting that hurts, else its strongest (``hurts`` False)."""
    chosen = {}
    for row in search:
        key = (row["topology"], row["attack"])
        if key in chosen and chosen[key]["hurts"]:
            continue
        chosen[key] = row
    return chosen


def summary(losses: list[float]) -> dict:
    finite = [x for x in losses if math.isfinite(x)]
    return {
        "val_loss": [x if math.isfinite(x) else None for x in losses],
        "mean": statistics.mean(finite) if len(finite) == len(losses) else None,
        "std": statistics.stdev(finite) if len(finite) == len(losses) and len(finite) > 1 else None,
        "diverged": len(losses) - len(finite),
    }


def _run(job: tuple[Scale, RunSpec]) -> RunResult:
    return run(*job)


def run_all(pool, scale: Scale, specs: list[RunSpec], label: str) -> list[RunResult]:
    results, started = [], time.perf_counter()
    for done, result in enumerate(pool.imap(_run, [(scale, s) for s in specs]), 1):
        results.append(result)
        elapsed = time.perf_counter() - started
        print(
            f"{label}: {done}/{len(specs)} runs, {elapsed:.0f} s, about {elapsed / done * (len(specs) - done) / 60:.1f} min left",
            flush=True,
        )
    return results


def job_settings(scale: Scale) -> dict:
    """The job settings every worker ran with (the server's defaults for what ``Scale`` leaves unset)."""
    spec = job_spec(scale, "ring", SEED_BASE)
    names = (
        "model",
        "optimizer",
        "lr",
        "weight_decay",
        "grad_clip",
        "lr_schedule",
        "warmup_steps",
        "min_lr_ratio",
        "steps",
        "local_steps",
        "batch_size",
        "seq_len",
        "outer_lr",
        "outer_momentum",
        "compression",
    )
    return {name: getattr(spec, name) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=Scale.rounds, help="outer rounds per run")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    if args.seeds < 2 or args.rounds < 1:
        parser.error("--seeds takes at least 2 (the spread needs them) and --rounds at least 1")
    torch.set_num_threads(1)
    scale = replace(Scale(), rounds=args.rounds)
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.processes, torch.set_num_threads, (1,)) as pool:
        searched = search_specs(args.seeds)
        results = run_all(pool, scale, [s for *_, s in searched], "search")
        clean = {
            t: [r.val_loss for (t2, a, _, _), r in zip(searched, results, strict=True) if t2 == t and a == "clean"]
            for t in PANELS
        }
        search = []
        for topology, name in ((t, n) for t in PANELS for n in SETTINGS):
            for setting in SETTINGS[name]:
                losses = [
                    r.val_loss
                    for (t, a, s, _), r in zip(searched, results, strict=True)
                    if (t, a, s) == (topology, name, setting)
                ]
                search.append(
                    {
                        "topology": topology,
                        "attack": name,
                        "setting": setting_name(setting),
                        "hurts": hurts(losses, clean[topology]),
                        **summary(losses),
                    }
                )
        chosen = choose(search)
        kept = {(t, n): next(s for s in SETTINGS[n] if setting_name(s) == chosen[t, n]["setting"]) for t, n in chosen}
        defended = [
            (topology, name, spec)
            for seed in range(SEED_BASE, SEED_BASE + args.seeds)
            for topology, workers in PANELS.items()
            for name in ("clean", *SETTINGS)
            for spec in [
                RunSpec(
                    topology, "screened", None if name == "clean" else attack(name, kept[topology, name], workers), seed
                )
            ]
        ]
        screened = run_all(pool, scale, [s for *_, s in defended], "screened")
    rows = []
    for topology in PANELS:
        for name in ("clean", *SETTINGS):
            undefended = (
                clean[topology]
                if name == "clean"
                else [
                    r.val_loss
                    for (t, a, s, _), r in zip(searched, results, strict=True)
                    if (t, a) == (topology, name) and s == kept[topology, name]
                ]
            )
            runs = [r for (t, a, _), r in zip(defended, screened, strict=True) if (t, a) == (topology, name)]
            byzantine = sum(r.byzantine_messages for r in runs)
            honest = sum(r.honest_messages for r in runs)
            row = {
                "topology": topology,
                "byzantine": 0 if name == "clean" else len(PANELS[topology]),
                "attack": name,
                "setting": "" if name == "clean" else chosen[topology, name]["setting"],
                "hurts": None if name == "clean" else chosen[topology, name]["hurts"],
                "undefended": summary(undefended),
                "screened": summary([r.val_loss for r in runs]),
                "tpr": sum(r.byzantine_blocked for r in runs) / byzantine if byzantine else None,
                "fpr": sum(r.honest_blocked for r in runs) / honest if honest else None,
                "byzantine_messages": byzantine,
                "honest_messages": honest,
                "quarantined": [q for r in runs for q in r.quarantined][:20],
            }
            rows.append(row)
    report = {
        "device": "cpu",
        "torch": torch.__version__,
        "seeds": list(range(SEED_BASE, SEED_BASE + args.seeds)),
        "scale": asdict(scale),
        "job": job_settings(scale),
        "panels": {t: sorted(w) for t, w in PANELS.items()},
        "alie_z_paper": {"ring": alie_z_max(3, 1), "complete": alie_z_max(8, 2)},
        "screening": asdict(WORKER_SCREENING),
        "quarantine": asdict(QuarantinePolicy()),
        "screening_overhead": sum(r.screening_seconds for r in screened) / sum(r.round_seconds for r in screened),
        "search": search,
        "rows": rows,
        "wall_seconds": time.perf_counter() - started,
        "command": "nice .venv/bin/python benchmarks/bench_anomaly.py"
        + (f" --seeds {args.seeds}" if args.seeds != 3 else "")
        + (f" --rounds {args.rounds}" if args.rounds != Scale.rounds else ""),
    }
    path = harness.write_results("anomaly", report, harness.output_dir(args.out, quick=False))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
