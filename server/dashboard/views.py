"""What each dashboard page shows, read from the store and the audit log as plain values for the templates.

Every lookup of a job is scoped to a tenant: another tenant's id is
``NotFound``, as over gRPC.
Tenant-written text (job names, tags, messages) is passed through as it is:
the templates escape it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.security.audit import build_report
from cantata.server.groups import decentralized, processes
from cantata.server.store import JobRecord, Store

EVENTS_SHOWN = 200  # the job page lists this many latest events
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
    tags: tuple[str, ...]
    created: str
    updated: str
    reason: str


def job_row(job: JobRecord) -> JobRow:
    spec = job.spec
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
        tags=tuple(spec.tags),
        created=job.created_at[:19].replace("T", " "),
        updated=job.updated_at[:19].replace("T", " "),
        reason=job.reason,
    )


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
    events: list[dict]
    workers: list[dict]
    checkpoints: list[dict]
    edges: list[Edge]
    topology: Topology | None
    processes: int


def _event_row(e: jobs_pb2.JobEvent) -> dict:
    return {
        "seq": e.seq,
        "time": e.time.ToJsonString()[:19].replace("T", " "),
        "kind": jobs_pb2.EventKind.Name(e.kind),
        "state": state_name(e.state) if e.kind == jobs_pb2.STATE else "",
        "step": e.step,
        "worker": e.worker,
        "message": e.message,
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


class Views:
    """The pages' data: a tenant's jobs, or the platform's state for an admin."""

    def __init__(
        self,
        store: Store,
        audit_dir: Path,
        flush_audit,
        shown: Callable[[JobRecord], JobRecord] = lambda job: job,
    ):
        self._store = store
        self._audit_dir = audit_dir
        self._flush_audit = flush_audit  # signs a checkpoint so the verification covers everything so far
        self._shown = shown  # a job as tenants see it (JobLifecycle.shown: not running once its workers all exited)

    def jobs(self, tenant: str) -> list[JobRow]:
        return [job_row(self._shown(j)) for j in reversed(self._store.jobs(tenant=tenant, limit=1000))]

    def job(self, job_id: str, tenant: str) -> JobRow:
        """The job, if ``tenant`` may see it (``NotFound`` otherwise)."""
        return job_row(self._shown(self._store.job(job_id, tenant=tenant)))

    def job_page(self, job_id: str, tenant: str) -> JobPage:
        job = self._shown(self._store.job(job_id, tenant=tenant))
        events = self._store.events_after(job.id, 0)
        gossip = decentralized(job.spec)
        edges = _edges(job.id, events, self._store) if gossip else []
        return JobPage(
            job=job_row(job),
            events=[_event_row(e) for e in events[-EVENTS_SHOWN:]][::-1],
            workers=[
                {
                    "idx": w.idx,
                    "pid": w.pid,
                    "state": "failed" if w.failure else "finished" if w.finished else "running",
                    "failure": w.failure,
                    "restarts": w.restarts,
                    "gossip": w.gossip_address,
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
