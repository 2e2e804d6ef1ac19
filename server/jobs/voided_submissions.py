"""Start-up reconciliation of ``job_submitted`` records with no job: which need a compensating record. Free of I/O.

A submit's audit record and its database commit are synced side by side
(:meth:`~cantata.server.request_audit.RequestAudit.append_alongside_commit`). A crash after the record's sync but
before the commit's leaves a ``job_submitted`` record (outcome ``ok``) for a job that never existed: its caller was
never answered and nothing ran. The log is append-only, so the server appends a ``job_submission_voided`` record
naming the same job, once: a record already voided, and a job deleted since (``job_deleted``), need none.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cantata.security.audit import Action, Outcome, Unsigned


def submitted_jobs(records: Mapping[int, Unsigned]) -> set[str]:
    """The jobs ``records`` say were submitted (accepted submissions: refused ones name no job)."""
    return {r.resource for r in records.values() if r.action == Action.JOB_SUBMITTED and r.outcome == Outcome.OK}


def to_void(records: Mapping[int, Unsigned], existing: Collection[str]) -> list[tuple[int, Unsigned]]:
    """The accepted ``job_submitted`` records, by seq, whose job is not in ``existing`` and that no later record
    voided or followed with the job's deletion: each needs one ``job_submission_voided`` record."""
    settled = {r.resource for r in records.values() if r.action in (Action.JOB_SUBMISSION_VOIDED, Action.JOB_DELETED)}
    return sorted(
        (seq, r)
        for seq, r in records.items()
        if r.action == Action.JOB_SUBMITTED
        and r.outcome == Outcome.OK
        and r.resource
        and r.resource not in existing
        and r.resource not in settled
    )
