"""The Ray actor that runs one worker process of a job on its node.

The control plane creates one :class:`WorkerHost` per worker process, in the
job's placement group. The actor runs no tenant code and unpickles nothing of
a tenant's: it writes the files the control plane built for its worker (the
worker's own certificate and key, its 0600 config) into a 0700 folder of the
node owned by the job's uid, and asks a zygote of its own
(:mod:`cantata.server.zygote`) to fork ``cantata.trainer.worker`` into the same
sandbox as on the local executor (allow-listed environment, the job's uid, a
memory limit), with ``CUDA_VISIBLE_DEVICES`` set to the GPUs Ray gave the
actor. The secrets reach it as the arguments of :meth:`WorkerHost.start`, an
actor call over Ray's TLS (not the actor's constructor, which the cluster's
GCS keeps), and they are deleted once the worker exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from cantata.security.process_sandbox import SpawnRequest
from cantata.server.config import write_private
from cantata.server.sandbox import base_environment
from cantata.server.zygote import Zygote

NODE_ROOT_ENV = "CANTATA_RAY_WORKSPACES"  # where workers' folders go on a node (default: <tmp>/cantata-ray)
SECRET_SUFFIXES = (".json", ".key")
LOG_CHUNK = 1 << 20


def node_root() -> Path:
    return Path(os.environ.get(NODE_ROOT_ENV) or Path(tempfile.gettempdir()) / "cantata-ray")


class WorkerHost:
    """One worker process of one job, on the node Ray placed this actor."""

    def __init__(self, job_id: str, worker: int):
        self.job_id = job_id
        self.worker = worker
        self.folder = node_root() / job_id / f"worker-{worker}"
        self.log = self.folder / "worker.log"
        self._zygote = Zygote(warm=False, env=base_environment())
        self._pid: int | None = None

    def node(self) -> dict:
        """Where this actor runs: the node's cluster address, this worker's folder, the GPUs Ray gave it."""
        import ray  # in the actor's process, which Ray started

        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "folder": str(self.folder),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self, host: str) -> int:
        """A free TCP port on ``host`` (this node's address), for a torch.distributed rendezvous."""
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    def start(self, files: dict[str, bytes], request: dict, uid: int | None) -> int:
        """Write the worker's files (secrets 0600) into its folder, owned by ``uid``, and start it; returns its pid."""
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
        self._pid = self._zygote.spawn(SpawnRequest(**request))
        return self._pid

    def wait(self) -> tuple[int, float]:
        """Block until the worker exits; its exit status and when (wall clock), and its secrets deleted."""
        assert self._pid is not None
        while (code := self._zygote.returncode(self._pid)) is None:
            time.sleep(0.1)
        ended = time.time()
        self.scrub()
        return code, ended

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group."""
        if self._pid is not None:
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
        """Kill the worker if it still runs, delete its secrets, stop the zygote (before the actor goes)."""
        self.signal(signal.SIGKILL)
        self.scrub()
        self._zygote.close()
