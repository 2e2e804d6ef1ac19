"""Worker process entry point: ``python -m cantata.trainer.worker --config FILE``.

Exit codes: 0 finished or stopped on request, 1 failed (the reason is
reported to the server first), 3 the server that started us is gone.
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
import traceback
from pathlib import Path

from cantata.proto.vocabulary import DECENTRALIZED
from cantata.storage.logs import set_third_party_log_level
from cantata.trainer.config import WorkerConfig
from cantata.trainer.decentralized import train_decentralized
from cantata.trainer.loop import Stopped, train
from cantata.trainer.reporter import Reporter

EXIT_ORPHANED = 3


def watch_parent(interval: float = 0.5) -> None:
    """Exit if the server that launched this worker dies: no orphan keeps training."""
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(EXIT_ORPHANED)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cantata worker (started by the server)")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--job", help="job id (shown in the process list)")
    args = parser.parse_args(argv)
    cfg = WorkerConfig.load(args.config)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_third_party_log_level()  # the server's setting, from the environment it passed on

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watch_parent()
    reporter = Reporter(cfg)
    try:
        reporter.started()
        run = train_decentralized if cfg.spec.algorithm in DECENTRALIZED else train
        final_val_loss = run(cfg, reporter, stop)
        reporter.finished(final_val_loss)
        print(f"worker {cfg.worker}: finished, validation loss {final_val_loss:.4f}", flush=True)
        return 0
    except Stopped:
        print(f"worker {cfg.worker}: stopped on request", flush=True)
        return 0
    except Exception as exc:
        traceback.print_exc()
        with contextlib.suppress(Exception):  # the server may be unreachable; the exit code still tells
            reporter.failed(f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        reporter.close()


if __name__ == "__main__":
    sys.exit(main())
