"""Executors: where a job's worker processes run, and how they are started, stopped and reaped.

The scheduler (:mod:`cantata.server.jobs.scheduler`) decides *what* runs next; an
executor decides *where* and starts it. Two implement :class:`Executor`:

- ``local`` (:mod:`cantata.server.executors.local`): child processes of this
  server, forked from its zygote (the default; one machine, no cluster).
- ``ray`` (:mod:`cantata.server.executors.ray`): Ray actors in one placement
  group per job, on a token- and TLS-locked Ray cluster.
"""

from __future__ import annotations

from cantata.server.executors.base import Executor, NotPlaceable, WorkerExit

__all__ = ["Executor", "NotPlaceable", "WorkerExit"]
