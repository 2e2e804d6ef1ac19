"""What every repository of the store is: a few tables of the server's one database, and the transactions on them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

from cantata.server.database import Database


class Repository:
    """One aggregate's rows on the shared :class:`Database`.

    It writes only :attr:`tables` (another aggregate's rows change through that aggregate's repository, in the
    same transaction: transactions nest) and reads only those and :attr:`reads`. tests/test_store_repositories.py
    checks both on the SQL each one issues.
    """

    tables: ClassVar[frozenset[str]] = frozenset()  # the tables it owns: it alone writes them
    reads: ClassVar[frozenset[str]] = frozenset()  # others' tables it reads (a join, a filter)

    def __init__(self, database: Database):
        self.database = database

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self.database.transaction() as db:
            yield db


class Signal:
    """A notification whose receiver is wired in after the store is built (the scheduler's wake-up)."""

    def __init__(self) -> None:
        self.receiver: Callable[[], None] = lambda: None

    def __call__(self) -> None:
        self.receiver()
