"""The control plane's Prometheus metrics: what the server counts as it serves, and what it reads at each scrape.

Counted as it happens (``prometheus_client`` instruments on a registry of
this server's own, so several servers in one process stay apart):

- ``cantata_rpc_calls_total`` and ``cantata_rpc_duration_seconds`` by gRPC service, method and status code;
- ``cantata_refused_calls_total`` by reason (the gatekeeper's, the stream cap's, the ``/metrics`` endpoint's);
- ``cantata_audit_appends_total`` by action and outcome, ``cantata_audit_append_seconds``;
- ``cantata_worker_restarts_total`` (each ``job_restarted`` record);
- ``cantata_checkpoint_bytes_total`` and ``cantata_checkpoint_write_seconds`` by store kind (file, s3, az);
- ``cantata_store_outages_total`` by store kind: a worker's checkpoint store stopped answering (retries began);
- ``cantata_queue_wait_seconds``: how long each placed job waited in the queue;
- ``cantata_build_info`` (version, python, torch when installed) and the ``process_*`` metrics of the server.

Read at each scrape (:class:`StateCollector`): ``cantata_jobs`` by state,
``cantata_queue_length``, ``cantata_queue_oldest_wait_seconds``,
``cantata_workers_alive``, and for every active job, labelled
``{tenant, job_id}`` (``job`` is the label Prometheus gives the scrape
job): ``cantata_job_tokens_total``, the tokens its workers reported
training on (a counter: ``rate()`` of it is the throughput), its latest
training values as ``cantata_job_<metric>`` gauges from the metrics history
(:mod:`cantata.server.store.metrics`), in base units (``_seconds``), and
``cantata_job_store_unreachable``: how many of its workers last reported
their checkpoint store unreachable (0 once it answers again), and
``cantata_job_stragglers`` (:mod:`cantata.server.jobs.stragglers`). No series has
a ``_created`` sample.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import math
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import cantata
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import STATE_NAMES
from cantata.security.audit import Action
from cantata.server.jobs.stragglers import StragglerDetector
from cantata.server.store import ACTIVE, JobRecord, Store
from cantata.server.store.metrics import MetricsStore
from cantata.storage import uri as stores

# Per-job gauges: the metrics of the history that describe a job's training now -> ``cantata_job_<name>``.
JOB_GAUGES = {
    "loss": "loss",
    "val_loss": "val_loss",
    "lr": "lr",
    "step_time_s": "step_time_seconds",
    "data_wait_s": "data_wait_seconds",
    "grad_norm": "grad_norm",
    "round_s": "round_seconds",
    "optim_step_s": "optim_step_seconds",
    "optim_compute_imbalance": "optim_compute_imbalance",
    "optim_ns_flops_imbalance": "optim_ns_flops_imbalance",
}
JOB_LABELS = ["tenant", "job_id"]


def store_kind(uri: str) -> str:
    """The label of a checkpoint store: file, s3, azure (other for anything else)."""
    scheme = stores.SCHEMES.get(urlsplit(uri).scheme)
    return scheme.label if scheme else "other"


class Telemetry:
    """The server's registry and the instruments its parts call."""

    def __init__(self) -> None:
        disable_created_metrics()  # process-wide: a `_created` series per counter only doubles what is stored
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        Info("cantata_build", "the server's version, with its Python's and torch's", registry=r).info(build_info())
        rpc_labels = ["service", "method", "code"]
        self.rpc_calls = Counter("cantata_rpc_calls", "RPCs served", rpc_labels, registry=r)
        self.rpc_seconds = Histogram(
            "cantata_rpc_duration_seconds",
            "RPC latency (streams: how long they stayed open)",
            rpc_labels,
            registry=r,
        )
        self.refused = Counter("cantata_refused_calls", "calls refused before they ran", ["reason"], registry=r)
        self.audit_appends = Counter(
            "cantata_audit_appends",
            "audit records appended (outcome: written or failed)",
            ["action", "outcome"],
            registry=r,
        )
        self.audit_seconds = Histogram(
            "cantata_audit_append_seconds",
            "time to append (and make durable) one batch of audit records",
            registry=r,
        )
        self.restarts = Counter("cantata_worker_restarts", "job restarts after a worker failed", registry=r)
        self.checkpoint_bytes = Counter(
            "cantata_checkpoint_bytes", "bytes of committed checkpoints", ["store"], registry=r
        )
        self.checkpoint_seconds = Histogram(
            "cantata_checkpoint_write_seconds",
            "seconds a worker took to write its part of a checkpoint",
            ["store"],
            registry=r,
        )
        self.store_outages = Counter(
            "cantata_store_outages",
            "times a worker's checkpoint store stopped answering and its calls were retried",
            ["store"],
            registry=r,
        )
        self.unreachable = UnreachableStores()
        self.tokens = JobTokens()
        self.queue_wait = Histogram(
            "cantata_queue_wait_seconds",
            "seconds a job waited in the queue before it was placed",
            buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, math.inf),
            registry=r,
        )

    def rpc(self, method: str, code: str, seconds: float) -> None:
        """A call to ``method`` (``/cantata.v1.Jobs/GetJob``) ended with ``code`` after ``seconds``."""
        service, _, name = method.lstrip("/").rpartition("/")
        self.rpc_calls.labels(service, name, code).inc()
        self.rpc_seconds.labels(service, name, code).observe(seconds)

    def refusal(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def audited(self, actions: Sequence[str], seconds: float, written: bool) -> None:
        for action in actions:
            self.audit_appends.labels(action, "written" if written else "failed").inc()
            if written and action == Action.JOB_RESTARTED:
                self.restarts.inc()
        self.audit_seconds.observe(seconds)

    def checkpoint(self, uri: str, size_bytes: int, seconds: float) -> None:
        kind = store_kind(uri)
        self.checkpoint_bytes.labels(kind).inc(size_bytes)
        self.checkpoint_seconds.labels(kind).observe(seconds)

    def store_outage(self, job: JobRecord, worker: int, reachable: bool) -> None:
        """Worker ``worker`` of ``job`` reported its checkpoint store unreachable (counted) or reachable again."""
        if reachable:
            self.unreachable.answered(job.id, worker)
            return
        self.store_outages.labels(store_kind(job.spec.checkpoint_store)).inc()
        self.unreachable.failed(job.id, worker)

    def trained(self, job: JobRecord, tokens: int) -> None:
        """``job``'s workers report ``tokens`` more tokens trained on."""
        self.tokens.add(job.id, tokens)

    def placed(self, job: JobRecord) -> None:
        """A job leaves the queue: it entered it when it last changed state (``updated_at``)."""
        self.queue_wait.observe(max(0.0, _age(job.updated_at)))

    def watch(
        self, store: Store, metrics: MetricsStore, workers_alive: Callable[[], int], stragglers: StragglerDetector
    ) -> None:
        collector = StateCollector(store, metrics, workers_alive, self.unreachable, self.tokens, stragglers)
        self.registry.register(collector)


def build_info() -> dict[str, str]:
    """The ``cantata_build_info`` labels: Cantata's version, Python's, and torch's when it is installed."""
    info = {"version": cantata.__version__, "python": ".".join(map(str, sys.version_info[:3]))}
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        info["torch"] = importlib.metadata.version("torch")  # its metadata: importing torch takes seconds
    return info


class JobTokens:
    """The tokens each job's workers reported training on since the server started (shared by the RPC threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, int] = {}

    def add(self, job_id: str, tokens: int) -> None:
        with self._lock:
            self._tokens[job_id] = self._tokens.get(job_id, 0) + tokens

    def totals(self, active: Iterable[str]) -> dict[str, int]:
        """The count of each of the ``active`` jobs; ended jobs are forgotten."""
        with self._lock:
            self._tokens = {job_id: self._tokens.get(job_id, 0) for job_id in active}
            return dict(self._tokens)


class UnreachableStores:
    """Which workers of which jobs report their checkpoint store unreachable now (shared by the RPC threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: dict[str, set[int]] = {}

    def failed(self, job_id: str, worker: int) -> None:
        with self._lock:
            self._workers.setdefault(job_id, set()).add(worker)

    def answered(self, job_id: str, worker: int) -> None:
        with self._lock:
            self._workers.get(job_id, set()).discard(worker)

    def counts(self, active: Iterable[str]) -> dict[str, int]:
        """Workers with an unreachable store for each of the ``active`` jobs; ended jobs are forgotten."""
        with self._lock:
            self._workers = {job_id: self._workers.get(job_id, set()) for job_id in active}
            return {job_id: len(workers) for job_id, workers in self._workers.items()}


class StateCollector(Collector):
    """What the store says at scrape time: jobs by state, the queue, live workers, active jobs' training."""

    def __init__(
        self,
        store: Store,
        metrics: MetricsStore,
        workers_alive: Callable[[], int],
        unreachable: UnreachableStores,
        tokens: JobTokens,
        stragglers: StragglerDetector,
    ):
        self._store = store
        self._stragglers = stragglers
        self._metrics = metrics
        self._workers_alive = workers_alive
        self._unreachable = unreachable
        self._tokens = tokens

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        counts = self._store.job_counts()
        jobs = GaugeMetricFamily("cantata_jobs", "jobs by state", labels=["state"])
        for state in STATE_NAMES:
            jobs.add_metric([state], counts.get(common_pb2.JobState.Value(state), 0))
        yield jobs
        queued = self._store.jobs(states=frozenset({common_pb2.QUEUED}), limit=100_000)
        yield GaugeMetricFamily("cantata_queue_length", "jobs waiting to be placed", value=len(queued))
        oldest = max((_age(j.updated_at) for j in queued), default=0.0)
        yield GaugeMetricFamily(
            "cantata_queue_oldest_wait_seconds", "how long the queue's oldest job has waited", value=oldest
        )
        yield GaugeMetricFamily(
            "cantata_workers_alive",
            "worker processes heard from within the heartbeat timeout",
            value=self._workers_alive(),
        )
        active = {j.id: j for j in self._store.jobs(states=ACTIVE, limit=100_000)}
        latest = self._metrics.latest(active)
        families = {
            name: GaugeMetricFamily(f"cantata_job_{gauge}", f"the job's latest {name}", labels=JOB_LABELS)
            for name, gauge in JOB_GAUGES.items()
        }
        step = GaugeMetricFamily("cantata_job_step", "the job's latest reported step", labels=JOB_LABELS)
        tokens = CounterMetricFamily(
            "cantata_job_tokens",
            "tokens the job's workers reported training on since the server started",
            labels=JOB_LABELS,
        )
        unreachable = GaugeMetricFamily(
            "cantata_job_store_unreachable",
            "the job's workers whose checkpoint store does not answer now (its calls being retried)",
            labels=JOB_LABELS,
        )
        slow = GaugeMetricFamily(
            "cantata_job_stragglers", "the job's workers repeatedly far slower than their peers now", labels=JOB_LABELS
        )
        outages = self._unreachable.counts(active)
        stragglers = self._stragglers.counts(active)
        trained = self._tokens.totals(active)
        for job_id, job in active.items():
            step.add_metric([job.tenant, job_id], job.step)
            tokens.add_metric([job.tenant, job_id], trained[job_id])
            unreachable.add_metric([job.tenant, job_id], outages[job_id])
            slow.add_metric([job.tenant, job_id], stragglers[job_id])
            for name, value in latest.get(job_id, {}).items():
                if name in families:
                    families[name].add_metric([job.tenant, job_id], value)
        yield step
        yield tokens
        yield unreachable
        yield slow
        yield from families.values()


def _age(utc_text: str) -> float:
    return (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(utc_text)).total_seconds()
