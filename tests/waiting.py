"""Waiting for an event, never for a guessed time.

A test waits until what it expects has happened. Its one ceiling is its
pytest-timeout (``[tool.pytest.ini_options] timeout``, more for integration
tests in ``tests/conftest.py``, ``@pytest.mark.timeout`` where a test needs
even more), so a loaded machine makes a test slower, never red.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], interval: float = 0.1) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something true; return that."""
    while not (value := predicate()):
        time.sleep(interval)
    return value
