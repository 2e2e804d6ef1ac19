"""The server's end of the zygote (:mod:`cantata.trainer.zygote`): the one way worker processes start.

The zygote is started once, as a plain ``fork``+``exec`` with the allow-listed
environment; it forks each worker, and reports each one's exit status.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading

from cantata.security.process_sandbox import SpawnRequest

SPAWN_TIMEOUT_S = 300.0  # the first request waits for a warm zygote's imports (minutes on a loaded machine)
ZYGOTE_GONE = -int(signal.SIGKILL)  # exit status given to the workers of a zygote that died
ZYGOTE_MODULE = "cantata.trainer.zygote"


class ZygoteError(RuntimeError):
    """The zygote refused or failed to start a worker."""


class Zygote:
    """The server's end: starts the zygote, asks it for workers, and learns how they exit."""

    def __init__(self, *, warm: bool, env: dict[str, str]):
        self._warm = warm
        self._env = env
        self._lock = threading.Lock()  # one request at a time
        self._changed = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self._exit_order: dict[int, int] = {}  # pid -> the order in which the zygote reported its exit
        self._exit_count = itertools.count()
        self._children: set[int] = set()
        self._tags = itertools.count()
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the zygote now (it warms up while the server serves), unless it runs."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            args = [sys.executable, "-m", ZYGOTE_MODULE, *(["--warm"] if self._warm else [])]
            self._proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env, cwd="/", start_new_session=True
            )
            threading.Thread(target=self._read, args=(self._proc,), name="zygote", daemon=True).start()
        return self._proc

    def spawn(self, request: SpawnRequest) -> int:
        """Start a worker as ``request`` says; returns its pid."""
        with self._lock:
            proc = self._ensure()
            tag = next(self._tags)
            assert proc.stdin is not None
            proc.stdin.write((json.dumps({"tag": tag, **request.to_dict()}) + "\n").encode())
            proc.stdin.flush()
            with self._changed:
                if not self._changed.wait_for(
                    lambda: tag in self._replies or proc.returncode is not None, timeout=SPAWN_TIMEOUT_S
                ):
                    raise ZygoteError(f"no answer from the zygote in {SPAWN_TIMEOUT_S:.0f} s")
                reply = self._replies.pop(tag, {"error": "the zygote exited"})
        if "pid" not in reply:
            raise ZygoteError(reply.get("error", "the zygote exited"))
        return reply["pid"]

    def returncode(self, pid: int) -> int | None:
        """How worker ``pid`` exited (negative: by that signal), or None while it runs."""
        with self._changed:
            return self._exits.get(pid)

    def exit_order(self, pid: int) -> int:
        """When worker ``pid`` exited, relative to the others (smaller: earlier); only once it has."""
        with self._changed:
            return self._exit_order[pid]

    def forget(self, pid: int) -> None:
        with self._changed:
            self._exits.pop(pid, None)
            self._exit_order.pop(pid, None)

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                    self._exit_order[message["exited"]] = next(self._exit_count)
                    self._children.discard(message["exited"])
                elif "tag" in message:
                    self._replies[message["tag"]] = message
                    if "pid" in message:  # a reused pid: the old process's exit is not this one's
                        self._children.add(message["pid"])
                        self._exits.pop(message["pid"], None)
                        self._exit_order.pop(message["pid"], None)
                self._changed.notify_all()
        proc.wait()
        with self._changed:  # the zygote died: its workers are stopped and count as killed
            for pid in self._children:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                self._exits[pid] = ZYGOTE_GONE
                self._exit_order[pid] = next(self._exit_count)
            self._children.clear()
            self._changed.notify_all()

    def detach(self) -> None:
        """Close the zygote's requests and leave it with its workers: it reaps them, then exits."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            self._proc = None

    def close(self) -> None:
        """Stop the zygote once its workers are gone (it waits for those left)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait()
