"""The benchmark tables of docs/benchmarks.md are what benchmarks/tables.py makes of the committed results JSON."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import tables


def test_the_benchmark_tables_are_up_to_date():
    assert tables.main(["--check"]) == 0, "docs/benchmarks.md is stale: run .venv/bin/python benchmarks/tables.py"


def test_every_table_has_its_region_and_a_reproduce_command():
    page = tables.PAGE.read_text()
    for name in tables.TABLES:
        assert page.count(f"<!-- bench:{name} -->") == 1
        assert "Reproduce: `.venv/bin/python benchmarks/" in tables.render(name)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(tables.RESULTS, copy, ignore=shutil.ignore_patterns("*.png"))
    return copy


def _edit(results: Path, name: str, change) -> None:
    path = results / f"bench_{name}.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_check_fails_when_the_json_changes(results: Path, tmp_path: Path):
    page = tmp_path / "benchmarks.md"
    shutil.copy(tables.PAGE, page)
    assert tables.main(["--check", "--page", str(page), "--results", str(results)]) == 0

    def slower(document):
        document["verify"]["audit_records_per_s"] = 1234

    _edit(results, "audit", slower)
    assert tables.main(["--check", "--page", str(page), "--results", str(results)]) == 1
    assert tables.main(["--page", str(page), "--results", str(results)]) == 0
    assert "| 1,234 |" in page.read_text()
    assert tables.main(["--check", "--page", str(page), "--results", str(results)]) == 0


def test_a_missed_target_is_said_under_its_table(results: Path):
    assert "Every target is met." in tables.render("checkpoint", results)

    def slow_sealing(document):
        document["sealed_over_plaintext"]["local"]["save"] = 0.5

    _edit(results, "checkpoint", slow_sealing)
    assert "Targets missed: sealed save on local disk at 0.50× plaintext" in tables.render("checkpoint", results)


def test_unknown_missing_and_repeated_regions_are_refused():
    page = tables.PAGE.read_text()
    with pytest.raises(ValueError, match="unknown"):
        tables.rewrite(page + "<!-- bench:nonsense -->\n<!-- /bench:nonsense -->\n")
    with pytest.raises(ValueError, match="missing"):
        tables.rewrite(page.replace("<!-- bench:audit -->", "<!-- bench audit -->"))
    region = "<!-- bench:audit -->\n<!-- /bench:audit -->\n"
    with pytest.raises(ValueError, match="repeated"):
        tables.rewrite(page + region)


def test_no_page_quotes_a_measured_number_outside_a_generated_table():
    assert tables.unsourced() == []


def test_a_measured_number_in_prose_is_caught_and_a_table_or_code_is_not(tmp_path: Path):
    page = tmp_path / "benchmarks.md"
    page.write_text(
        "Krum ends at 1.14–1.17× clean in every cell, on 2 cores.\n"
        "The data loader's target is 0.8×; `0.5 s` in code and a 2 x 2 mesh are not measurements.\n"
        "<!-- bench:audit -->\n| 1.23× | 45.6 ms |\n<!-- /bench:audit -->\n"
        "```sh\nsleep 0.25s\n```\n"
        "It took 3.70 s and 12% more.\n"
    )
    assert tables.quoted_numbers(page, page.read_text()) == [
        f"{page}:1: 1.14–1.17×",
        f"{page}:9: 3.70 s",
        f"{page}:9: 12%",
    ]
