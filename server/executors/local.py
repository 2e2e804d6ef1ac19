"""The local executor: a job's workers are child processes of this server, forked from its zygote.

It is :class:`~cantata.server.workers.launcher.WorkerLauncher` (the sandbox, the
per-worker certificates and configs), plus placement on this node: at most
``slots`` worker processes at once, the node's GPUs, each worker of a job
with ``gpus_per_worker`` getting devices of its own through
``CUDA_VISIBLE_DEVICES``, and the node's memory: a job reserves its ranks'
estimate (:func:`~cantata.server.jobs.memory.job_estimate`) from its launch until
its workers are all gone, and one that does not fit beside the running jobs
waits. The GPUs are counted once at start, by
``torch.cuda.device_count()`` in a subprocess (the server never imports
torch), or given by ``server start --gpus``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cantata.server.executors.base import NotPlaceable
from cantata.server.executors.registry import ExecutorSetup
from cantata.server.jobs.groups import processes
from cantata.server.jobs.memory import job_estimate, node_capacity, size
from cantata.server.store import JobRecord, WorkerRecord
from cantata.server.workers.launcher import WorkerLauncher

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees; absent without the driver


def count_gpus() -> int:
    """The GPUs torch sees on this node (0 without an NVIDIA driver, without starting torch)."""
    if not NVIDIA_GPUS.is_dir():
        return 0
    code = "import torch; print(torch.cuda.device_count())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return int(done.stdout.strip().splitlines()[-1])


class LocalExecutor(WorkerLauncher):
    """Workers on this machine: ``slots`` processes, ``gpus`` GPUs (-1: count them) and ``memory`` bytes at most."""

    def __init__(self, *args, slots: int, memory: int, gpus: int = -1, **kwargs):
        super().__init__(*args, **kwargs)
        self._slots = slots
        self._memory = memory
        self._reserved: dict[str, int] = {}  # job -> the memory its ranks' estimate holds
        self.gpus = count_gpus() if gpus < 0 else gpus
        self._free_gpus = list(range(self.gpus))
        self._devices: dict[str, dict[int, list[int]]] = {}  # job -> process index -> its GPUs

    def placement(self, job: JobRecord) -> None:
        wanted = processes(job.spec)
        if wanted > self._slots:
            raise NotPlaceable(f"needs {wanted} worker processes; this node runs at most {self._slots}", never=True)
        gpus = wanted * job.spec.gpus_per_worker
        if gpus > self.gpus:
            raise NotPlaceable(f"needs {gpus} GPUs; this node has {self.gpus}", never=True)
        free = self._slots - self.running_workers()
        if wanted > free:
            raise NotPlaceable(f"waiting for {wanted} worker slots ({free} free)")
        if gpus > len(self._free_gpus):
            raise NotPlaceable(f"waiting for {gpus} GPUs ({len(self._free_gpus)} free)")
        need = job_estimate(job.spec)
        if need > self._memory:
            raise NotPlaceable(f"needs {size(need)} of memory; this node has {size(self._memory)}", never=True)
        free = self._memory - sum(self._reserved.values())
        if need > free:
            raise NotPlaceable(
                f"waiting for {size(need)} of memory ({size(free)} of this node's {size(self._memory)} free "
                f"beside {len(self._reserved)} running job(s))"
            )

    def launch(self, job: JobRecord, *, attack: dict | None = None, fault: dict | None = None) -> dict[int, int]:
        per_worker = job.spec.gpus_per_worker
        if per_worker:
            self._devices[job.id] = {
                i: [self._free_gpus.pop(0) for _ in range(per_worker)] for i in range(processes(job.spec))
            }
        self._reserved[job.id] = job_estimate(job.spec)
        try:
            return super().launch(job, attack=attack, fault=fault)
        except BaseException:
            self._give_back(job.id)
            raise

    def adopt(
        self, job: JobRecord, workers: list[WorkerRecord], *, attack: dict | None = None, fault: dict | None = None
    ) -> int:
        self._reserved[job.id] = job_estimate(job.spec)
        return super().adopt(job, workers, attack=attack, fault=fault)

    def detach(self) -> None:
        super().detach()
        self._reserved.clear()

    def devices(self, job_id: str, worker: int) -> list[int]:
        return self._devices.get(job_id, {}).get(worker, [])

    def release(self, job_id: str) -> None:
        super().release(job_id)
        self._give_back(job_id)

    def _give_back(self, job_id: str) -> None:
        self._reserved.pop(job_id, None)
        for devices in self._devices.pop(job_id, {}).values():
            self._free_gpus.extend(devices)
        self._free_gpus.sort()


def build(setup: ExecutorSetup) -> LocalExecutor:
    """The local executor of a server (:mod:`cantata.server.executors.registry`)."""
    settings = setup.settings
    return LocalExecutor(
        setup.jobs_dir,
        setup.ca,
        f"{setup.connect_host}:{setup.port}",
        setup.cert_lifetime,
        secrets=setup.secrets,
        certificates=setup.certificates,
        grace=settings.cancel_grace_seconds,
        identities=setup.identities,
        memory_limit=setup.memory_limit,
        warm=settings.warm_workers,
        confinement=setup.confinement,
        slots=settings.max_workers_on_node,
        memory=node_capacity(settings.node_memory_mib),
        gpus=setup.gpus,
    )
