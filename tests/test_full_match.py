"""Names and identifiers are checked whole: no trailing newline, control character or Unicode digit gets through.

``re.match(r"...$")`` accepts ``"acme\\n"`` (``$`` matches before a final
newline), and ``\\d`` matches every Unicode digit. Two tests hold the class:
a scan of the product's source for the constructs that let such strings in,
and a property test over every validator: a value it accepts, with a control
character put anywhere in it, is refused.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cantata.proto.vocabulary import REQUEST_ID, valid_request_id
from cantata.security.audit import layout as audit_layout
from cantata.security.audit import log as audit_log
from cantata.security.audit.keys import _KEY_ID
from cantata.security.pki import NAME_PATTERN, SPIFFE_PREFIX, Principal, validate_name
from cantata.security.sealed_checkpoint import _NAME as CHECKPOINT_NAME
from cantata.security.sealed_checkpoint import _checked_name
from cantata.security.stream_aead import IntegrityError, StreamContext
from cantata.server import datasource_store
from cantata.server.datasource_store import DataSourceSpec
from cantata.server.jobs.jobspec import BUCKET, check_store
from cantata.storage.base import _KEY_SEGMENT, validate_key

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("proto", "sdk", "server", "trainer", "security", "storage")
# Patterns that search inside text rather than validate a whole value.
SEARCHERS = {"security/audit/details.py": {"_WORD", "_PEM_PRIVATE"}, "security/audit/keys.py": {"_PEM_PUBLIC_BLOCK"}}
UNICODE_CLASSES = re.compile(r"\\[dwsDWS]")


def _product_files() -> list[Path]:
    return [p for folder in PRODUCT for p in (REPO / folder).rglob("*.py") if "_pb2" not in p.name]


def _patterns(tree: ast.Module) -> dict[str, ast.Call]:
    """Module-level ``NAME = re.compile(...)`` assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "compile" and getattr(func.value, "id", "") == "re":
                found.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def test_the_product_checks_names_with_full_matches_only():
    problems = []
    for path in _product_files():
        where = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text())
        patterns = _patterns(tree)
        for name, call in patterns.items():
            source = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else ""
            text = source.decode() if isinstance(source, bytes) else source
            if name in SEARCHERS.get(where, ()):
                continue
            if text.startswith("^") or text.endswith("$"):
                problems.append(f"{where}: {name} is anchored with ^/$ (use fullmatch; $ allows a final newline)")
            if UNICODE_CLASSES.search(text) and not isinstance(source, bytes) and len(call.args) < 2:
                problems.append(f"{where}: {name} uses \\d/\\w/\\s, which match Unicode digits and spaces")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "match":
                receiver = node.func.value
                if getattr(receiver, "id", "") == "re" or getattr(receiver, "id", "") in patterns:
                    problems.append(f"{where}:{node.lineno}: .match() checks only a prefix; use fullmatch")
    assert not problems, "\n".join(problems)


def _accepts(check: Callable[[str], object]) -> Callable[[str], bool]:
    def accepts(value: str) -> bool:
        try:
            result = check(value)
        except (ValueError, IntegrityError):  # InvalidName, InvalidField, ..., a malformed sealed header
            return False
        return result is not False  # None: a check that raises or returns nothing

    return accepts


def _context(step: str) -> bool:
    fields = [b"acme", b"job-1", step.encode(), b"model"]
    StreamContext.decode(b"".join(len(f).to_bytes(2, "big") + f for f in fields))
    return True


# Every validator of a name or identifier: (what it accepts, a pattern of values it must accept).
VALIDATORS: dict[str, tuple[Callable[[str], bool], str]] = {
    "tenant or admin name": (_accepts(validate_name), NAME_PATTERN.pattern),
    "tenant principal": (_accepts(lambda v: Principal.parse(SPIFFE_PREFIX + "tenant/" + v)), NAME_PATTERN.pattern),
    "worker principal": (
        _accepts(lambda v: Principal.parse(f"{SPIFFE_PREFIX}job/job-1/worker/{v}")),
        r"0|[1-9][0-9]{0,5}",
    ),
    "request id": (valid_request_id, REQUEST_ID.pattern),
    "data source name": (
        _accepts(lambda v: DataSourceSpec(v, "s3", "", {"access_key_id": "a", "secret_access_key": "s"})),
        datasource_store.NAME.pattern,
    ),
    "bucket or container": (_accepts(lambda v: check_store(f"s3://{v}/p", "checkpoint_store", [])), BUCKET.pattern),
    "store prefix": (
        _accepts(lambda v: check_store(f"s3://bucket/{v}", "checkpoint_store", [])),
        _KEY_SEGMENT.pattern + "(/" + _KEY_SEGMENT.pattern + "){0,3}",
    ),
    "checkpoint object name": (_accepts(lambda v: _checked_name(v, "shard")), CHECKPOINT_NAME.pattern),
    "blob key": (_accepts(validate_key), _KEY_SEGMENT.pattern + "(/" + _KEY_SEGMENT.pattern + "){0,3}"),
    "audit action": (lambda v: audit_log._WORD.fullmatch(v) is not None, audit_log._WORD.pattern),
    "audit key id": (lambda v: _KEY_ID.fullmatch(v) is not None, _KEY_ID.pattern),
    "audit segment file": (
        lambda v: audit_layout._SEGMENT_NAME.fullmatch(v) is not None,
        audit_layout._SEGMENT_NAME.pattern,
    ),
    "sealed context step": (_accepts(_context), r"0|[1-9][0-9]{0,11}"),
}

# Control characters (C0, DEL, C1) and the Unicode line and paragraph separators.
CONTROL = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x1F),
    st.characters(min_codepoint=0x7F, max_codepoint=0x9F),
    st.sampled_from(["\u2028", "\u2029"]),
)


@pytest.mark.parametrize("what", sorted(VALIDATORS))
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_a_control_character_anywhere_is_refused(what, data):
    accepts, pattern = VALIDATORS[what]
    value = data.draw(st.from_regex(pattern, fullmatch=True).filter(lambda v: v.isascii() and v.isprintable()))
    assert accepts(value), f"{what} refuses the valid {value!r}"
    at = data.draw(st.integers(0, len(value)))
    bad = value[:at] + data.draw(CONTROL) + value[at:]
    assert not accepts(bad), f"{what} accepts {bad!r}"
    assert not accepts(value + "\n"), f"{what} accepts a trailing newline"


@pytest.mark.parametrize("digit", ["\u0661", "\u0967", "\uff11", "\u00b9"])  # Arabic-Indic, Devanagari, fullwidth, ¹
@pytest.mark.parametrize("what", ["worker principal", "sealed context step", "audit segment file"])
def test_unicode_digits_are_not_digits(what, digit):
    accepts, _ = VALIDATORS[what]
    value = {"audit segment file": f"segment-0000000{digit}.jsonl"}.get(what, f"1{digit}")
    assert not accepts(value)
