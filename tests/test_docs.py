"""What README.md and docs/*.md claim about the code holds: job fields and their defaults, CLI commands
and flags, make targets, links and paths, metric names, and numbers only from the benchmark JSON."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path

from prometheus_client import generate_latest

from benchmarks import tables
from cantata.proto import jobfields
from cantata.sdk import cli
from cantata.server.database import Database
from cantata.server.jobs.stragglers import StragglerDetector
from cantata.server.store import Store
from cantata.server.store.metrics import MetricsStore
from cantata.server.telemetry import Telemetry

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.DOTALL | re.MULTILINE)
SPAN = re.compile(r"`([^`\n]+)`")
FIELDS = {f.name: f for f in jobfields.FIELDS}


def _text(page: Path) -> str:
    return page.read_text()


def _blocks(lang: tuple[str, ...]) -> list[tuple[Path, str]]:
    return [(page, m["body"]) for page in PAGES for m in FENCE.finditer(_text(page)) if m["lang"] in lang]


def _prose(page: Path) -> str:
    return FENCE.sub("", _text(page))


# -- job fields ---------------------------------------------------------------------------------------------------


def _field_tables() -> list[tuple[Path, str, str]]:
    """(page, field, default) of every docs table with a ``field`` and a ``default`` column."""
    found = []
    for page in PAGES:
        columns: list[str] | None = None
        for line in _text(page).splitlines():
            if not line.startswith("|"):
                columns = None
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if columns is None:
                columns = cells
            elif set(cells) <= {"---", ""} or not {"field", "default"} <= set(columns):
                continue
            elif page.name != "job-fields.md":  # that page is generated from the table itself
                found.append((page, cells[columns.index("field")], cells[columns.index("default")]))
    return found


def test_every_job_field_a_docs_table_names_exists_with_the_stated_default():
    rows = _field_tables()
    assert len(rows) > 20, "the tables of the user guide were not found"
    problems = []
    for page, name, default in rows:
        field = re.match(r"`?(\w+)", name).group(1)
        if field not in FIELDS:
            problems.append(f"{page.name}: {field} is not a job field")
        elif not _same_value(default, FIELDS[field].default_text()):
            problems.append(f"{page.name}: {field}'s default is {FIELDS[field].default_text()}, not {default}")
    assert problems == []


def _same_value(stated: str, default: str) -> bool:
    """Whether a table's default says the field table's (its leading value; the rest may be in words)."""

    def lead(text: str) -> str:
        return re.match(r"[^\s(;:]*", re.sub(r"(?<=\d),(?=\d)", "", text.replace("`", ""))).group(0)

    try:
        return float(lead(stated)) == float(lead(default))
    except ValueError:
        return lead(stated) == lead(default)


def _job_calls() -> list[tuple[Path, ast.Call]]:
    return [
        (page, node)
        for page, body in _blocks(("python",))
        for node in ast.walk(ast.parse(body))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Job"
    ]


def test_every_keyword_of_a_job_in_the_docs_is_a_job_field():
    calls = _job_calls()
    assert calls
    for page, call in calls:
        for keyword in call.keywords:
            assert keyword.arg in FIELDS, f"{page.name}: Job({keyword.arg}=...) is not a job field"


# -- the CLI ------------------------------------------------------------------------------------------------------

COMMAND = re.compile(r"(?:^|[\s($])cantata((?:\s+[^|;&)#><\n]*)?)")


def _commands() -> list[tuple[Path, str]]:
    found = [
        (page, m.group(1))
        for page, body in _blocks(("sh", "bash", "console", ""))
        for line in body.replace("\\\n", " ").splitlines()
        for m in COMMAND.finditer(line.split(" # ")[0])
    ]
    found += [
        (page, span[len("cantata") :])
        for page in PAGES
        for span in SPAN.findall(_prose(page))
        if span.startswith("cantata ")
    ]
    return found


def _words(command: str) -> list[str]:
    words = shlex.split(command.replace("[", " ").replace("]", " "), comments=True)
    return [w for w in words if w != "..."]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return None if action is None else dict(action.choices)


def _check(parser: argparse.ArgumentParser, words: list[str]) -> str | None:
    """Why ``cantata WORDS`` is not a command of ``parser`` with its options (None if it is)."""
    path = "cantata"
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word.startswith("--"):
            flag = word.split("=")[0]
            if flag[2:].isupper():  # a placeholder: --FIELD
                continue
            action = parser._option_string_actions.get(flag)
            if action is None:
                return f"{path} has no option {flag}"
            skip = action.nargs != 0 and "=" not in word
            continue
        subs = _subcommands(parser)
        if subs is None:
            continue  # a positional argument
        if word not in subs:
            return f"{path} has no command {word!r}"
        parser, path = subs[word], f"{path} {word}"
    return None


def test_every_cli_command_the_docs_show_exists_with_its_options():
    parser, _ = cli.build_parser()
    commands = _commands()
    assert len(commands) > 50
    problems = [
        f"{page.name}: cantata{command}: {why}"
        for page, command in commands
        if (why := _check(parser, _words(command)))
    ]
    assert problems == []


def test_the_command_check_catches_an_unknown_command_or_option():
    parser, _ = cli.build_parser()
    assert _check(parser, ["jobs", "list", "--json"]) is None
    assert _check(parser, ["jobs", "lists"]) == "cantata jobs has no command 'lists'"
    assert _check(parser, ["jobs", "list", "--jsn"]) == "cantata jobs list has no option --jsn"


# -- make targets, links and paths --------------------------------------------------------------------------------


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    named = {
        (page.name, s[5:].split()[0]) for page in PAGES for s in SPAN.findall(_prose(page)) if s.startswith("make ")
    }
    named |= {
        (page.name, t) for page, body in _blocks(("sh", "bash", "")) for t in re.findall(r"^make ([\w-]+)", body, re.M)
    }
    assert named
    assert {(page, t) for page, t in named if t not in targets} == set()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", _prose(page), re.MULTILINE)}


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.name}: {link}")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.name}: {link} (no such heading)")
    assert broken == []


PATH = re.compile(
    r"^(?:benchmarks|docs|examples|proto|scripts|sdk|security|server|storage|tests|trainer)/[\w./-]*[\w/]$"
)


def test_every_repository_path_the_docs_name_exists():
    named = {(page.name, span) for page in PAGES for span in SPAN.findall(_prose(page)) if PATH.match(span)}
    assert len(named) > 50
    assert {(page, path) for page, path in named if not (ROOT / path).exists()} == set()


# -- metrics and numbers ------------------------------------------------------------------------------------------


def test_every_metric_in_monitoring_md_is_in_a_real_servers_exposition(tmp_path: Path):
    telemetry = Telemetry()
    path = tmp_path / "state.db"
    database = Database(path)
    try:
        telemetry.watch(Store(path), MetricsStore(database), lambda: 0, StragglerDetector(2.0, 3))
        exposed = set(re.findall(r"^# TYPE (\w+)", generate_latest(telemetry.registry).decode(), re.MULTILINE))
    finally:
        database.close()
    counters = {name + "_total" for name in exposed}
    documented = set(re.findall(r"`(cantata_\w+)`", _text(ROOT / "docs" / "monitoring.md")))
    assert len(documented) > 20
    assert documented - exposed - counters == set()


def test_the_docs_quote_measured_numbers_only_from_generated_tables():
    assert tables.unsourced() == []


def test_the_readme_is_short_and_opens_with_its_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, "move long sections to docs/ and leave a pointer"
    first = FENCE.search(readme)
    assert first is not None
    assert [line.split()[:2] for line in first["body"].splitlines()] == [["make", "demo"], ["make", "test"]]
