"""Record every screening verdict and opposed pair of a set of screened runs, or compare with a recording.

A change meant to make the screening faster must not change what it decides:

    .venv/bin/python benchmarks/screening_verdicts.py --record /tmp/before.json   # on the old code
    .venv/bin/python benchmarks/screening_verdicts.py --compare /tmp/before.json  # on the new code

runs the screened defence against the clean run and every attack with 1 and 2
Byzantine workers on both graphs (quick setup, ``--rounds`` rounds, seed 0;
about 3400 screened updates at 4 rounds) and records, per screened round, each
peer's verdict, its checks' names and verdicts and whether it was clipped, and
the opposed pairs. ``--compare`` exits 1 and names the runs that differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_anomaly
import byzantine_sim

from cantata.security.anomaly import QuarantinePolicy, ScreeningConfig, UpdateScreener

ATTACKS = ("alie", "alie_stress", "ipm", "dissensus", "nan", "scale", "gaussian", "sign_flip")


def record(rounds: int) -> dict[str, list]:
    """Per run (``topology/attack/byzantine``), the screening's decisions in the order they were made."""
    log: list = []
    screen_round = UpdateScreener.screen_round
    find = byzantine_sim.opposition_from_gram

    def logged_screen(self, *args, **kwargs):
        results = screen_round(self, *args, **kwargs)
        log.append(
            [
                "screen",
                [
                    [
                        p,
                        int(r.verdict),
                        [c.check for c in r.checks],
                        [int(c.verdict) for c in r.checks],
                        r.clip_norm is not None,
                    ]
                    for p, r in sorted(results.items())
                ],
            ]
        )
        return results

    def logged_opposition(*args, **kwargs):
        opposition = find(*args, **kwargs)
        log.append(["opposition", [list(pair) for pair in sorted(opposition.pairs)], sorted(opposition.caps)])
        return opposition

    UpdateScreener.screen_round = logged_screen  # type: ignore[method-assign]
    byzantine_sim.opposition_from_gram = logged_opposition
    simulation = byzantine_sim.Simulation(
        replace(bench_anomaly.QUICK, rounds=rounds), ScreeningConfig(), QuarantinePolicy()
    )
    runs = {}
    for topology in bench_anomaly.TOPOLOGIES:
        for name in ("clean", *ATTACKS):
            for byzantine in (1,) if name == "clean" else (1, 2):
                config = (
                    None if name == "clean" else bench_anomaly.attack(name, bench_anomaly.BYZANTINE_SETS[byzantine])
                )
                log.clear()
                simulation.run(byzantine_sim.RunSpec(topology, "screened", config, 0))
                runs[f"{topology}/{name}/{byzantine}"] = list(log)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--record", type=Path, help="write the decisions to this JSON file")
    action.add_argument("--compare", type=Path, help="compare the decisions with this earlier recording")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = record(args.rounds)
    updates = sum(len(entry[1]) for log in runs.values() for entry in log if entry[0] == "screen")
    if args.record:
        args.record.write_text(json.dumps(runs))
        print(f"recorded {updates} screened updates in {len(runs)} runs")
        return
    before = json.loads(args.compare.read_text())
    differing = [name for name in before if before[name] != runs.get(name)]
    print(f"{updates} screened updates in {len(runs)} runs; differing runs: {differing or 'none'}")
    sys.exit(1 if differing or before.keys() != runs.keys() else 0)


if __name__ == "__main__":
    main()
