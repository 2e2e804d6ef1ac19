"""Waiting for an event, never for a guessed time.

A test waits until what it expects has happened. The deadline does not pace
the test (a loaded machine only makes it slower); it turns an event that never
comes into a failure that says what was awaited, well before the test's
pytest-timeout (``[tool.pytest.ini_options] timeout``, more for integration
tests in ``tests/conftest.py``) would stop it without saying.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

TIMEOUT_S = 120.0  # an event a test causes: generous for a loaded 2-core machine
JOB_TIMEOUT_S = 600.0  # progress of a real job (steps, checkpoints, states): its workers start and train first


class NeverHappened(AssertionError):
    """What was awaited did not happen before the deadline."""


def wait_for(
    predicate: Callable[[], T | Literal[False] | None],
    *,
    timeout: float = TIMEOUT_S,
    what: str | None = None,
    interval: float = 0.1,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something true; return that.

    Raises :class:`NeverHappened` naming ``what`` (by default, where ``predicate`` is written) once
    ``timeout`` seconds have passed without it holding.
    """
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise NeverHappened(f"waited {timeout:g} s for {what or _where(predicate)}; it did not happen")
        time.sleep(interval)
    return value


def _where(predicate: Callable[[], object]) -> str:
    """``name (file:line)`` of a function, the function's repr for any other callable."""
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    return f"{predicate.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
