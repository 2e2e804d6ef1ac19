"""bench_anomaly's --cells: which runs a subset makes (no simulation is run)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_anomaly


def _keys(patterns: str, seeds: int = 1) -> list[tuple]:
    return [(*bench_anomaly._key(spec), spec.seed) for spec in bench_anomaly.cells(patterns.split(","), seeds)]


def test_cells_add_the_clean_run_each_loss_is_measured_against_and_keep_whole_seeds():
    keys = _keys("complete/3/alie*/undefended", seeds=2)
    assert keys == [
        ("complete", 0, "clean", "undefended", 0),
        ("complete", 3, "alie", "undefended", 0),
        ("complete", 3, "alie_stress", "undefended", 0),
        ("complete", 3, "alie_z0", "undefended", 0),
        ("complete", 0, "clean", "undefended", 1),
        ("complete", 3, "alie", "undefended", 1),
        ("complete", 3, "alie_stress", "undefended", 1),
        ("complete", 3, "alie_z0", "undefended", 1),
    ]
    z0 = bench_anomaly.cells(["complete/3/alie_z0/undefended"], 1)[1]
    assert z0.attack.alie_z == 0.0 and z0.byzantine == frozenset({0, 3, 5})


def test_cells_outside_the_grid_exist_only_where_they_are_defined():
    assert _keys("ring/3/*/*") == []  # 3 Byzantine of 8 on the ring would leave a worker with no honest neighbour
    assert {k[3] for k in _keys("ring/*/ipm/*")} == {"undefended", "screened"}  # no aggregators on the ring
    grid = {bench_anomaly._key(s) for s in bench_anomaly.grid(1)}
    extra = {bench_anomaly._key(s) for s in bench_anomaly.cells(["*/[012]/*/*"], 1)} - grid
    assert extra and all(key[2] == "alie_z0" for key in extra)  # the grid's cells plus the control only


def test_a_subset_has_a_report_of_its_own_and_only_a_subset_may_change_the_rounds(monkeypatch, capsys):
    assert bench_anomaly.report_name(quick=False, cells=True) == "anomaly_full_cells"
    assert bench_anomaly.report_name(quick=True, cells=False) == "anomaly"  # the whole grid's is never overwritten
    for argv in (["--rounds", "100"], ["--cells", "ring/2/alie/*", "--rounds", "0"]):
        monkeypatch.setattr(sys, "argv", ["bench_anomaly.py", *argv])
        with pytest.raises(SystemExit) as refused:
            bench_anomaly.main()
        assert refused.value.code == 2 and "--rounds" in capsys.readouterr().err
