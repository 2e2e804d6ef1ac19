"""What each dashboard page shows, read from the store and the audit log as plain values for the templates.

Every lookup of a job is scoped to a tenant: another tenant's id is
``NotFound``, as over gRPC.
Tenant-written text (job names, tags, messages) is passed through as it is:
the templates escape it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from google.protobuf import json_format

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.security.audit import build_report
from cantata.server.jobs.groups import decentralized, processes
from cantata.server.store import JobRecord, Store
from cantata.server.store.metrics import METRICS, SYSTEM_METRICS, MetricsStore

EVENTS_SHOWN = 200  # the job page lists this many latest events (training progress is in the charts instead)
LOG_LINES_SHOWN = 1000  # the logs tab starts at each worker's last this many lines
POINTS_PER_READ = 20000  # a metrics read returns at most this many points; the page asks again for the rest
MAX_COMPARED = 8  # the most jobs one comparison overlays
# A ROUND event's text, as server/services/worker.py's round_text writes it (this worker's exchange in that round).
_ROUND = re.compile(r"round ([0-9]+): exchanged with \[([0-9, ]*)\].*?exchange ([0-9.]+) s .*")


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state)


@dataclass(frozen=True)
class JobRow:
    id: str
    tenant: str
    name: str
    state: str
    step: int
    steps: int
    loss: float | None
    val_loss: float | None
    algorithm: str
    workers: int
    processes: int  # worker processes (a worker may run several)
    tags: tuple[str, ...]
    created: str
    updated: str
    reason: str
    terminal: bool
    duration_s: float  # from submission to the end, or to now while it has not ended
    eta_s: float | None  # a running job's remaining steps at its latest seconds per step

    def as_json(self) -> dict:
        return asdict(self) | {"duration": duration_text(self.duration_s), "eta": duration_text(self.eta_s)}


def duration_text(seconds: float | None) -> str:
    """``1h 02m``, ``3m 05s``, ``12s``; "–" for none."""
    if seconds is None:
        return "–"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _seconds_between(start: str, end: str | None) -> float:
    finish = dt.datetime.fromisoformat(end) if end else dt.datetime.now(dt.UTC)
    return max(0.0, (finish - dt.datetime.fromisoformat(start)).total_seconds())


def job_row(job: JobRecord, step_time_s: float | None = None) -> JobRow:
    """The job as the pages list it; ``step_time_s`` (its latest seconds per step) gives a running job its ETA."""
    spec = job.spec
    running = job.state == common_pb2.RUNNING
    eta = (spec.steps - job.step) * step_time_s if running and step_time_s and math.isfinite(step_time_s) else None
    return JobRow(
        id=job.id,
        tenant=job.tenant,
        name=spec.name,
        state=state_name(job.state),
        step=job.step,
        steps=spec.steps,
        loss=job.loss if job.step and math.isfinite(job.loss) else None,
        val_loss=job.val_loss if job.val_loss and math.isfinite(job.val_loss) else None,
        algorithm=spec.algorithm or "ddp",
        workers=spec.workers,
        processes=processes(spec),
        tags=tuple(spec.tags),
        created=job.created_at[:19].replace("T", " "),
        updated=job.updated_at[:19].replace("T", " "),
        reason=job.reason,
        terminal=job.terminal,
        duration_s=_seconds_between(job.created_at, job.updated_at if job.terminal else None),
        eta_s=eta,
    )


def config_rows(spec: common_pb2.JobSpec) -> list[tuple[str, str]]:
    """The job's settings as it ran them (the server filled in its defaults), field by field; lists and
    nested settings as compact JSON."""
    fields = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    return [
        (name, value if isinstance(value, str) else json.dumps(value, separators=(", ", ": ")))
        for name, value in fields.items()
    ]


@dataclass
class Edge:
    """A gossip edge as one worker saw it: the last round it exchanged with ``peer``, and its screening verdicts."""

    worker: int
    peer: int
    round: int = -1
    time: str = ""
    seconds: float = 0.0
    verdicts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Topology:
    """The gossip graph drawn as SVG: workers on a circle, a line per edge (red when screening flagged it)."""

    nodes: list[tuple[int, float, float]]
    lines: list[tuple[float, float, float, float, bool]]


def layout(processes: int, edges: list[Edge]) -> Topology:
    size, radius = 200.0, 80.0
    at = {
        i: (
            size / 2 + radius * math.cos(2 * math.pi * i / processes - math.pi / 2),
            size / 2 + radius * math.sin(2 * math.pi * i / processes - math.pi / 2),
        )
        for i in range(processes)
    }
    lines: dict[tuple[int, int], tuple[float, float, float, float, bool]] = {}
    for e in edges:
        if e.worker in at and e.peer in at:
            key = (min(e.worker, e.peer), max(e.worker, e.peer))
            flagged = bool(e.verdicts) or (key in lines and lines[key][4])
            (x1, y1), (x2, y2) = at[key[0]], at[key[1]]
            lines[key] = (round(x1, 1), round(y1, 1), round(x2, 1), round(y2, 1), flagged)
    return Topology(nodes=[(i, round(x, 1), round(y, 1)) for i, (x, y) in at.items()], lines=list(lines.values()))


@dataclass(frozen=True)
class JobPage:
    job: JobRow
    config: list[tuple[str, str]]
    events: list[dict]
    workers: list[dict]
    checkpoints: list[dict]
    edges: list[Edge]
    topology: Topology | None
    processes: int


def _what(e: jobs_pb2.JobEvent) -> str:
    if e.kind == jobs_pb2.STATE:
        state = state_name(e.state)
        return f"{state}: {e.message}" if e.message and e.message.lower() != state.lower() else state
    if e.kind == jobs_pb2.PROGRESS:
        return f"loss {e.loss:.4f}, {e.tokens_per_s:,.0f} tokens/s"
    if e.kind == jobs_pb2.EVAL:
        return f"validation loss {e.val_loss:.4f}"
    return e.message


def shown_in_table(e: jobs_pb2.JobEvent) -> bool:
    """Every event but a step's progress, which the charts show."""
    return e.kind != jobs_pb2.PROGRESS


def event_row(e: jobs_pb2.JobEvent) -> dict:
    """An event as the job page's table shows it, whatever its kind: what happened is never empty."""
    return {
        "seq": e.seq,
        "time": e.time.ToJsonString()[:19].replace("T", " "),
        "kind": jobs_pb2.EventKind.Name(e.kind),
        "state": state_name(e.state) if e.kind == jobs_pb2.STATE else "",
        "step": e.step,
        "worker": e.worker,
        "what": _what(e),
    }


def _edges(job_id: str, events: list[jobs_pb2.JobEvent], store: Store) -> list[Edge]:
    """Each edge's last exchange (from ``ROUND`` events) and the screening verdicts on it (from the anomalies)."""
    edges: dict[tuple[int, int], Edge] = {}
    for e in events:
        if e.kind != jobs_pb2.ROUND:
            continue
        match = _ROUND.fullmatch(e.message)
        if not match:
            continue
        for peer in (int(p) for p in match.group(2).replace(" ", "").split(",") if p):
            edge = edges.setdefault((e.worker, peer), Edge(e.worker, peer))
            if int(match.group(1)) >= edge.round:
                edge.round, edge.seconds = int(match.group(1)), float(match.group(3))
                edge.time = e.time.ToJsonString()[:19].replace("T", " ")
    for a in store.anomalies(job_id):
        edge = edges.setdefault((a.reporter, a.peer), Edge(a.reporter, a.peer))
        edge.verdicts.append(f"{a.verdict} in round {a.round} ({a.check})" + (", quarantined" if a.quarantined else ""))
    return sorted(edges.values(), key=lambda edge: (edge.worker, edge.peer))


def _usage_text(value: float | None, form: str, unit: float = 1.0) -> str:
    return "–" if value is None or not math.isfinite(value) else form.format(value / unit)


def _complete_lines(path: Path) -> list[str]:
    """The lines of a worker log that a newline ends (a line still being written waits for the next pass)."""
    text = path.read_text(errors="replace")
    return text[: text.rfind("\n") + 1].splitlines()


class Views:
    """The pages' data: a tenant's jobs, or the platform's state for an admin."""

    def __init__(
        self,
        store: Store,
        audit_dir: Path,
        flush_audit,
        metrics: MetricsStore,
        log_path: Callable[[str, int], Path],
        shown: Callable[[JobRecord], JobRecord] = lambda job: job,
    ):
        self._store = store
        self._audit_dir = audit_dir
        self._flush_audit = flush_audit  # signs a checkpoint so the verification covers everything so far
        self._metrics = metrics
        self._log_path = log_path  # a worker process's log file (the executor's)
        self._shown = shown  # a job as tenants see it (JobLifecycle.shown: not running once its workers all exited)

    def _rows(self, jobs: Iterable[JobRecord]) -> list[JobRow]:
        shown = [self._shown(j) for j in jobs]
        running = [j.id for j in shown if j.state == common_pb2.RUNNING]
        latest = self._metrics.latest(running) if running else {}
        return [job_row(j, latest.get(j.id, {}).get("step_time_s")) for j in shown]

    def jobs(self, tenant: str) -> list[JobRow]:
        return self._rows(reversed(self._store.jobs(tenant=tenant, limit=1000)))

    def job(self, job_id: str, tenant: str) -> JobRow:
        """The job, if ``tenant`` may see it (``NotFound`` otherwise)."""
        return self._rows([self._store.jobs.get(job_id, tenant=tenant)])[0]

    def compared(self, job_ids: list[str], tenant: str) -> list[JobRow]:
        """The jobs to overlay, each the tenant's (``NotFound`` otherwise); ``ValueError`` unless there are 1 to
        :data:`MAX_COMPARED`."""
        if not job_ids or len(job_ids) > MAX_COMPARED:
            raise ValueError(f"Compare 1 to {MAX_COMPARED} jobs: /compare?jobs=ID,ID")
        return self._rows([self._store.jobs.get(job_id, tenant=tenant) for job_id in dict.fromkeys(job_ids)])

    def metrics(self, job_id: str, after: int) -> dict:
        """The job's history after the cursor ``after`` (not per-peer series): ``points`` as
        [name, worker, step, value] (None: a gap), the new cursor, and whether more is waiting."""
        rows = [p for p in self._metrics.rows(job_id, after=after, limit=POINTS_PER_READ)]
        return {
            "cursor": rows[-1].seq if rows else after,
            "more": len(rows) == POINTS_PER_READ,
            "points": [
                [p.name, p.worker, p.step, p.value if math.isfinite(p.value) else None] for p in rows if p.peer is None
            ],
            "descriptions": {p.name: METRICS[p.name] for p in rows if p.peer is None},
        }

    def log_lines(self, job: JobRow, read: list[int] | None) -> tuple[list[int], list[tuple[int, str]]]:
        """Lines the job's workers wrote past ``read`` (lines already sent, per worker process), in worker
        order, with the new counts; with no ``read``, each worker's last :data:`LOG_LINES_SHOWN`."""
        counts = list(read) if read is not None else [0] * job.processes
        if len(counts) != job.processes:
            raise ValueError(f"expected {job.processes} line counts, not {len(counts)}")
        new: list[tuple[int, str]] = []
        for worker in range(job.processes):
            path = self._log_path(job.id, worker)
            lines = _complete_lines(path) if path.exists() else []
            start = counts[worker] if read is not None else max(0, len(lines) - LOG_LINES_SHOWN)
            new.extend((worker, line) for line in lines[start:])
            counts[worker] = max(counts[worker], len(lines))
        return counts, new

    def job_page(self, job_id: str, tenant: str) -> JobPage:
        job = self._shown(self._store.jobs.get(job_id, tenant=tenant))
        events = self._store.events.after(job.id, 0)
        gossip = decentralized(job.spec)
        edges = _edges(job.id, events, self._store) if gossip else []
        usage: dict[int, dict[str, float]] = {}
        for p in self._metrics.rows(job.id, SYSTEM_METRICS):
            usage.setdefault(p.worker, {})[p.name] = p.value  # oldest first: the latest stays
        return JobPage(
            job=self._rows([job])[0],
            config=config_rows(job.spec),
            events=[event_row(e) for e in events if shown_in_table(e)][-EVENTS_SHOWN:][::-1],
            workers=[
                {
                    "idx": w.idx,
                    "pid": w.pid,
                    "state": "failed" if w.failure else "finished" if w.finished else "running",
                    "failure": w.failure,
                    "restarts": w.restarts,
                    "gossip": w.gossip_address,
                    "cpu": _usage_text(usage.get(w.idx, {}).get("cpu_percent"), "{:.0f}%"),
                    "memory": _usage_text(usage.get(w.idx, {}).get("memory_bytes"), "{:.0f} MiB", 2**20),
                    "gpu": _usage_text(usage.get(w.idx, {}).get("gpu_memory_bytes"), "{:.0f} MiB", 2**20),
                }
                for w in self._store.workers(job.id)
            ],
            checkpoints=[
                {"step": e.step, "time": e.time.ToJsonString()[:19].replace("T", " ")}
                for e in events
                if e.kind == jobs_pb2.CHECKPOINT
            ][::-1],
            edges=edges,
            topology=layout(processes(job.spec), edges) if gossip else None,
            processes=processes(job.spec),
        )

    def admin(self) -> dict:
        """Tenants with their quotas, pending requests, the queue and the audit log's verdict."""
        tenants = self._store.tenants()
        queued = self._store.jobs(states=frozenset({common_pb2.QUEUED}), limit=1000)
        self._flush_audit()
        report = build_report(self._audit_dir)
        result = report.verification
        return {
            "tenants": [t for t in tenants if t.status != "PENDING"],
            "pending": [t for t in tenants if t.status == "PENDING"],
            "queue": [job_row(j) for j in queued],
            "audit": {
                "intact": result.ok,
                "verdict": (
                    f"intact: {result.records_valid}/{result.records_total} records, "
                    f"{result.checkpoints_valid}/{result.checkpoints_total} checkpoints valid"
                    if result.ok
                    else "BROKEN: " + result.summary().splitlines()[-1]
                ),
                "total": report.total,
                "refusals": len(report.refusals),
                "anomalies": len(report.anomalies),
                "by_action": sorted(report.by_action.items(), key=lambda kv: -kv[1])[:12],
                "recent_refusals": [
                    {
                        "time": r.time.isoformat()[:19].replace("T", " "),
                        "action": r.action,
                        "actor": r.actor,
                        "tenant": r.tenant,
                    }
                    for r in report.refusals[-10:]
                ][::-1],
            },
        }
