"""The Ray executor: a job's workers are Ray actors, gang-scheduled in one placement group.

The control plane is a Ray driver (it runs beside a Ray node, usually the
head). Each job gets one placement group of one bundle per worker process,
``{"CPU": cpus_per_worker, "GPU": gpus_per_worker, "memory": its estimate}``:
all of its bundles or none. ``PACK`` for an all-reduce or single job (one
``torch.distributed`` group, on as few nodes as fit), ``SPREAD`` for a
decentralized one (a node's loss costs one worker group). Each process is a
:class:`~cantata.server.executors.ray_actor.WorkerHost` actor in its bundle,
which has its node's warm
:class:`~cantata.server.executors.ray_actor.NodeZygote` fork the worker; Ray
finds the nodes, tracks their health and hands out GPUs.

Launching a job is two rounds of calls: first each actor says where Ray put
it (its node's cluster address, its folder, its GPUs); then the control plane
mints each worker's certificate for that address (the gossip endpoint binds
there), builds its config, picks each group's rendezvous on its first
process's node, and sends each actor its files to start the worker.

The placement groups and actors are detached and named after the job
(``cantata-<job>-a<attempt>``, ``cantata-<job>-<worker>.<generation>``, in
the ``cantata`` namespace): they outlive the control plane, whose workers
train on while it is down, and a restarted control plane adopts them
(:meth:`RayExecutor.adopt`) and kills those no job of its store owns
(:meth:`RayExecutor.kill_strays`).

A worker whose node was lost (its actor died and Ray marks the node dead) is
reported as such (``WorkerExit.node_lost``): an all-reduce job restarts its
group from its latest checkpoint on the nodes that remain, and the lost node
does not count against the job's failure budget.

The cluster is inside the trust boundary and must be locked
(:func:`check_locked`): token authentication (``RAY_AUTH_MODE=token``) and
TLS (``RAY_USE_TLS=1``, node certificates from the platform CA). The server
refuses a cluster that accepts a client without the token.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from google.protobuf import json_format

from cantata.security.pki import CertificateAuthority, Principal, gossip_server_name
from cantata.server.executors.base import NotPlaceable, WorkerExit
from cantata.server.groups import decentralized, group_size, processes
from cantata.server.memory import worker_estimate
from cantata.server.ports import CertificateRegistry, SecretsBroker
from cantata.server.sandbox import Identities, base_environment, prepare_job_folder, store_environment
from cantata.server.store import JobRecord, WorkerRecord

log = logging.getLogger(__name__)
NAMESPACE = "cantata"
ZYGOTE_PREFIX = "zygote@"  # + the node's id: its NodeZygote actor (no job's name starts so)
READY_TIMEOUT_S = 120.0  # a placement group whose resources were free is placed in far less
PROBE_TIMEOUT_S = 60.0
NODE_DEATH_WAIT_S = 60.0  # how long a dead actor's exit waits for Ray to say whether its node died (~15 s)
RESOURCES_TTL_S = 1.0  # the cluster's resources are asked at most this often
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
TLS_ENV = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")
KILLED = -int(signal.SIGKILL)  # the exit status of a worker whose actor or node died


class RayClusterError(RuntimeError):
    """The Ray cluster is unreachable, or not locked as the platform requires."""


def check_locked(address: str, env: dict[str, str] | None = None) -> None:
    """Raise :class:`RayClusterError` unless this process is set up for a locked cluster that refuses strangers.

    Requires token authentication and TLS in the environment, then proves that a client holding
    the TLS certificates but not the token is refused by the cluster at ``address``.
    """
    env = dict(os.environ if env is None else env)
    if env.get("RAY_AUTH_MODE") != "token":
        raise RayClusterError("the Ray executor needs RAY_AUTH_MODE=token (and the cluster's token)")
    if not (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")):
        raise RayClusterError("RAY_AUTH_MODE=token needs RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    if env.get("RAY_USE_TLS") not in ("1", "true"):
        raise RayClusterError("the Ray executor needs RAY_USE_TLS=1 with " + ", ".join(TLS_ENV))
    missing = [name for name in TLS_ENV if not env.get(name)]
    if missing:
        raise RayClusterError(f"RAY_USE_TLS=1 needs {', '.join(missing)}")
    if probe_without_token(address, env):
        raise RayClusterError(f"the Ray cluster at {address} accepts a client without its token: refusing to use it")
    log.info("the Ray cluster at %s refused a client without its token", address)


def probe_without_token(address: str, env: dict[str, str], timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a driver with TLS but without the token connects to the cluster at ``address``.

    False only on proof: the cluster answered with its authentication error. A probe that neither
    connects nor is refused within ``timeout`` proves nothing, and is a :class:`RayClusterError`.
    """
    with tempfile.TemporaryDirectory() as home:  # no ~/.ray/auth_token either
        stranger = {k: v for k, v in env.items() if k not in AUTH_ENV} | {"HOME": home, "RAY_AUTH_MODE": "disabled"}
        code = f"import ray; ray.init(address={address!r}, logging_level='ERROR'); print('CONNECTED', flush=True)"
        try:
            done = subprocess.run(
                [sys.executable, "-c", code], env=stranger, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise RayClusterError(f"could not tell whether the Ray cluster at {address} refuses strangers") from exc
    if "CONNECTED" in done.stdout:
        return True
    if "InvalidAuthToken" in done.stderr or "AuthenticationError" in done.stderr:
        return False
    raise RayClusterError(f"probing the Ray cluster at {address} failed: {done.stderr.strip()[-500:]}")


@dataclass
class _Worker:
    actor: Any
    node: dict
    pid: int
    done: Any  # the ObjectRef of WorkerHost.wait (None: the actor is gone)
    spawned: float
    log_offset: int = 0
    log_ref: Any = None


@dataclass
class _Job:
    group: Any  # the placement group (None: an adopted job's was gone)
    workers: dict[int, _Worker] = field(default_factory=dict)
    rendezvous: list[str] = field(default_factory=list)
    attack: dict | None = None
    exited: dict[int, int] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)
    kill_at: float | None = None
    generations: dict[int, int] = field(default_factory=dict)  # actors started for each worker, less one
    dead: dict[int, float] = field(default_factory=dict)  # worker -> when its actor was seen dead, its node not yet


class RayExecutor:
    """Workers as Ray actors on a locked cluster; the control plane is the driver."""

    def __init__(
        self,
        address: str,
        jobs_dir: Path,
        ca: CertificateAuthority,
        server_address: Callable[[str], str],
        worker_cert_lifetime: dt.timedelta,
        *,
        secrets: SecretsBroker,
        certificates: CertificateRegistry,
        grace: float,
        identities: Identities,
        memory_limit: Callable[[JobRecord], int],
        note: Callable[[str, str], None] = lambda job_id, message: None,
    ):
        self._address = address
        self._jobs_dir = jobs_dir
        self._ca = ca
        self._server_address = server_address  # given the driver's node address: where workers reach the server
        self._cert_lifetime = worker_cert_lifetime
        self._secrets = secrets
        self._certificates = certificates
        self._grace = grace
        self._identities = identities
        self._memory_limit = memory_limit
        self._note = note  # a line in the job's events (where it was placed)
        self._jobs: dict[str, _Job] = {}
        self._resources: tuple[float, dict, dict, dict] = (0.0, {}, {}, {})
        self._remote: Any = None  # the WorkerHost actor class, once made remote
        self._zygotes: dict[str, Any] = {}  # node id -> its NodeZygote actor

    # ---- the cluster --------------------------------------------------------
    def start(self) -> None:
        import ray

        check_locked(self._address)
        on_sigterm = signal.getsignal(signal.SIGTERM)
        ray.init(address=self._address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
        if on_sigterm is not None:  # ray.init makes SIGTERM exit at once: a stop must stay graceful
            with contextlib.suppress(ValueError):  # not the main thread: ray.init left it alone too
                signal.signal(signal.SIGTERM, on_sigterm)
        self._server = self._server_address(ray.util.get_node_ip_address())
        for node in ray.nodes():  # their zygotes warm up (import torch) before the first job
            if node.get("Alive"):
                self._zygote(node["NodeID"])

    def _zygote(self, node_id: str) -> Any:
        """The node's :class:`~cantata.server.executors.ray_actor.NodeZygote` actor, started if it is not there."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from cantata.server.executors.ray_actor import NodeZygote

        if node_id not in self._zygotes:
            self._zygotes[node_id] = (
                ray.remote(NodeZygote)
                .options(
                    name=f"{ZYGOTE_PREFIX}{node_id}",
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,
                    max_concurrency=16,
                    max_restarts=-1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote()
            )
        return self._zygotes[node_id]

    def _cluster(self) -> tuple[dict, dict, dict]:
        """The cluster's total and free resources, and the most of each that one live node has."""
        import ray

        at, total, free, largest = self._resources
        if time.monotonic() - at > RESOURCES_TTL_S:
            total, free = ray.cluster_resources(), ray.available_resources()
            largest = {}
            for node in ray.nodes():
                if node.get("Alive"):
                    for resource, amount in node.get("Resources", {}).items():
                        largest[resource] = max(largest.get(resource, 0.0), amount)
            self._resources = (time.monotonic(), total, free, largest)
        return total, free, largest

    @staticmethod
    def bundle(job: JobRecord) -> dict[str, float]:
        """What one worker process of ``job`` asks of its node."""
        spec = job.spec
        return {
            "CPU": 1.0,
            "GPU": float(spec.gpus_per_worker),
            "memory": float(worker_estimate(spec)),
        }

    def placement(self, job: JobRecord) -> None:
        n = processes(job.spec)
        total, free, largest = self._cluster()
        bundle = self.bundle(job)
        for resource, amount in bundle.items():  # first what no wait can change, then what is free now
            if amount > largest.get(resource, 0.0):
                raise NotPlaceable(
                    f"each worker needs {_amount(resource, amount)}; no node of the Ray cluster has that many",
                    never=True,
                    retry=True,
                )
            wanted = amount * n
            if wanted > total.get(resource, 0.0):
                raise NotPlaceable(
                    f"needs {_amount(resource, wanted)}; the Ray cluster has {_amount(resource, total.get(resource, 0.0))}",
                    never=True,
                    retry=True,
                )
        for resource, amount in bundle.items():
            wanted = amount * n
            if wanted > free.get(resource, 0.0):
                raise NotPlaceable(
                    f"waiting for {_amount(resource, wanted)} ({_amount(resource, free.get(resource, 0.0))} free)",
                    retry=True,
                )

    # ---- launching ----------------------------------------------------------
    def launch(self, job: JobRecord, *, attack: dict | None = None) -> dict[int, int]:
        import ray
        from ray.util.placement_group import placement_group

        from cantata.server.executors.ray_actor import WorkerHost

        n = processes(job.spec)
        # SPREAD, not STRICT_SPREAD: a lost node's bundle must be placeable again on the nodes that remain
        strategy = "SPREAD" if decentralized(job.spec) else "PACK"
        group = placement_group(
            [self.bundle(job)] * n, strategy=strategy, name=f"cantata-{job.id}-a{job.attempts}", lifetime="detached"
        )
        running = self._jobs[job.id] = _Job(group, attack=attack)
        self._resources = (0.0, {}, {}, {})
        actors: dict[int, Any] = {}
        try:
            identity = self._identities.acquire(job.id)
            store = job.spec.checkpoint_store
            if store.startswith("file://"):  # under a root every node mounts (parse_job_spec saw to it)
                prepare_job_folder(Path(unquote(urlparse(store).path)), job.tenant, job.id, identity)
            ray.get(group.ready(), timeout=READY_TIMEOUT_S)
            actors.update({i: self._actor(WorkerHost, job, i) for i in range(n)})
            nodes = dict(zip(actors, ray.get([a.node.remote() for a in actors.values()]), strict=True))
            size = group_size(job.spec)
            running.rendezvous = [_rendezvous(nodes[g * size]) for g in range(n // size)]
            secrets = self._secrets.worker_secrets(job)
            uid = identity.uid if identity else None
            pids = ray.get([self._start(job, i, a, nodes[i], secrets, uid) for i, a in actors.items()])
            for i, pid in enumerate(pids):
                self._watch(job.id, i, actors[i], nodes[i], pid)
            self._note(job.id, "placed on " + ", ".join(f"worker {i}: {nodes[i]['ip']}" for i in sorted(nodes)))
        except BaseException:
            for actor in actors.values():
                ray.kill(actor, no_restart=True)
            self.release(job.id)
            raise
        return {i: w.pid for i, w in running.workers.items()}

    def _actor(self, host_class: type, job: JobRecord, i: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle(job)
        if self._remote is None:
            self._remote = ray.remote(host_class)
        running = self._jobs[job.id]
        running.generations[i] = running.generations.get(i, -1) + 1  # a killed actor's name is freed later
        return self._remote.options(
            name=f"cantata-{job.id}-{i}.{running.generations[i]}",
            namespace=NAMESPACE,
            num_cpus=0,  # the bundle holds the resources; the actor itself asks for none beyond them
            num_gpus=bundle["GPU"],
            max_concurrency=8,  # wait() blocks while signal() and read_log() answer
            lifetime="detached",  # the worker trains on while the control plane restarts
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._jobs[job.id].group, placement_group_bundle_index=i
            ),
        ).remote(job.id, i)

    def _start(self, job: JobRecord, i: int, actor: Any, node: dict, secrets: dict, uid: int | None) -> Any:
        """Mint worker ``i``'s certificate for its node, build its config and files; the ObjectRef of its pid."""
        principal = Principal.worker(job.id, i)
        bundle = self._ca.issue_bundle(
            principal,
            lifetime=self._cert_lifetime,
            server=True,
            dns_names=[gossip_server_name(job.id, i)],
            ips=[node["ip"]],
        )
        self._certificates.record_certificate(
            bundle.certificate.serial_number, principal.uri, bundle.certificate.not_valid_after_utc
        )
        folder = Path(node["folder"])
        size = group_size(job.spec)
        threads = max(1, int(self.bundle(job)["CPU"]))
        config = {  # the layout cantata.trainer.config.WorkerConfig.load reads
            "job_id": job.id,
            "tenant": job.tenant,
            "workers": job.spec.workers,
            "attempt": job.attempts,
            "server": self._server,
            "ca": str(folder / "ca.pem"),
            "threads": threads,
            "attack": self._jobs[job.id].attack,
            "spec": json_format.MessageToDict(job.spec, preserving_proto_field_name=True),
            "rendezvous": self._jobs[job.id].rendezvous[i // size],
            "worker": i,
            "cert": str(folder / "worker.pem"),
            "key": str(folder / "worker.key"),
            "gossip_host": node["ip"],
            "store_env": store_environment(job.spec.checkpoint_store),
            **secrets,
        }
        files = {
            "ca.pem": self._ca.cert_pem,
            "worker.pem": bundle.cert_pem,
            "worker.key": bundle.key_pem,
            "worker.json": json.dumps(config, indent=2).encode(),
        }
        argv = ["--config", str(folder / "worker.json"), "--job", job.id]
        env = {
            **base_environment(),
            "OMP_NUM_THREADS": str(threads),
            "HOME": str(folder),
            "TMPDIR": str(folder / "tmp"),
        }
        if node["gpus"]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(node["gpus"])
        request = {
            "argv": argv,
            "entry": "cantata.trainer.worker:main",
            "title": " ".join(["python", "-m", "cantata.trainer.worker", *argv]),
            "env": env,
            "cwd": str(folder),
            "log": str(folder / "worker.log"),
            "uid": uid,
            "gid": uid,
            "memory_bytes": self._memory_limit(job),
        }
        rendezvous = self._jobs[job.id].rendezvous[i // size]
        return actor.start.remote(files, request, uid, self._zygote(node["node_id"]), rendezvous)

    def _watch(self, job_id: str, i: int, actor: Any, node: dict, pid: int) -> None:
        running = self._jobs[job_id]
        running.workers[i] = _Worker(actor, node, pid, actor.wait.remote(), time.monotonic())
        running.exited.pop(i, None)
        running.killed.discard(i)
        running.dead.pop(i, None)
        log = self.log_path(job_id, i)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.parent.chmod(0o700)
        log.touch(mode=0o600)
        running.workers[i].log_offset = log.stat().st_size

    def relaunch(self, job: JobRecord, worker: int) -> int:
        """Start worker ``worker`` again in its bundle (Ray places the bundle anew if its node died)."""
        import ray

        from cantata.server.executors.ray_actor import WorkerHost

        running = self._jobs[job.id]
        old = running.workers.get(worker)
        if old is not None and old.actor is not None:
            ray.kill(old.actor, no_restart=True)
        actor = self._actor(WorkerHost, job, worker)
        node = ray.get(actor.node.remote(), timeout=READY_TIMEOUT_S)
        size = group_size(job.spec)
        if size == 1:  # its own group: the rendezvous moves with it
            running.rendezvous[worker] = _rendezvous(node)
        identity = self._identities.acquire(job.id)
        pid = ray.get(
            self._start(job, worker, actor, node, self._secrets.worker_secrets(job), identity.uid if identity else None)
        )
        self._watch(job.id, worker, actor, node, pid)
        self._note(job.id, f"worker {worker} placed on {node['ip']}")
        return pid

    # ---- watching and stopping ------------------------------------------------
    def poll(self) -> list[WorkerExit]:
        import ray

        exits: list[tuple[float, WorkerExit]] = []
        for job_id, running in self._jobs.items():
            for i, w in running.workers.items():  # an adopted worker whose actor was gone
                if w.done is None and i not in running.exited:
                    running.exited[i] = KILLED
                    exits.append((time.time(), WorkerExit(job_id, i, KILLED)))
            live = {w.done: i for i, w in running.workers.items() if i not in running.exited and w.done is not None}
            if live:
                ready, _ = ray.wait(list(live), num_returns=len(live), timeout=0)
                for ref in ready:
                    i, lost = live[ref], False
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError:  # the actor or its node died: the worker is gone
                        seen = running.dead.setdefault(i, time.monotonic())
                        lost = self._node_lost(running.workers[i].node["node_id"])
                        if not lost and time.monotonic() - seen < NODE_DEATH_WAIT_S:
                            continue  # until Ray tells whether the node went with it
                        result = (KILLED, time.time())
                    if result is None:  # still running: wait again
                        running.workers[i].done = running.workers[i].actor.wait.remote()
                        continue
                    code, ended = result
                    running.exited[i] = code
                    exits.append((ended, WorkerExit(job_id, i, code, node_lost=lost)))
            self._copy_logs(job_id, running)
            if running.kill_at is not None and time.monotonic() >= running.kill_at:
                for i, w in running.workers.items():
                    if i not in running.exited and w.actor is not None:
                        w.actor.signal.remote(signal.SIGKILL)
        return [e for _, e in sorted(exits, key=lambda e: e[0])]  # in the order they died

    def _node_lost(self, node_id: str) -> bool:
        """Whether Ray declared the node dead (asked now: an actor's death may come first)."""
        import ray

        self._zygotes.pop(node_id, None)
        self._resources = (0.0, {}, {}, {})
        return any(n["NodeID"] == node_id and not n.get("Alive") for n in ray.nodes())

    def _copy_logs(self, job_id: str, running: _Job) -> None:
        """Append what each worker logged on its node to its log here (``cantata jobs logs`` reads that)."""
        import ray

        for i, w in running.workers.items():
            if w.actor is None:
                continue
            if w.log_ref is not None:
                ready, _ = ray.wait([w.log_ref], timeout=0)
                if not ready:
                    continue
                try:
                    data = ray.get(w.log_ref)
                except ray.exceptions.RayError:
                    w.log_ref = None
                    continue
                if data:
                    with self.log_path(job_id, i).open("ab") as f:
                        f.write(data)
                    w.log_offset += len(data)
                w.log_ref = None
            if i not in running.exited:
                w.log_ref = w.actor.read_log.remote(w.log_offset)

    def finished_jobs(self) -> list[str]:
        return [job_id for job_id, r in self._jobs.items() if r.workers and len(r.exited) == len(r.workers)]

    def release(self, job_id: str) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        running = self._jobs.pop(job_id, None)
        if running is None:
            return
        actors = [w.actor for w in running.workers.values() if w.actor is not None]
        for stopped in [a.stop.remote() for a in actors]:
            with contextlib.suppress(ray.exceptions.RayError):  # its node is gone, and its folder with it
                ray.get(stopped, timeout=10)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if running.group is not None:
            remove_placement_group(running.group)
        self._resources = (0.0, {}, {}, {})
        self._identities.release(job_id)

    def terminate(self, job_id: str) -> None:
        running = self._jobs.get(job_id)
        if running is None or running.kill_at is not None:
            return
        running.kill_at = time.monotonic() + self._grace
        for i, w in running.workers.items():
            if i not in running.exited and w.actor is not None:
                w.actor.signal.remote(signal.SIGTERM)

    def kill(self, job_id: str, worker: int) -> None:
        running = self._jobs[job_id]
        running.killed.add(worker)
        if running.workers[worker].actor is not None:
            running.workers[worker].actor.signal.remote(signal.SIGKILL)

    def alive_workers(self, job_id: str) -> int:
        running = self._jobs.get(job_id)
        return len(running.workers) - len(running.exited) if running else 0

    def running_workers(self) -> int:
        return sum(len(r.workers) - len(r.exited) for r in self._jobs.values())

    def is_running(self, job_id: str) -> bool:
        return job_id in self._jobs

    def live_workers(self) -> list[tuple[str, int, float]]:
        return [
            (job_id, i, w.spawned)
            for job_id, r in self._jobs.items()
            for i, w in r.workers.items()
            if i not in r.exited and i not in r.killed
        ]

    # ---- files on this server -------------------------------------------------
    def workspace(self, job_id: str) -> Path:
        return self._jobs_dir / job_id

    def log_path(self, job_id: str, worker: int) -> Path:
        return self.workspace(job_id) / f"worker-{worker}.log"

    def log_tail(self, job_id: str, worker: int, lines: int = 3) -> str:
        try:
            text = self.log_path(job_id, worker).read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])

    def scrub(self, job_id: str) -> None:
        """Nothing secret is kept here: configs and keys live on the nodes, deleted as each worker exits."""

    def scrub_all(self) -> None:
        """Nothing secret is kept here (see :meth:`scrub`)."""

    def adopt(self, job: JobRecord, workers: list[WorkerRecord], *, attack: dict | None = None) -> int:
        """Find the job's placement group and worker actors (detached, by name) that an earlier control plane
        started; how many of its workers still run. A worker whose actor is gone is reported as killed at the
        next :meth:`poll`, and judged like any exit."""
        import ray
        from ray.util.placement_group import get_placement_group

        try:
            group = get_placement_group(f"cantata-{job.id}-a{job.attempts}")
        except ValueError:
            group = None
        running = self._jobs[job.id] = _Job(group, attack=attack)
        names = _job_actors(job.id)
        size = group_size(job.spec)
        running.rendezvous = [""] * (len(workers) // size + 1)
        alive = 0
        for record in workers:
            generations = [
                int(n.rsplit(".", 1)[1]) for n in names if n.rsplit(".", 1)[0] == f"cantata-{job.id}-{record.idx}"
            ]
            actor: Any = None
            described: dict = {}
            if generations:
                running.generations[record.idx] = max(generations)
                name = f"cantata-{job.id}-{record.idx}.{max(generations)}"
                with contextlib.suppress(ValueError, ray.exceptions.RayError):
                    actor = ray.get_actor(name, namespace=NAMESPACE)
                    described = ray.get(actor.describe.remote(), timeout=PROBE_TIMEOUT_S)
            if not described.get("pid"):  # its actor (or its node) is gone, or it never started the worker
                running.workers[record.idx] = _Worker(None, {"node_id": ""}, record.pid, None, time.monotonic())
                continue
            self._watch(job.id, record.idx, actor, described, described["pid"])
            if described["rendezvous"]:
                running.rendezvous[record.idx // size] = described["rendezvous"]
            alive += 1
        return alive

    def started_at(self, job_id: str, worker: int) -> int:
        return 0  # an actor on some node, not a process of this machine

    def kill_strays(self) -> list[int]:
        """Kill the worker actors and remove the placement groups no adopted job owns (say, a job's last attempt's)."""
        import ray
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        killed = []
        for name in ray.util.list_named_actors():
            if name.startswith("cantata-") and _job_of(name) not in self._jobs:
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                    killed.append(name)
        owned = {r.group.id.hex() for r in self._jobs.values() if r.group is not None}
        for group_id, group in ray.util.placement_group_table().items():
            if (
                (group.get("name") or "").startswith("cantata-")
                and group["state"] != "REMOVED"
                and group_id not in owned
            ):
                with contextlib.suppress(Exception):
                    remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
                    killed.append(group["name"])
        if killed:
            log.warning("killed Ray actors and placement groups that no job owns: %s", ", ".join(killed))
        return []  # no pids: these are actors on the cluster's nodes

    def detach(self) -> None:
        """Let go of the cluster and leave the detached actors training, for the next control plane to adopt."""
        import ray

        self._jobs.clear()
        ray.shutdown()

    def kill_orphan(self, worker: WorkerRecord, job_id: str) -> None:
        """Kill the job's actors an earlier control plane left (a restarting job's), by name, and its groups."""
        import ray

        for name in _job_actors(job_id):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)

    def stop_all(self) -> None:
        import ray

        for job_id in list(self._jobs):
            self.terminate(job_id)
        deadline = time.monotonic() + self._grace + 5
        while self._jobs and time.monotonic() < deadline:
            self.poll()
            for job_id in self.finished_jobs():
                self.release(job_id)
            time.sleep(0.05)
        for job_id in list(self._jobs):
            self.release(job_id)
        ray.shutdown()


def _rendezvous(node: dict) -> str:
    """A torch.distributed rendezvous on ``node`` (a :meth:`WorkerHost.node`), at the free port it found."""
    return f"tcp://{node['ip']}:{node['port']}"


def _job_of(actor_name: str) -> str:
    """The job id in a worker actor's name ``cantata-<job>-<worker>.<generation>``."""
    return actor_name.removeprefix("cantata-").rsplit("-", 1)[0]


def _job_actors(job_id: str) -> list[str]:
    import ray

    return [n for n in ray.util.list_named_actors() if n.startswith("cantata-") and _job_of(n) == job_id]


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{value / (1 << 30):.1f} GiB of memory"
    return f"{value:g} {resource}s"
