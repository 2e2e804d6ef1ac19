"""The Ray executor: a job's workers are gang-scheduled in one placement group, and started by each node's host.

The control plane is a Ray driver (it runs beside a Ray node, usually the
head). Each job gets one placement group of one bundle per worker process,
``{"CPU": cpus_per_worker, "GPU": gpus_per_worker, "memory": its rank's estimate}``
(:func:`~cantata.server.jobs.memory.worker_estimate`, which shrinks as the mesh shards the model):
all of its bundles or none. ``PACK`` for an all-reduce or single job (one
``torch.distributed`` group, on as few nodes as fit), ``SPREAD`` for a
decentralized one (a node's loss costs one worker group). The group only
reserves: each worker is forked by the warm zygote of the
:class:`~cantata.server.executors.ray_actor.NodeHost` actor of the node its
bundle is on, with the GPUs Ray assigned to that bundle. Ray finds the
nodes, places the bundles, tracks the nodes' health and hands out GPUs; no
actor process starts for a job (a GPU job's bundles each run one short task,
in Ray's pooled worker processes, to learn their devices).

Launching a job is two rounds of calls: first where Ray placed each bundle
(its node's host says the node's cluster address and gives a free port for
each group's rendezvous; a task in each bundle of a GPU job says its GPUs);
then the control plane mints each worker's certificate for that address (the
gossip endpoint binds there), builds its config, and sends each host its
workers' files to start them.

The placement groups (``cantata-<job>-a<attempt>``) and the hosts
(``node@<node id>``, in the ``cantata`` namespace) are detached and named:
they, and the workers, outlive the control plane, whose workers train on
while it is down, and a restarted control plane adopts them from the hosts'
records (:meth:`RayExecutor.adopt`) and stops those no job of its store owns
(:meth:`RayExecutor.kill_strays`).

A worker whose node was lost (its host died and Ray marks the node dead) is
reported as such (``WorkerExit.node_lost``): an all-reduce job restarts its
group from its latest checkpoint on the nodes that remain, and the lost node
does not count against the job's failure budget; a decentralized job's
worker is started again where Ray placed its bundle anew.

The cluster is inside the trust boundary and must be locked
(:func:`check_locked`): token authentication (``RAY_AUTH_MODE=token``) and
TLS (``RAY_USE_TLS=1``, node certificates from the platform CA). The server
refuses a cluster that accepts a client without the token.
"""

from __future__ import annotations

import contextlib
import datetime as dt
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

from cantata.proto.launch import WorkerSecrets
from cantata.security.pki import CertificateAuthority
from cantata.security.worker_confinement import DEFAULT_POLICY, ConfinementPolicy
from cantata.server.executors.base import ExecutorBase, JobRun, NotPlaceable, WorkerExit
from cantata.server.executors.plan import WorkerFiles, WorkerPlan
from cantata.server.executors.registry import ExecutorSetup
from cantata.server.jobs.groups import decentralized, group_size, processes
from cantata.server.jobs.memory import worker_estimate
from cantata.server.network.ports import CertificateRegistry, SecretsBroker
from cantata.server.store import JobRecord, WorkerRecord
from cantata.server.workers.sandbox import Identities, Identity, Lease, prepare_job_folder
from cantata.server.workers.uid_reclaim import ReclaimError, reclaim

log = logging.getLogger(__name__)
NAMESPACE = "cantata"
HOST_PREFIX = "node@"  # + the node's id: its NodeHost actor
READY_TIMEOUT_S = 120.0  # a placement group whose resources were free is placed in far less
CLAIM_WAIT_S = 10.0  # a new job's group not placed by then: its resources were taken; it waits in the queue
STOP_TIMEOUT_S = 10.0
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
    host: Any  # the NodeHost actor of its node (None: an adopted worker no host knew)
    node: dict  # node_id, ip, folder, gpus
    pid: int
    generation: int
    done: Any  # the ObjectRef of NodeHost.wait (None: the worker is gone)
    log_offset: int = 0
    log_ref: Any = None


@dataclass
class _Job(JobRun):
    group: Any  # the placement group (None: an adopted job's was gone)
    reserved: dict[str, float] = field(default_factory=dict)  # what its bundles hold, all together
    workers: dict[int, _Worker] = field(default_factory=dict)
    generations: dict[int, int] = field(default_factory=dict)  # starts of each worker, less one
    dead: dict[int, float] = field(default_factory=dict)  # worker -> when its host was seen dead, its node not yet


class RayExecutor(ExecutorBase[_Job]):
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
        confinement: ConfinementPolicy = DEFAULT_POLICY,
    ):
        super().__init__(
            jobs_dir,
            ca,
            worker_cert_lifetime,
            secrets=secrets,
            certificates=certificates,
            grace=grace,
            identities=identities,
            memory_limit=memory_limit,
            confinement=confinement,
        )
        self._address = address
        self._server_address = server_address  # given the driver's node address: where workers reach the server
        self._note = note  # a line in the job's events (where it was placed)
        self._resources: tuple[float, dict, dict, dict] = (0.0, {}, {}, {})
        self._hosts: dict[str, Any] = {}  # node id -> its NodeHost actor
        self._probe: Any = None  # bundle_gpus as a Ray task, once made remote

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
        self._live_hosts()  # their zygotes warm up (import torch) before the first job

    def _host(self, node_id: str) -> Any:
        """The node's :class:`~cantata.server.executors.ray_actor.NodeHost` actor, started if it is not there."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from cantata.server.executors.ray_actor import NodeHost

        if node_id not in self._hosts:
            self._hosts[node_id] = (
                ray.remote(NodeHost)
                .options(
                    name=f"{HOST_PREFIX}{node_id}",
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,
                    max_concurrency=1000,  # async: each running worker has a wait and a log read waiting in it
                    max_restarts=-1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote()
            )
        return self._hosts[node_id]

    def _live_hosts(self) -> dict[str, Any]:
        """The host of every live node, started where there is none."""
        import ray

        return {n["NodeID"]: self._host(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}

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
        """What one worker process (one rank) of ``job`` asks of its node: its share of the job, not the job."""
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
        ours = self._reserved()
        for resource, amount in bundle.items():
            wanted = amount * n
            # Ray's view of what is free lags behind the groups just made: what ours hold counts at once
            now = min(free.get(resource, 0.0), total.get(resource, 0.0) - ours.get(resource, 0.0))
            if wanted > now:
                raise NotPlaceable(
                    f"waiting for {_amount(resource, wanted)} ({_amount(resource, now)} free)", retry=True
                )

    def _reserved(self) -> dict[str, float]:
        """What the placement groups of this executor's jobs hold, all together."""
        held: dict[str, float] = {}
        for running in self._runs.values():
            for resource, amount in running.reserved.items():
                held[resource] = held.get(resource, 0.0) + amount
        return held

    # ---- launching ----------------------------------------------------------
    def launch(self, job: JobRecord, *, attack: dict | None = None, fault: dict | None = None) -> dict[int, int]:
        import ray
        from ray.util.placement_group import placement_group

        n = processes(job.spec)
        # SPREAD, not STRICT_SPREAD: a lost node's bundle must be placeable again on the nodes that remain
        strategy = "SPREAD" if decentralized(job.spec) else "PACK"
        group = placement_group(
            [self.bundle(job)] * n, strategy=strategy, name=f"cantata-{job.id}-a{job.attempts}", lifetime="detached"
        )
        running = self._runs[job.id] = _Job(group, _times(self.bundle(job), n), attack=attack, fault=fault)
        self._resources = (0.0, {}, {}, {})
        nodes: dict[int, dict] = {}
        try:
            store_root = self.store_root(job)
            folders = (store_root / job.tenant / job.id,) if store_root else ()
            identity = self._identities.acquire(job.id, job.tenant, folders)
            if store_root is not None:  # under a root every node mounts (parse_job_spec saw to it)
                prepare_job_folder(store_root, job.tenant, job.id, identity)
            ready, _ = ray.wait([group.ready()], timeout=CLAIM_WAIT_S)
            if not ready:  # the scheduler's thread is not held: the group is removed and the job queued again
                raise NotPlaceable(
                    f"the resources free at placement were taken before its placement group was placed "
                    f"(another user of the Ray cluster?); not placed in {CLAIM_WAIT_S:.0f} s",
                    retry=True,
                )
            size = group_size(job.spec)
            nodes = self._places(job, list(range(n)), firsts=list(range(0, n, size)))
            running.rendezvous = [_rendezvous(nodes[g * size]) for g in range(n // size)]
            secrets = self._secrets.worker_secrets(job)
            pids = ray.get([self._start(job, i, nodes[i], secrets, identity) for i in range(n)])
            for i, pid in enumerate(pids):
                self._watch(job.id, i, nodes[i], pid)
            self._note(job.id, "placed on " + ", ".join(f"worker {i}: {nodes[i]['ip']}" for i in sorted(nodes)))
        except BaseException:
            for i, node in nodes.items():  # release stops those of them that started
                host, generation = self._host(node["node_id"]), running.generations.get(i, 0)
                running.workers[i] = _Worker(host, node, 0, generation, None)
            self.release(job.id)
            raise
        return {i: w.pid for i, w in running.workers.items()}

    def _bundle_nodes(self, group: Any, workers: list[int]) -> dict[int, str]:
        """The live node each of ``workers``' bundles is on; waits while Ray places a dead node's bundles anew."""
        import ray
        from ray.util.placement_group import placement_group_table

        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            table = placement_group_table(group)
            where = {i: table.get("bundles_to_node_id", {}).get(i, "") for i in workers}
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            if table.get("state") == "CREATED" and all(where[i] in alive for i in workers):
                return where
            if time.monotonic() > deadline:
                raise RayClusterError(f"Ray did not place the bundles of workers {workers} in {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _places(self, job: JobRecord, workers: list[int], firsts: list[int]) -> dict[int, dict]:
        """Where each of ``workers`` starts: its bundle's node (id, cluster address), its folder there, the GPUs
        Ray assigned to its bundle, and a free port there for the rendezvous of each worker in ``firsts``."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from cantata.server.executors.ray_actor import bundle_gpus

        group = self._runs[job.id].group
        if group is None:
            raise RayClusterError(f"the placement group of {job.id} is gone: its workers cannot be placed again")
        where = self._bundle_nodes(group, workers)
        hosts = {node_id: self._host(node_id) for node_id in set(where.values())}
        about = {node_id: host.node.remote() for node_id, host in hosts.items()}
        ports = {i: hosts[where[i]].free_port.remote() for i in firsts}
        gpus: dict[int, Any] = {}
        if job.spec.gpus_per_worker:  # a task asking for all of a bundle's GPUs is handed exactly those
            if self._probe is None:
                self._probe = ray.remote(bundle_gpus)
            for i in workers:
                gpus[i] = self._probe.options(
                    num_cpus=0,
                    num_gpus=self.bundle(job)["GPU"],
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
                ).remote()
        refs = [*about.values(), *ports.values(), *gpus.values()]
        values = dict(zip(refs, ray.get(refs, timeout=READY_TIMEOUT_S), strict=True))
        places = {}
        for i in workers:
            node = values[about[where[i]]]
            places[i] = {
                "node_id": node["node_id"],
                "ip": node["ip"],
                "folder": str(Path(node["root"]) / job.id / f"worker-{i}"),
                "gpus": values[gpus[i]] if i in gpus else [],
                "port": values[ports[i]] if i in ports else 0,
            }
        return places

    def _start(self, job: JobRecord, i: int, node: dict, secrets: WorkerSecrets, identity: Identity | None) -> Any:
        """Have the host of worker ``i``'s node write its files and start it; the ObjectRef of its pid."""
        plan, files = self._plan_on(job, i, node, secrets, identity)
        running = self._runs[job.id]
        running.generations[i] = running.generations.get(i, -1) + 1
        return self._host(node["node_id"]).start.remote(
            job.id, i, running.generations[i], files, plan.request.to_dict(), plan.launch.rendezvous, node["gpus"]
        )

    def _plan_on(
        self, job: JobRecord, i: int, node: dict, secrets: WorkerSecrets, identity: Identity | None
    ) -> tuple[WorkerPlan, dict[str, bytes]]:
        """Worker ``i``'s launch plan on its node (its certificate names the node's address), and the files its
        node's host writes into its folder there (by name)."""
        files = WorkerFiles.in_folder(Path(node["folder"]))
        plan = self._plan(
            job,
            i,
            files,
            server=self._server,
            threads=max(1, int(self.bundle(job)["CPU"])),
            secrets=secrets,
            identity=identity,
            devices=node["gpus"],
            node_ip=node["ip"],
        )
        contents = {
            files.ca: self._ca.cert_pem,
            files.cert: plan.certificate.cert_pem,
            files.key: plan.certificate.key_pem,
            files.launch: plan.launch.to_json().encode(),
        }
        return plan, {path.name: data for path, data in contents.items()}

    def _watch(self, job_id: str, i: int, node: dict, pid: int) -> None:
        running = self._runs[job_id]
        host = self._host(node["node_id"])
        generation = running.generations.get(i, 0)
        running.workers[i] = _Worker(host, node, pid, generation, host.wait.remote(job_id, i, pid))
        running.started[i] = time.monotonic()
        running.exited.pop(i, None)
        running.killed.discard(i)
        running.dead.pop(i, None)
        log = self.log_path(job_id, i)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.parent.chmod(0o700)
        log.touch(mode=0o600)
        running.workers[i].log_offset = log.stat().st_size

    def relaunch(self, job: JobRecord, worker: int) -> int:
        """Start worker ``worker`` again where its bundle is (Ray places the bundle anew if its node died)."""
        import ray

        running = self._runs[job.id]
        size = group_size(job.spec)
        node = self._places(job, [worker], firsts=[worker] if size == 1 else [])[worker]
        old = running.workers.get(worker)
        if (
            old is not None
            and old.host is not None
            and old.node["node_id"] != node["node_id"]
            and not self._node_lost(old.node["node_id"])
        ):  # what is left of it on its old node goes first
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(old.host.stop.remote(job.id, worker, old.generation), timeout=STOP_TIMEOUT_S)
        if size == 1:  # its own group: the rendezvous moves with it
            running.rendezvous[worker] = _rendezvous(node)
        identity = self._identities.acquire(job.id, job.tenant)
        pid = ray.get(self._start(job, worker, node, self._secrets.worker_secrets(job), identity))
        self._watch(job.id, worker, node, pid)
        self._note(job.id, f"worker {worker} placed on {node['ip']}")
        return pid

    # ---- watching and stopping ------------------------------------------------
    def poll(self) -> list[WorkerExit]:
        import ray

        exits: list[tuple[float, WorkerExit]] = []
        for job_id, running in self._runs.items():
            for i, w in running.workers.items():  # an adopted worker no host knew
                if w.done is None and i not in running.exited:
                    exits.append((time.time(), running.exit(job_id, i, KILLED)))
            live = {w.done: i for i, w in running.workers.items() if i not in running.exited and w.done is not None}
            if live:
                ready, _ = ray.wait(list(live), num_returns=len(live), timeout=0)
                for ref in ready:
                    i, lost = live[ref], False
                    w = running.workers[i]
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError:  # its host died, alone or with its node
                        seen = running.dead.setdefault(i, time.monotonic())
                        lost = self._node_lost(w.node["node_id"])
                        if not lost and time.monotonic() - seen < NODE_DEATH_WAIT_S:
                            # Ray restarts a host (its workers train on), which answers from its records; a node
                            # that died with it fails the call again once Ray says so
                            w.done = w.host.wait.remote(job_id, i, w.pid)
                            continue
                        result = (KILLED, time.time())
                    if result is None:  # still running: wait again
                        running.dead.pop(i, None)
                        w.done = w.host.wait.remote(job_id, i, w.pid)
                        continue
                    code, ended = result
                    exits.append((ended, running.exit(job_id, i, code, node_lost=lost)))
            self._copy_logs(job_id, running)
            if running.kill_at is not None and time.monotonic() >= running.kill_at:
                self._signal(job_id, running, signal.SIGKILL)
        return [e for _, e in sorted(exits, key=lambda e: e[0])]  # in the order they died

    def _signal(self, job_id: str, run: _Job, sig: int) -> None:
        for i, w in run.workers.items():
            if i not in run.exited and w.host is not None:
                w.host.signal.remote(job_id, i, sig)

    def _node_lost(self, node_id: str) -> bool:
        """Whether Ray declared the node dead (asked now: a host's death may come first)."""
        import ray

        self._hosts.pop(node_id, None)
        self._resources = (0.0, {}, {}, {})
        return any(n["NodeID"] == node_id and not n.get("Alive") for n in ray.nodes())

    def _copy_logs(self, job_id: str, running: _Job) -> None:
        """Append what each worker logged on its node to its log here (``cantata jobs logs`` reads that)."""
        import ray

        for i, w in running.workers.items():
            if w.host is None:
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
                w.log_ref = w.host.read_log.remote(job_id, i, w.log_offset)

    def finished_jobs(self) -> list[str]:
        return [job_id for job_id, r in self._runs.items() if r.workers and len(r.exited) == len(r.workers)]

    def release(self, job_id: str) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        running = self._runs.pop(job_id, None)
        if running is None:
            return
        stopping = [w.host.stop.remote(job_id, i, w.generation) for i, w in running.workers.items() if w.host]
        for stopped in stopping:
            with contextlib.suppress(ray.exceptions.RayError):  # its node is gone, and its folder with it
                ray.get(stopped, timeout=STOP_TIMEOUT_S)
        if running.group is not None:
            remove_placement_group(running.group)
        self._resources = (0.0, {}, {}, {})
        self._identities.release(job_id, self._reclaim)

    def _reclaim(self, lease: Lease) -> float:
        """Take the lease's uid back on every live node (each host kills its processes there and hands back the
        job's folders there), then here (the ``file://`` checkpoint folder); any node that cannot: raise."""
        import ray

        started = time.monotonic()
        asked = {
            node_id: host.reclaim.remote(lease.uid, lease.groups, lease.job_id, lease.folders)
            for node_id, host in self._live_hosts().items()
        }
        for node_id, ref in asked.items():
            try:
                ray.get(ref, timeout=PROBE_TIMEOUT_S)
            except ray.exceptions.RayError as error:
                raise ReclaimError(
                    f"uid {lease.uid}: the host of node {node_id} did not take it back: {error}"
                ) from error
        reclaim(lease.uid, lease.groups, [Path(f) for f in lease.folders])
        return time.monotonic() - started

    def kill(self, job_id: str, worker: int) -> None:
        running = self._runs[job_id]
        running.killed.add(worker)
        if running.workers[worker].host is not None:
            running.workers[worker].host.signal.remote(job_id, worker, signal.SIGKILL)

    # ---- files on this server -------------------------------------------------
    def scrub(self, job_id: str) -> None:
        """Nothing secret is kept here: configs and keys live on the nodes, deleted as each worker exits."""

    def scrub_all(self) -> None:
        """Nothing secret is kept here (see :meth:`scrub`)."""

    # ---- a restarted control plane ------------------------------------------------
    def _ask_hosts(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Each live node's host's answer to ``method`` (those that do not answer in time are left out)."""
        import ray

        asked = {node_id: getattr(host, method).remote(*args, **kwargs) for node_id, host in self._live_hosts().items()}
        answers = {}
        for node_id, ref in asked.items():
            with contextlib.suppress(ray.exceptions.RayError):
                answers[node_id] = ray.get(ref, timeout=PROBE_TIMEOUT_S)
        return answers

    def adopt(
        self, job: JobRecord, workers: list[WorkerRecord], *, attack: dict | None = None, fault: dict | None = None
    ) -> int:
        """Find the job's placement group (detached, by name) and its workers in the records of the nodes' hosts,
        which an earlier control plane started; how many of its workers still run. A worker no host knows is
        reported as killed at the next :meth:`poll`, and judged like any exit; one that exited meanwhile, with
        its exit status."""
        from ray.util.placement_group import get_placement_group

        try:
            group = get_placement_group(f"cantata-{job.id}-a{job.attempts}")
        except ValueError:
            group = None
        reserved = _times(self.bundle(job), processes(job.spec)) if group is not None else {}
        self._identities.claim(job.id, None, job.tenant)  # its workers' uid: never reclaimed as a stray's
        running = self._runs[job.id] = _Job(group, reserved, attack=attack, fault=fault)
        size = group_size(job.spec)
        running.rendezvous = [""] * (len(workers) // size + 1)
        found: dict[int, dict] = {}
        for hosted in [h for answer in self._ask_hosts("workers", job.id).values() for h in answer]:
            if hosted["worker"] not in found or hosted["generation"] > found[hosted["worker"]]["generation"]:
                found[hosted["worker"]] = hosted  # a worker started again elsewhere: its latest start
        for record in workers:
            hosted = found.get(record.idx)
            if hosted is None:  # its node is gone, or it never started
                running.workers[record.idx] = _Worker(None, {"node_id": ""}, record.pid, 0, None)
                running.started[record.idx] = time.monotonic()
                continue
            running.generations[record.idx] = hosted["generation"]
            node = {
                "node_id": hosted["node_id"],
                "ip": hosted["ip"],
                "folder": "",
                "gpus": hosted["gpus"],
            }
            self._watch(job.id, record.idx, node, hosted["pid"])
            if hosted["rendezvous"]:
                running.rendezvous[record.idx // size] = hosted["rendezvous"]
        return sum(1 for w in running.workers.values() if w.done is not None)

    def started_at(self, job_id: str, worker: int) -> int:
        return 0  # a process on some node, not of this machine

    def kill_strays(self) -> list[int]:
        """Stop the workers and remove the placement groups no adopted job owns (say, a job's last attempt's)."""
        import ray
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        killed = sorted({job for jobs in self._ask_hosts("stop_jobs", keep=list(self._runs)).values() for job in jobs})
        for uid in self._identities.recover(self._reclaim):
            log.warning("took back worker uid %d, which an earlier control plane left in use", uid)
        owned = {r.group.id.hex() for r in self._runs.values() if r.group is not None}
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
            log.warning("stopped the workers and removed the placement groups that no job owns: %s", ", ".join(killed))
        return []  # no pids: these are processes on the cluster's nodes

    def detach(self) -> None:
        """Let go of the cluster and leave the workers training, for the next control plane to adopt."""
        import ray

        self._runs.clear()
        ray.shutdown()

    def kill_orphan(self, worker: WorkerRecord, job_id: str) -> None:
        """Stop the job's workers an earlier control plane left (a restarting job's), wherever they run."""
        self._ask_hosts("stop_jobs", only=job_id)

    def stop_all(self) -> None:
        import ray

        for job_id in list(self._runs):
            self.terminate(job_id)
        deadline = time.monotonic() + self._grace + 5
        while self._runs and time.monotonic() < deadline:
            self.poll()
            for job_id in self.finished_jobs():
                self.release(job_id)
            time.sleep(0.05)
        for job_id in list(self._runs):
            self.release(job_id)
        ray.shutdown()


def build(setup: ExecutorSetup) -> RayExecutor:
    """The Ray executor of a server (:mod:`cantata.server.executors.registry`)."""
    wildcard = setup.listen.rpartition(":")[0] in ("0.0.0.0", "", "[::]")  # noqa: S104 (workers dial the node's address)
    return RayExecutor(
        setup.cluster_address,
        setup.jobs_dir,
        setup.ca,
        lambda node_ip: f"{node_ip if wildcard else setup.connect_host}:{setup.port}",
        setup.cert_lifetime,
        secrets=setup.secrets,
        certificates=setup.certificates,
        grace=setup.settings.cancel_grace_seconds,
        identities=setup.identities,
        memory_limit=setup.memory_limit,
        note=setup.note,
        confinement=setup.confinement,
    )


def _rendezvous(node: dict) -> str:
    """A torch.distributed rendezvous on ``node`` (see :meth:`RayExecutor._places`), at the free port found there."""
    return f"tcp://{node['ip']}:{node['port']}"


def _times(bundle: dict[str, float], n: int) -> dict[str, float]:
    return {resource: amount * n for resource, amount in bundle.items()}


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{value / (1 << 30):.1f} GiB of memory"
    return f"{value:g} {resource}s"
