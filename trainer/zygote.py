"""The zygote: the process every worker is forked from (the server's end is :mod:`cantata.server.workers.zygote`).

The server starts ``python -m cantata.trainer.zygote [--warm]`` once, with the
allow-listed environment (:func:`cantata.server.workers.sandbox.base_environment`), as
a plain ``fork``+``exec`` (safe from the server's threads). With ``--warm`` the
zygote imports torch and the training modules, and builds one throwaway AdamW
(which lazily imports ``torch._dynamo``), before it serves; it never starts a
thread, and it refuses to fork if one exists. For each request (a JSON line
on its stdin) it forks a child that (after :func:`preload`, a no-op when warm) enters the sandbox
(:func:`cantata.server.workers.sandbox.enter`: session, descriptors, user, directory,
environment), sets its process title to the worker command line, caps its
memory and runs the request's entry point (:func:`cantata.trainer.worker.main`). The zygote answers with
the child's pid, reaps its children and reports each exit status (a JSON line
on its stdout, and the request's ``status`` file, which a server started later
reads). When its stdin closes (the server stopped or died) it starts nothing
more, but it stays with its workers, which train on, and reaps them; it exits
once the last one has. A restarted server re-adopts the workers
(:meth:`cantata.server.workers.launcher.WorkerLauncher.adopt`) and starts a zygote of
its own. Workers whose zygote dies see their parent change and stop
(``watch_parent``).

Without ``--warm`` (``warm_workers: false``) every child imports what it needs
itself, as a freshly started interpreter would: the baseline of
``benchmarks/bench_worker_start.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import signal
import traceback
from pathlib import Path

from cantata.security.process_sandbox import SpawnRequest, enter, limit_memory
from cantata.trainer.process_exit import exit_without_finalizing


def preload() -> None:
    """Import what a worker trains with, including what building AdamW imports lazily, and read the built-in corpus.

    The corpus is read here, as the zygote's user: a worker's uid may not be able to reach
    the interpreter's standard library (under ``/root`` on some machines).
    """
    import torch

    import cantata.trainer.decentralized
    import cantata.trainer.loop  # noqa: F401
    from cantata.trainer.data.corpus import load_builtin_corpus

    torch.set_num_threads(1)  # no OpenMP pool in the zygote: each worker sets its own size (cfg.threads)
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    load_builtin_corpus()


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: SpawnRequest) -> None:
    code = 1
    signal.set_wakeup_fd(-1)  # the zygote's exit wakeups are not the worker's
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        from setproctitle import setproctitle

        setproctitle(request.title)
        preload()  # a no-op in a warm zygote; else the platform's own imports, before any job input is read
        enter(request)
        limit_memory(request.memory_bytes)
        module, _, function = request.entry.partition(":")
        code = getattr(importlib.import_module(module), function)(request.argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        exit_without_finalizing(code)  # no interpreter finalization: it races gloo's threads (see process_exit)


def _send(message: dict) -> None:
    with contextlib.suppress(OSError):  # the server is gone: the status files say it for the next one
        os.write(1, (json.dumps(message) + "\n").encode())


def _write_status(path: str, pid: int, code: int) -> None:
    """Record how worker ``pid`` exited, atomically, in the server's folder (not the worker's)."""
    if not path:
        return
    with contextlib.suppress(OSError):
        temporary = f"{path}.{pid}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"pid": pid, "code": code}, out)
        os.replace(temporary, path)


def _spawn(line: bytes, statuses: dict[int, str]) -> None:
    tag = None
    try:
        raw = json.loads(line)
        tag = raw.pop("tag")
        request = SpawnRequest(**raw)
        if threads() != 1:
            raise RuntimeError(f"the zygote has {threads()} threads: forking it is unsafe")
    except Exception as error:
        _send({"tag": tag, "error": f"{type(error).__name__}: {error}"})
        return
    pid = os.fork()
    if pid == 0:
        _child(request)
    statuses[pid] = request.status
    _send({"tag": tag, "pid": pid})


def _reap(statuses: dict[int, str]) -> bool:
    """Reap the children that exited and report them; False once there is none left."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        code = os.waitstatus_to_exitcode(status)
        _write_status(statuses.pop(pid, ""), pid, code)
        _send({"exited": pid, "code": code})


def serve(*, warm: bool, poll_s: float = 0.05) -> None:
    """Answer spawn requests on stdin until it closes, then reap the children left until there is none.

    A child's exit wakes the loop at once (SIGCHLD through a wakeup pipe), so exits are
    reported in the order the children died: the server names the worker that failed
    first as a job's cause, not a peer that failed because of it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if warm:
        preload()
    died, wake = os.pipe()
    os.set_blocking(died, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send({"ready": True, "threads": threads()})
    pending, serving = b"", True
    statuses: dict[int, str] = {}  # pid -> its status file
    while True:
        readable, _, _ = select.select([0, died] if serving else [died], [], [], poll_s)
        if died in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(died, 1 << 12)
        if 0 in readable:
            chunk = os.read(0, 1 << 16)
            serving = bool(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip() and serving:
                    _spawn(line, statuses)
        if not _reap(statuses) and not serving:
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Cantata worker zygote (started by the server)")
    parser.add_argument("--warm", action="store_true", help="import torch and the training modules first")
    args = parser.parse_args(argv)
    os.chdir(Path("/"))
    serve(warm=args.warm)


if __name__ == "__main__":
    main()
