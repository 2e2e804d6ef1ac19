"""A rank that ends while gloo's worker threads still hold its last collectives' work does not abort.

gloo's worker threads free a finished collective's work after the caller has
moved on; when that happens once the interpreter is finalizing, freeing the
work's Python tensors aborts the process (:mod:`cantata.trainer.process_exit`).
Here each rank's threads share one CPU, gloo's at idle priority, so the main
thread runs on as soon as a collective completes and gloo's threads are still
holding the last collective of each of several groups when the rank ends; an
object that the interpreter finalizes with its modules then hands them the CPU
until none is runnable. A rank that ends through
:func:`exit_without_finalizing` never finalizes: both ranks exit 0.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from cantata.trainer.process_exit import exit_without_finalizing

WORLD = 2
GROUPS = 4  # each group's gloo threads hold their own last work: more chances for one to still hold it at the end
GLOO_WORKER = "pt_gloo_runloop"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads() -> dict[int, tuple[str, str]]:
    """This process's threads: id -> (name, scheduler state)."""
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except FileNotFoundError:  # it ended meanwhile
            continue
        threads[int(tid)] = (stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2])
    return threads


def _starve_gloo_workers() -> None:
    """Put every thread on one CPU and gloo's workers at idle priority: they run only while the main thread waits."""
    cpu = min(os.sched_getaffinity(0))
    for tid, (name, _) in _threads().items():
        os.sched_setaffinity(tid, {cpu})
        if name == GLOO_WORKER:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


class _YieldsToGlooWhenFinalized:
    """Finalized with its module, once the interpreter finalizes: yields the CPU until no gloo worker is runnable."""

    def __del__(self) -> None:
        for _ in range(10_000):  # a bound, not a wait for time: each pass gives gloo's workers the CPU
            if not any(name == GLOO_WORKER and state == "R" for name, state in _threads().values()):
                return
            time.sleep(0.001)


_finalized_with_the_module: _YieldsToGlooWhenFinalized | None = None


def _rank(rank: int, port: int, out: str) -> None:
    global _finalized_with_the_module
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    groups = [dist.new_group(list(range(WORLD))) for _ in range(GROUPS)]
    _starve_gloo_workers()
    _finalized_with_the_module = _YieldsToGlooWhenFinalized()
    gathered = []
    for group in groups:
        ranks: list = [None] * WORLD
        dist.all_gather_object(ranks, rank, group=group)
        gathered.append(ranks)
    Path(f"{out}.{rank}").write_text(json.dumps(gathered))
    for group in groups:  # the last collectives: their work is what gloo's starved threads still hold at the end
        dist.all_gather_object([None] * WORLD, rank, group=group)
    exit_without_finalizing()


@pytest.mark.integration  # real gloo processes
def test_a_rank_ends_without_aborting_while_gloo_threads_hold_its_last_work(tmp_path):
    out = tmp_path / "gathered"
    mp.spawn(_rank, args=(_free_port(), str(out)), nprocs=WORLD)  # raises ProcessExitedException on a SIGABRT
    for rank in range(WORLD):
        assert json.loads(Path(f"{out}.{rank}").read_text()) == [list(range(WORLD))] * GROUPS
