"""Worker process entry point: ``python -m cantata.trainer.worker --config FILE``.

Exit codes: 0 finished or stopped on request, 1 failed (the reason is
reported to the server first), 3 the zygote that forked us is gone, 4 out
of memory (past the limit the server set, reported as such). A failure the
job's own inputs cause (its data, its settings, a batch that does not fit
in its memory) is reported as permanent: restarting the job from its
checkpoint would fail the same way, as would a decentralized worker whose final
average failed (``ConsensusFailed``: its peers are done).

The process is forked from the zygote (:mod:`cantata.trainer.zygote`) into
its sandbox; what it needs of the server's environment to reach the job's
checkpoint store comes in its launch file (``store_env``), not its environment.

The heartbeat starts first; the training modules (and torch) load after it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cantata.logformat import LogFormat, configure, log_format
from cantata.proto.launch import WorkerLaunch
from cantata.proto.vocabulary import DECENTRALIZED
from cantata.storage.base import StoreConfigError, StorePermissionError
from cantata.storage.logs import set_third_party_log_level
from cantata.trainer.consensus import ConsensusFailed
from cantata.trainer.data.errors import DatasetUnavailableError
from cantata.trainer.recovery import NonfiniteLoss, RollbacksExhausted
from cantata.trainer.reporter import Endpoint, Reporter

log = logging.getLogger("cantata.worker")
EXIT_ORPHANED = 3
EXIT_OUT_OF_MEMORY = 4
STOPPING_FLUSH_S = 2.0  # how long a worker told to stop still tries to deliver its last reports
# DataError is a ValueError; a missing bucket (a StoreConfigError) or refused credentials stay so until someone acts;
# a failed final average stays failed, as the peers it needs are done; a job out of rollbacks would trip again.
PERMANENT = (
    ValueError,
    TypeError,
    LookupError,
    PermissionError,
    StoreConfigError,
    StorePermissionError,
    ConsensusFailed,
    RollbacksExhausted,
    NonfiniteLoss,
)
TRANSIENT = (DatasetUnavailableError,)


def permanent(exc: BaseException) -> bool:
    """Whether ``exc`` would happen again on a restart: the job's inputs are at fault, not the moment."""
    return isinstance(exc, PERMANENT) and not isinstance(exc, TRANSIENT)


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation refused at the worker's memory limit."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def watch_parent(interval: float = 0.5) -> None:
    """Exit if the zygote that forked this worker dies: no worker trains with no one to report its exit.

    The zygote outlives the server (a restarted server re-adopts the workers), not the other way round.
    """
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(EXIT_ORPHANED)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def start_logging(endpoint: Endpoint) -> None:
    """INFO and above to stdout (the worker log ``cantata jobs logs`` reads), as ``CANTATA_LOG_FORMAT`` says."""
    try:
        fmt, problem = log_format(), ""
    except ValueError as exc:
        fmt, problem = LogFormat.TEXT, str(exc)
    configure(sys.stdout, fmt, static={"job": endpoint.job_id, "worker": endpoint.worker})
    if problem:
        logging.getLogger("cantata.worker").warning("%s; logging as text", problem)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cantata worker (started by the server)")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--job", help="job id (shown in the process list)")
    args = parser.parse_args(argv)
    launch = WorkerLaunch.load(args.config)  # the one parse of the launch file
    os.environ.update(launch.store_env)
    endpoint = Endpoint.of(launch)
    start_logging(endpoint)
    set_third_party_log_level()  # the server's setting, from the environment it passed on

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watch_parent()
    reporter = Reporter(endpoint)
    reporter.start_heartbeat()
    try:
        return train_job(launch, reporter, stop)
    finally:
        # Stopped by a signal (a cancel, a requeueing server): what is left to say matters less than stopping.
        reporter.close(STOPPING_FLUSH_S if stop.is_set() else None)


def train_job(launch: WorkerLaunch, reporter: Reporter, stop: threading.Event) -> int:
    """Train the job of ``launch`` and report how it ended; returns the exit code."""
    # Loaded once the heartbeat beats: importing torch can outlast the server's heartbeat timeout.
    from cantata.trainer.config import WorkerConfig
    from cantata.trainer.loop import Stopped, train

    cfg = WorkerConfig.of(launch)
    spec = cfg.spec
    log.info(
        "worker %d of %d started (attempt %d): %s, %s, %d steps of %d x %d x %d tokens",
        cfg.worker,
        cfg.workers * (cfg.ranks_per_worker if spec.algorithm in DECENTRALIZED else 1),
        cfg.attempt,
        spec.algorithm,
        spec.optimizer,
        spec.steps,
        spec.batch_size,
        spec.grad_accum,
        spec.seq_len,
        extra={"fields": {"event": "started", "attempt": cfg.attempt}},
    )
    try:
        reporter.started()
        final_val_loss = train(cfg, reporter, stop)
        log.info(
            "worker %d: finished, validation loss %.4f",
            cfg.worker,
            final_val_loss,
            extra={"fields": {"event": "finished", "val_loss": final_val_loss}},
        )
        reporter.finished(final_val_loss)  # after the log line: the job's end closes `jobs logs -f`
        return 0
    except Stopped:
        log.info("worker %d: stopped on request", cfg.worker, extra={"fields": {"event": "stopped"}})
        return 0
    except Exception as exc:
        log.error("worker %d failed: %s: %s", cfg.worker, type(exc).__name__, exc, exc_info=exc)
        if out_of_memory(exc):
            with contextlib.suppress(Exception):
                reporter.failed(f"out of memory: worker {cfg.worker} exceeded its memory limit ({exc})", permanent=True)
            return EXIT_OUT_OF_MEMORY
        with contextlib.suppress(Exception):  # the server may be unreachable; the exit code still tells
            reporter.failed(f"{type(exc).__name__}: {exc}", permanent=permanent(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
