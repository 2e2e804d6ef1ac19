"""Cantata's one Ray actor on each node: it starts, watches and stops the workers Ray reserved room for there.

:class:`NodeHost` is one named, detached actor per node (no CPU of its own).
It keeps a warm zygote (:mod:`cantata.server.workers.zygote`: torch and the training
modules imported once) that forks every worker of its node into the same
sandbox as on the local executor (allow-listed environment, the job's uid, a
memory limit). A job's placement group only reserves the job's bundles (gang
scheduling, ``PACK`` or ``SPREAD``, the GPUs); nothing is started in them, so
a worker starts from a process that has imported torch, not from a fresh
interpreter that imports Ray and torch.

The host runs no tenant code and unpickles nothing of a tenant's. The files
the control plane built for a worker (its own certificate and key, its 0600
config) reach the host as the arguments of :meth:`NodeHost.start`, an actor
call over Ray's TLS (never a constructor's arguments, which the cluster's GCS
keeps, nor an environment); it writes them into a 0700 folder of the node
owned by the job's uid and has its zygote fork ``cantata.trainer.worker``
there, with the GPUs Ray reserved in the worker's bundle (:func:`bundle_gpus`)
as ``CUDA_VISIBLE_DEVICES``, and gloo bound to the interface that carries the
node's cluster address (``GLOO_SOCKET_IFNAME``: by default gloo takes the
address the host name resolves to, often a loopback one, which a group
spanning nodes cannot reach). The config and key are deleted once the worker
exits.

What the host knows of each worker is on the node's disk, root's alone, in
a folder of its own (``.hosts/<node id>/``): a record
(``workers/<job>-<worker>.json``: pid, start time, generation, rendezvous,
GPUs) and the exit status its zygote writes (``exits/<job>-<worker>.json``). A host that restarts, and a control plane
that restarts, find every worker again from them; the host and the workers
outlive the control plane that started them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cantata.security.process_sandbox import SpawnRequest
from cantata.server.config import write_private
from cantata.server.workers.process_identity import running, start_time
from cantata.server.workers.sandbox import base_environment
from cantata.server.workers.uid_reclaim import reclaim
from cantata.server.workers.zygote import Zygote

NODE_ROOT_ENV = "CANTATA_RAY_WORKSPACES"  # where workers' folders go on a node (default: <tmp>/cantata-ray)
SECRET_SUFFIXES = (".json", ".key")
LOG_CHUNK = 1 << 20
KILLED = -int(signal.SIGKILL)
STATUS_GRACE_S = 5.0  # a reaped worker's status is written right after; past this its zygote died with it
POLL_S = 0.1
SIOCGIFADDR = 0x8915  # ioctl: an interface's IPv4 address


def node_root() -> Path:
    return Path(os.environ.get(NODE_ROOT_ENV) or Path(tempfile.gettempdir()) / "cantata-ray")


def bundle_gpus() -> list[str]:
    """The GPUs Ray assigned to the calling task: run in a bundle, asking for all of its GPUs, they are the bundle's."""
    import ray

    return [str(g) for g in ray.get_gpu_ids()]


def interface_of(ip: str) -> str:
    """The name of this machine's network interface whose address is ``ip`` ("" if none is)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
            answer = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            if socket.inet_ntoa(answer[20:24]) == ip:
                return name
    return ""


@dataclass
class Hosted:
    """One worker process a host started (its record on the node)."""

    job_id: str
    worker: int
    generation: int  # how many times the control plane started this worker before, on any node
    pid: int
    started: int  # its start time (with the pid, it names the process)
    rendezvous: str
    gpus: list[str] = field(default_factory=list)


class NodeHost:
    """The node's warm zygote and the workers forked from it (async: a worker's wait holds no thread)."""

    def __init__(self) -> None:
        import ray  # in the actor's process, which Ray started

        self.ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.root = node_root()
        self.interface = interface_of(self.ip)
        # this host's own (the root may be shared by nodes), and root's: a worker can neither read nor forge them
        self.private = self.root / ".hosts" / self.node_id
        for private in (self.root / ".hosts", self.private, self.private / "workers", self.private / "exits"):
            private.mkdir(mode=0o700, parents=True, exist_ok=True)
            private.chmod(0o700)
        self._zygote = Zygote(warm=True, env=base_environment())
        self._zygote.start()  # warms up (imports torch) before the first job asks

    # ---- files on the node ---------------------------------------------------------
    def _folder(self, job_id: str, worker: int) -> Path:
        return self.root / job_id / f"worker-{worker}"

    def _record_path(self, job_id: str, worker: int) -> Path:
        return self.private / "workers" / f"{job_id}-{worker}.json"

    def _status_path(self, job_id: str, worker: int) -> Path:
        return self.private / "exits" / f"{job_id}-{worker}.json"

    def _record(self, job_id: str, worker: int) -> Hosted | None:
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
            return Hosted(**json.loads(self._record_path(job_id, worker).read_text()))
        return None

    def _records(self) -> list[Hosted]:
        found = []
        for path in (self.private / "workers").glob("*.json"):
            with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
                found.append(Hosted(**json.loads(path.read_text())))
        return found

    def _exit_code(self, job_id: str, worker: int, pid: int) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            status = json.loads(self._status_path(job_id, worker).read_text())
            if status["pid"] == pid:
                return int(status["code"])
        return None

    # ---- the control plane's calls ---------------------------------------------------
    async def node(self) -> dict:
        """Where this host runs: the node's id and cluster address, and where its workers' folders go."""
        return {"node_id": self.node_id, "ip": self.ip, "root": str(self.root)}

    async def free_port(self) -> int:
        """A free TCP port on this node's cluster address, for a torch.distributed rendezvous here."""
        with socket.socket() as s:
            s.bind((self.ip, 0))
            return s.getsockname()[1]

    async def start(
        self,
        job_id: str,
        worker: int,
        generation: int,
        files: dict[str, bytes],
        request: dict,
        rendezvous: str,
        gpus: list[str],
    ) -> int:
        """Write the worker's files (secrets 0600) into its folder, owned by the request's uid, and fork it from
        the warm zygote as ``request`` (a :class:`SpawnRequest`) says; its pid. A process this node still runs for
        the same worker (an earlier start) is killed first: one process per worker."""
        await self.stop(job_id, worker)
        folder, uid = self._folder(job_id, worker), request["uid"]
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.parent.chmod(0o711)
        folder.mkdir(exist_ok=True)
        folder.chmod(0o700)
        (folder / "tmp").mkdir(exist_ok=True)
        for name, data in files.items():
            write_private(folder / name, data)
        (folder / "worker.log").touch(mode=0o600)
        if uid is not None:
            for path in [folder, *folder.iterdir()]:
                os.chown(path, uid, request["gid"])
        status = self._status_path(job_id, worker)
        env = request["env"] | ({"GLOO_SOCKET_IFNAME": self.interface} if self.interface else {})
        spawn = SpawnRequest(**{**request, "env": env, "status": str(status)})
        pid = await asyncio.to_thread(self._zygote.spawn, spawn)  # minutes, while the zygote still warms up
        hosted = Hosted(job_id, worker, generation, pid, start_time(pid), rendezvous, gpus)
        write_private(self._record_path(job_id, worker), json.dumps(asdict(hosted)).encode())
        return pid

    async def wait(self, job_id: str, worker: int, pid: int, timeout_s: float = 30.0) -> tuple[int, float] | None:
        """Until worker process ``pid`` exits (its status, when; its secrets deleted), or None after ``timeout_s``.

        Bounded, so that the calls of a control plane that died do not pile up in the actor.
        """
        hosted = self._record(job_id, worker)
        if hosted is None or hosted.pid != pid:  # stopped, or started again since: that process is gone
            return KILLED, time.time()
        deadline, gone_at = time.monotonic() + timeout_s, None
        while (code := self._exit_code(job_id, worker, pid)) is None:
            if not running(pid, hosted.started):
                gone_at = gone_at or time.monotonic()
                if time.monotonic() - gone_at > STATUS_GRACE_S:  # its zygote died too: no status will come
                    code = KILLED
                    break
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_S)
        self._scrub(job_id, worker)
        return code, time.time()

    async def signal(self, job_id: str, worker: int, sig: int) -> None:
        """Send ``sig`` to the worker's process group (never to a process that reused its pid)."""
        hosted = self._record(job_id, worker)
        if hosted is not None and running(hosted.pid, hosted.started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(hosted.pid, sig)

    async def read_log(self, job_id: str, worker: int, offset: int, wait_s: float = 1.0) -> bytes:
        """The worker's log from ``offset`` on; waits up to ``wait_s`` for something new."""
        deadline = time.monotonic() + wait_s
        while True:
            with contextlib.suppress(FileNotFoundError), (self._folder(job_id, worker) / "worker.log").open("rb") as f:
                f.seek(offset)
                data = f.read(LOG_CHUNK)
                if data:
                    return data
            if time.monotonic() >= deadline:
                return b""
            await asyncio.sleep(POLL_S * 2)

    async def workers(self, job_id: str) -> list[dict]:
        """The records of the job's workers this node started (what a restarted control plane adopts)."""
        return [asdict(h) | {"node_id": self.node_id, "ip": self.ip} for h in self._records() if h.job_id == job_id]

    async def stop(self, job_id: str, worker: int, generation: int | None = None) -> None:
        """Kill the worker if it still runs, delete its secrets, status and record (only ``generation``'s, if given)."""
        hosted = self._record(job_id, worker)
        if hosted is None or (generation is not None and hosted.generation != generation):
            return
        if running(hosted.pid, hosted.started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(hosted.pid, signal.SIGKILL)
        self._scrub(job_id, worker)
        self._status_path(job_id, worker).unlink(missing_ok=True)
        self._record_path(job_id, worker).unlink(missing_ok=True)

    async def reclaim(self, uid: int, groups: list[int], job_id: str, folders: list[str]) -> float:
        """Take ``uid`` back on this node once the job's workers are gone: kill every process of it, hand the job's
        folders here (its workspace, and ``folders``: its ``file://`` checkpoint folder, where this node mounts it)
        back to root, delete what it left in the scratch places (:mod:`cantata.server.workers.uid_reclaim`): a checkpoint
        folder under ``/tmp`` is handed back before that, never deleted. Raises ``ReclaimError`` if it cannot; the
        seconds it took."""
        return await asyncio.to_thread(reclaim, uid, groups, [self.root / job_id, *map(Path, folders)])

    async def stop_jobs(self, *, only: str | None = None, keep: list[str] | None = None) -> list[str]:
        """:meth:`stop` every worker of job ``only``, or of every job not in ``keep``; the jobs it stopped."""
        stopped = set()
        for hosted in self._records():
            if hosted.job_id == only or (only is None and hosted.job_id not in (keep or [])):
                await self.stop(hosted.job_id, hosted.worker)
                stopped.add(hosted.job_id)
        return sorted(stopped)

    def _scrub(self, job_id: str, worker: int) -> None:
        """Delete the worker's config and key."""
        for path in self._folder(job_id, worker).glob("*"):
            if path.suffix in SECRET_SUFFIXES:
                path.unlink(missing_ok=True)
