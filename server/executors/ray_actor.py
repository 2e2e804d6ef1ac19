"""The Ray actors on each node: a warm zygote per node, and one host per worker process of a job.

:class:`NodeZygote` is one named, detached actor per node (no CPU of its own):
it keeps a warm zygote (:mod:`cantata.server.zygote`, torch and the training
modules imported once) that forks every worker of that node into the same
sandbox as on the local executor (allow-listed environment, the job's uid, a
memory limit). A job's first step no longer waits for a fresh interpreter to
import torch.

The control plane creates one :class:`WorkerHost` per worker process, in the
job's placement group (so Ray reserves its bundle and hands it its GPUs). The
actor runs no tenant code and unpickles nothing of a tenant's: it writes the
files the control plane built for its worker (the worker's own certificate and
key, its 0600 config) into a 0700 folder of the node owned by the job's uid,
then asks its node's zygote to fork ``cantata.trainer.worker`` there, with
``CUDA_VISIBLE_DEVICES`` set to the GPUs Ray gave the actor. The secrets reach
it as the arguments of :meth:`WorkerHost.start`, an actor call over Ray's TLS
(not the actor's constructor, which the cluster's GCS keeps), and they are
deleted once the worker exits. The zygote writes the worker's exit status to a
root-only folder of the node, where :meth:`WorkerHost.wait` reads it.

Both actors are detached: they, and the workers, outlive the control plane
that created them, and a restarted one finds them again by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from cantata.security.process_sandbox import SpawnRequest
from cantata.server.config import write_private
from cantata.server.process_identity import running, start_time
from cantata.server.sandbox import base_environment
from cantata.server.zygote import Zygote

NODE_ROOT_ENV = "CANTATA_RAY_WORKSPACES"  # where workers' folders go on a node (default: <tmp>/cantata-ray)
SECRET_SUFFIXES = (".json", ".key")
LOG_CHUNK = 1 << 20
KILLED = -int(signal.SIGKILL)
STATUS_GRACE_S = 5.0  # a reaped worker's status is written right after; past this its zygote died with it


def node_root() -> Path:
    return Path(os.environ.get(NODE_ROOT_ENV) or Path(tempfile.gettempdir()) / "cantata-ray")


class NodeZygote:
    """The node's warm zygote; every worker of the node is forked from it."""

    def __init__(self) -> None:
        self._zygote = Zygote(warm=True, env=base_environment())
        self._zygote.start()  # warms up (imports torch) before the first job asks

    def spawn(self, request: dict) -> int:
        """Fork a worker as ``request`` (a :class:`SpawnRequest`) says; its pid."""
        return self._zygote.spawn(SpawnRequest(**request))


class WorkerHost:
    """One worker process of one job, on the node Ray placed this actor."""

    def __init__(self, job_id: str, worker: int):
        self.job_id = job_id
        self.worker = worker
        self.folder = node_root() / job_id / f"worker-{worker}"
        self.log = self.folder / "worker.log"
        self.status = node_root() / ".exits" / f"{job_id}-{worker}.json"  # root's: the worker cannot forge it
        self._pid: int | None = None
        self._started = 0
        self._rendezvous = ""

    def node(self) -> dict:
        """Where this actor runs: the node's cluster address, this worker's folder, the GPUs Ray gave it, a free port."""
        import ray  # in the actor's process, which Ray started

        ip = ray.util.get_node_ip_address()
        return {
            "ip": ip,
            "node_id": ray.get_runtime_context().get_node_id(),
            "folder": str(self.folder),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "port": self.free_port(ip),  # for a rendezvous here, if this worker is its group's first
        }

    def describe(self) -> dict:
        """What a restarted control plane needs to adopt this worker: :meth:`node`, its pid and rendezvous."""
        return {**self.node(), "pid": self._pid, "rendezvous": self._rendezvous}

    def free_port(self, host: str) -> int:
        """A free TCP port on ``host`` (this node's address), for a torch.distributed rendezvous."""
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    def start(self, files: dict[str, bytes], request: dict, uid: int | None, zygote, rendezvous: str) -> int:
        """Write the worker's files (secrets 0600) into its folder, owned by ``uid``, and have the node's
        ``zygote`` fork it; returns its pid."""
        import ray

        self.folder.parent.mkdir(parents=True, exist_ok=True)
        self.folder.parent.chmod(0o711)
        self.folder.mkdir(exist_ok=True)
        self.folder.chmod(0o700)
        (self.folder / "tmp").mkdir(exist_ok=True)
        for name, data in files.items():
            write_private(self.folder / name, data)
        self.log.touch(mode=0o600)
        if uid is not None:
            for path in [self.folder, *self.folder.iterdir()]:
                os.chown(path, uid, uid)
        self.status.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.status.unlink(missing_ok=True)
        self._rendezvous = rendezvous
        self._pid = ray.get(zygote.spawn.remote({**request, "status": str(self.status)}))
        self._started = start_time(self._pid)
        return self._pid

    def wait(self, timeout_s: float = 30.0) -> tuple[int, float] | None:
        """Until the worker exits (its status, when, its secrets deleted), or None after ``timeout_s``.

        Bounded, so that the calls of a control plane that died do not pile up in the actor.
        """
        assert self._pid is not None
        deadline, gone_at = time.monotonic() + timeout_s, None
        while (code := self._exit_code()) is None:
            if not running(self._pid, self._started):
                gone_at = gone_at or time.monotonic()
                if time.monotonic() - gone_at > STATUS_GRACE_S:  # its zygote died too: no status will come
                    code = KILLED
                    break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
        self.scrub()
        return code, time.time()

    def _exit_code(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(json.loads(self.status.read_text())["code"])
        return None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (never to a process that reused its pid)."""
        if self._pid is not None and running(self._pid, self._started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, sig)

    def read_log(self, offset: int, wait_s: float = 1.0) -> bytes:
        """The worker's log from ``offset`` on; waits up to ``wait_s`` for something new."""
        deadline = time.monotonic() + wait_s
        while True:
            with contextlib.suppress(FileNotFoundError), self.log.open("rb") as f:
                f.seek(offset)
                data = f.read(LOG_CHUNK)
                if data:
                    return data
            if time.monotonic() >= deadline:
                return b""
            time.sleep(0.2)

    def scrub(self) -> None:
        """Delete the worker's config and key."""
        for path in self.folder.glob("*"):
            if path.suffix in SECRET_SUFFIXES:
                path.unlink(missing_ok=True)

    def stop(self) -> None:
        """Kill the worker if it still runs and delete its secrets and status (before the actor goes)."""
        self.signal(signal.SIGKILL)
        self.scrub()
        self.status.unlink(missing_ok=True)
