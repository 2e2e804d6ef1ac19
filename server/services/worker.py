"""Worker: how a job's worker processes report progress, checkpoints, their end, and that they are alive."""

from __future__ import annotations

import math
from collections.abc import Callable

from cantata.proto.v1 import common_pb2, jobs_pb2, worker_pb2, worker_pb2_grpc
from cantata.security.audit import Action, Outcome
from cantata.security.pki import Principal
from cantata.server.auth import caller
from cantata.server.errors import InvalidRequest, Refused, Unavailable
from cantata.server.jobs.groups import processes
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.stragglers import StragglerDetector
from cantata.server.network.ports import AuditSink
from cantata.server.store import AnomalyRecord, JobRecord, Store, utcnow
from cantata.server.store.metrics import METRICS, SYSTEM_METRICS, MetricsStore
from cantata.server.workers.heartbeats import Heartbeats


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        store: Store,
        lifecycle: JobLifecycle,
        audit: AuditSink,
        heartbeats: Heartbeats,
        metrics: MetricsStore,
        stragglers: StragglerDetector,
        *,
        revoke_quarantined: bool,
        checkpoint_written: Callable[[str, int, float], None] = lambda uri, size, seconds: None,
        store_outage: Callable[[JobRecord, int, bool], None] = lambda job, worker, reachable: None,
        trained: Callable[[JobRecord, int], None] = lambda job, tokens: None,
    ):
        self._store = store
        self._metrics = metrics
        self._stragglers = stragglers
        self._checkpoint_written = checkpoint_written  # (store URI, bytes, seconds): the Prometheus counters
        self._store_outage = store_outage  # (job, worker, reachable): the Prometheus outage counter and gauge
        self._trained = trained  # (job, tokens of a report window): the Prometheus tokens counter
        self._lifecycle = lifecycle
        self._audit = audit.append
        self._heartbeats = heartbeats
        self._revoke_quarantined = revoke_quarantined  # policy: a quarantined worker loses its certificate

    def Report(self, request, context):
        me = caller(context)
        if request.job_id != me.name or request.worker != me.index:
            self._audit(
                me.uri,
                Action.AUTHZ_DENIED,
                resource=request.job_id,
                outcome="denied",
                details={"reason": "worker reported for another job or index"},
                peer=context.peer(),
            )
            raise Refused("a worker may only report for itself")
        self._heartbeats.seen(me.name, request.worker)  # any report is a sign of life
        if not request.seq:  # a heartbeat: not numbered, not retried
            return self._apply(me, request, context)
        with self._store.database.transaction():  # applied once: a report sent again after an outage is skipped
            claimed = self._store.claim_report(me.name, request.worker, request.seq)
            if claimed is None:
                raise Unavailable("the worker's start is still being recorded; send the report again")
            if claimed:
                return self._apply(me, request, context)
        return self._reply(me.name)

    def _reply(self, job_id: str) -> worker_pb2.WorkerReportReply:
        return worker_pb2.WorkerReportReply(
            stop=self._store.job(job_id).state == common_pb2.CANCELLING,
            heartbeat_interval_s=self._heartbeats.interval,
        )

    def _apply(self, me, request, context) -> worker_pb2.WorkerReportReply:
        job = self._store.job(me.name)
        kind = request.WhichOneof("payload")
        _check_ranges(request, processes(job.spec))
        event = extra = None
        if kind == "heartbeat":
            beat = request.heartbeat  # the process's use of its machine: kept in the history at the job's step
            measured = {name: getattr(beat, name) for name in SYSTEM_METRICS if beat.HasField(name)}
            if measured:
                self._metrics.record(job.id, job.step, request.worker, measured)
        elif kind == "started":
            self._lifecycle.worker_started(job, request.worker)
            # a new process: whatever outage its predecessor saw is not its own
            self._store_outage(job, request.worker, True)
        elif kind == "progress":
            p = request.progress
            values = {"loss": p.loss, "lr": p.lr, "tokens_per_s": p.tokens_per_s}
            values |= {"step_time_s": p.step_time_s, "data_wait_s": p.data_wait_s}
            if p.HasField("grad_norm"):
                values["grad_norm"] = p.grad_norm
            if p.HasField("optimizer"):
                values |= optimizer_metrics(p.optimizer)
            with self._store.database.transaction():  # one durable write for the job's step and its history
                self._store.record_progress(job.id, step=p.step, loss=p.loss)
                self._metrics.record(job.id, p.step, request.worker, values)
            self._trained(job, p.tokens)
            event = jobs_pb2.JobEvent(kind=jobs_pb2.PROGRESS, step=p.step, loss=p.loss, tokens_per_s=p.tokens_per_s)
        elif kind == "eval":
            e = request.eval
            with self._store.database.transaction():
                self._store.record_progress(job.id, step=e.step, val_loss=e.val_loss)
                self._metrics.record(job.id, e.step, request.worker, {"val_loss": e.val_loss})
            event = jobs_pb2.JobEvent(kind=jobs_pb2.EVAL, step=e.step, val_loss=e.val_loss)
        elif kind == "checkpoint":
            c = request.checkpoint
            self._metrics.record(
                job.id, c.step, request.worker, {"checkpoint_bytes": float(c.size_bytes), "checkpoint_s": c.seconds}
            )
            self._checkpoint_written(job.spec.checkpoint_store, c.size_bytes, c.seconds)
            self._audit(
                me.uri,
                Action.CHECKPOINT_WRITTEN,
                resource=f"{job.id}@{c.step}",
                tenant=job.tenant,
                details={"bytes": c.size_bytes},
            )
            event = jobs_pb2.JobEvent(kind=jobs_pb2.CHECKPOINT, step=c.step, message=f"checkpoint at step {c.step}")
        elif kind == "finished":
            self._lifecycle.worker_finished(job, request.worker, request.finished.final_val_loss)
        elif kind == "failed":
            self._lifecycle.worker_failed(
                job, request.worker, request.failed.reason[:2000], permanent=request.failed.permanent
            )
        elif kind == "message":
            event = jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, message=request.message.text[:2000])
        elif kind == "store_outage":
            self._store_outage(job, request.worker, request.store_outage.reachable)
            event = jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, message=store_outage_text(job, request.store_outage))
        elif kind == "rollback":
            event = self._rolled_back(me, job, request.rollback)
        elif kind == "gossip":
            self._join_gossip(job, request.worker, request.gossip)
        elif kind == "round":
            r = request.round
            self._record_round(job, request.worker, r)
            event = jobs_pb2.JobEvent(kind=jobs_pb2.ROUND, step=r.round, message=round_text(r))
            straggler = self._stragglers.observe(job.id, request.worker, r.step_time_s)
            if straggler is not None:  # an episode begins or ends: its own event, after the round's
                extra = jobs_pb2.JobEvent(
                    kind=jobs_pb2.MESSAGE, step=round_step(job.spec, r.round), message=straggler.text()
                )
        elif kind == "anomaly":
            event = self._anomaly(me, job, request.worker, request.anomaly)
        elif kind == "refused":
            event = self._gossip_refused(me, job, request.refused, context.peer())
        else:
            raise InvalidRequest("empty report", field="payload")
        for e in (event, extra):
            if e is not None:
                e.worker = request.worker
                e.total_steps = job.spec.steps
                self._store.append_event(job.id, e)
        return self._reply(job.id)

    def _rolled_back(self, me, job, r: worker_pb2.Rollback) -> jobs_pb2.JobEvent:
        """A recovery policy's rollback: audited, and shown as a ``ROLLBACK`` event at the checkpoint's step."""
        loss = r.loss if math.isfinite(r.loss) else str(r.loss)  # the log holds JSON numbers only: "nan", "inf"
        details = {
            "cause": r.cause[:50],
            "step": r.step,
            "checkpoint_step": r.checkpoint_step,
            "skipped_steps": [r.skipped_from, r.skipped_to],
            "loss": loss,
            "zscore": r.zscore,
            "rollback": r.rollback,
            "lr_scale": r.lr_scale,
        }
        self._audit(me.uri, Action.JOB_ROLLED_BACK, resource=job.id, tenant=job.tenant, details=details)
        return jobs_pb2.JobEvent(kind=jobs_pb2.ROLLBACK, step=r.checkpoint_step, loss=r.loss, message=rollback_text(r))

    def _join_gossip(self, job, worker: int, endpoint: worker_pb2.GossipEndpoint) -> None:
        """The worker's gossip endpoint; one that starts at a later round is done with the rounds before it."""
        rounds = math.ceil(job.spec.steps / job.spec.local_steps) if job.spec.local_steps > 0 else 0
        if not 0 <= endpoint.first_round <= rounds:
            raise InvalidRequest(
                f"gossip.first_round must be in 0..{rounds}, not {endpoint.first_round}", field="gossip.first_round"
            )
        with self._store.database.transaction():
            self._store.set_gossip_address(job.id, worker, endpoint.address[:200])
            if endpoint.first_round > 0:
                self._store.set_round(job.id, worker, endpoint.first_round - 1)

    def _record_round(self, job, worker: int, r: worker_pb2.Round) -> None:
        """The round's number, and its figures in the job's history (at the round's last step)."""
        step = round_step(job.spec, r.round)
        with self._store.database.transaction():
            self._store.set_round(job.id, worker, r.round)
            self._metrics.record(
                job.id,
                step,
                worker,
                {
                    "round_s": r.seconds,
                    "round_peers": float(len(r.peers)),
                    "round_skipped": float(len(r.skipped)),
                    "bytes_sent": float(r.bytes_sent),
                },
            )
            for t in r.traffic:
                self._metrics.record(
                    job.id,
                    step,
                    worker,
                    {"bytes_sent_to_peer": float(t.bytes_sent), "bytes_received_from_peer": float(t.bytes_received)},
                    peer=t.peer,
                )

    def GetPeers(self, request, context):
        me = caller(context)
        if request.job_id != me.name:
            raise Refused("a worker may only ask for its own job's peers")
        workers = self._store.workers(me.name)
        return worker_pb2.GetPeersReply(
            peers={w.idx: w.gossip_address for w in workers if w.gossip_address},
            round=self._store.latest_round(me.name),
            rounds=self._store.rounds(me.name),
            restarts={w.idx: w.restarts for w in workers},
        )

    def _gossip_refused(self, me, job, r, peer: str) -> jobs_pb2.JobEvent:
        """A caller this job's gossip endpoint refused: audited as a denial, shown to the tenant as an event.

        The record's actor and peer are the reporting worker's, from its verified certificate and its
        connection; what the worker says about the refused caller is only a claim, kept in ``details``.
        """
        principal = r.principal[:300] or "unauthenticated"
        self._audit(
            me.uri,
            Action.AUTHZ_DENIED,
            resource=job.id,
            tenant=job.tenant,
            outcome=Outcome.DENIED,
            details={
                "service": "gossip",
                "reported": True,
                "reported_principal": principal,
                "reported_address": r.address[:200],
                "reason": r.reason[:500],
            },
            peer=peer,
        )
        return jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, message=f"gossip endpoint refused {principal}")

    def _anomaly(self, me, job, reporter: int, a) -> jobs_pb2.JobEvent:
        """Record a screened-out update: store, audit, and quarantine policy, kept only once every record is durable."""
        with self._store.database.transaction():
            return self._anomaly_held(me, job, reporter, a)

    def _anomaly_held(self, me, job, reporter: int, a) -> jobs_pb2.JobEvent:
        self._store.add_anomaly(
            AnomalyRecord(job.id, reporter, a.peer, a.round, a.check, a.verdict, a.score, a.quarantined, utcnow())
        )
        if f"screen_{a.verdict}" in METRICS:
            self._metrics.record(
                job.id, round_step(job.spec, a.round), reporter, {f"screen_{a.verdict}": a.score}, peer=a.peer
            )
        peer = Principal.worker(job.id, a.peer)
        score = a.score if math.isfinite(a.score) else str(a.score)  # the log holds JSON numbers only: "nan", "inf"
        details = {"peer": peer.uri, "round": a.round, "check": a.check, "verdict": a.verdict, "score": score}
        self._audit(me.uri, Action.GRADIENT_ANOMALY_DETECTED, resource=job.id, tenant=job.tenant, details=details)
        text = f"worker {reporter} {a.verdict}ed the update of worker {a.peer} in round {a.round} ({a.check})"
        if a.quarantined:
            self._audit(me.uri, Action.PEER_QUARANTINED, resource=job.id, tenant=job.tenant, details=details)
            text += f"; worker {a.peer} quarantined"
            if self._revoke_quarantined:
                current = self._store.current_certificate(peer.uri)
                if current:
                    self._store.revoke_certificate(current[0])
                    self._audit(
                        "server",
                        Action.CERTIFICATE_REVOKED,
                        resource=current[0],
                        tenant=job.tenant,
                        details={"principal": peer.uri, "reason": "quarantined for gradient anomalies"},
                    )
        return jobs_pb2.JobEvent(kind=jobs_pb2.ANOMALY, step=a.round, message=text)


def round_step(spec: common_pb2.JobSpec, round_: int) -> int:
    """The last training step of decentralized round ``round_`` (rounds count from 0)."""
    return min((round_ + 1) * spec.local_steps, spec.steps) if spec.local_steps > 0 else round_


def round_text(r: worker_pb2.Round) -> str:
    """A ``ROUND`` event's text (the dashboard reads its peers and exchange time back: ``dashboard/views.py``)."""
    skipped = f", skipped {list(r.skipped)}" if r.skipped else ""
    return (
        f"round {r.round}: exchanged with {list(r.peers)}{skipped}; inner steps: {r.inner_steps}, "
        f"exchange {r.seconds:.2f} s (deadline {r.deadline_s:.1f} s), sent so far: {r.bytes_sent} bytes"
    )


def rollback_text(r: worker_pb2.Rollback) -> str:
    """A ``ROLLBACK`` event's text: what tripped the policy, the checkpoint restored and the data skipped."""
    what = f"loss {r.loss:.4g} (z-score {r.zscore:.1f})" if r.cause == "loss_spike" else f"loss {r.loss}"
    return (
        f"rollback {r.rollback}: {r.cause[:50]} at step {r.step}, {what}; restored the checkpoint of step "
        f"{r.checkpoint_step}, skipped the batches of steps {r.skipped_from}-{r.skipped_to}, lr x {r.lr_scale:g}"
    )


def optimizer_metrics(window: worker_pb2.OptimizerWindow) -> dict[str, float]:
    """A report window's optimizer statistics as metrics: field ``<name>`` is metric ``optim_<name>``."""
    return {
        f"optim_{field.name}": getattr(window, field.name)
        for field in window.DESCRIPTOR.fields
        if not field.has_presence or window.HasField(field.name)
    }


def store_outage_text(job: JobRecord, outage: worker_pb2.StoreOutage) -> str:
    """The job event of a worker's checkpoint store outage, naming the job's store (not what the worker says it is)."""
    store = job.spec.checkpoint_store
    if outage.reachable:
        return f"checkpoint store {store} reachable again after {outage.seconds:.1f} s"
    return f"checkpoint store {store} unreachable ({outage.cause[:1000]}); retrying for up to {outage.retry_for_s:g} s"


def _check_ranges(report: worker_pb2.WorkerReport, processes: int) -> None:
    """Refuse a report whose steps, rounds, sizes or worker indices are out of range (``InvalidRequest``)."""
    kind = report.WhichOneof("payload")
    body = getattr(report, kind) if kind else None
    counts = {f: getattr(body, f) for f in ("step", "round", "size_bytes", "tokens") if kind and hasattr(body, f)}
    for name, value in counts.items():
        if isinstance(value, int) and value < 0:
            raise InvalidRequest(f"{kind}.{name} must be >= 0, not {value}", field=f"{kind}.{name}")
    workers = list(report.round.peers) + list(report.round.skipped) if kind == "round" else []
    workers += [t.peer for t in report.round.traffic] if kind == "round" else []
    if kind == "round" and any(t.bytes_sent < 0 or t.bytes_received < 0 for t in report.round.traffic):
        raise InvalidRequest("round.traffic: byte counts must be >= 0", field="round.traffic")
    for name in ("step_time_s", "data_wait_s") if kind == "progress" else ():
        value = getattr(report.progress, name)
        if not (math.isfinite(value) and value >= 0):
            raise InvalidRequest(f"progress.{name} must be a finite duration", field=f"progress.{name}")
    optimizer = optimizer_metrics(report.progress.optimizer) if kind == "progress" else {}
    for name, value in optimizer.items():
        if not (math.isfinite(value) and value >= 0):
            raise InvalidRequest(f"progress.optimizer: {name} must be finite and >= 0", field="progress.optimizer")
    if kind == "rollback":
        r = report.rollback
        if not r.checkpoint_step <= r.skipped_from - 1 <= r.skipped_to <= r.step or r.rollback < 1:
            raise InvalidRequest("rollback: inconsistent steps", field="rollback")
        if not (math.isfinite(r.zscore) and math.isfinite(r.lr_scale) and r.lr_scale > 0):
            raise InvalidRequest("rollback: zscore and lr_scale must be finite", field="rollback")
    if kind == "checkpoint" and not (math.isfinite(report.checkpoint.seconds) and report.checkpoint.seconds >= 0):
        raise InvalidRequest("checkpoint.seconds must be a finite duration", field="checkpoint.seconds")
    workers += [report.anomaly.peer] if kind == "anomaly" else []
    if any(not 0 <= w < processes for w in workers):
        raise InvalidRequest(f"{kind}: a worker index is outside 0..{processes - 1}", field=kind)
    if kind == "anomaly" and math.isnan(report.anomaly.score):
        raise InvalidRequest("anomaly.score must be a number", field="anomaly.score")
    for name in ("seconds", "step_time_s") if kind == "round" else ():
        value = getattr(report.round, name)
        if not (math.isfinite(value) and value >= 0):
            raise InvalidRequest(f"round.{name} must be a finite duration", field=f"round.{name}")
    for name in ("retry_for_s", "seconds") if kind == "store_outage" else ():
        value = getattr(report.store_outage, name)
        if not (math.isfinite(value) and value >= 0):
            raise InvalidRequest(f"store_outage.{name} must be a finite duration", field=f"store_outage.{name}")
