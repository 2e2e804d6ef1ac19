"""Which job_submitted records start-up reconciliation voids (cantata.server.jobs.voided_submissions), on its own."""

from __future__ import annotations

from cantata.security.audit import Action, Unsigned
from cantata.server.jobs.voided_submissions import submitted_jobs, to_void


def _submitted(job: str, outcome: str = "ok") -> Unsigned:
    return Unsigned(Action.JOB_SUBMITTED, job, "acme", outcome)


RECORDS = {
    5: _submitted("job-kept"),
    6: _submitted("", outcome="refused"),  # a refused submission names no job
    7: _submitted("job-lost"),
    8: _submitted("job-voided"),
    9: Unsigned(Action.JOB_SUBMISSION_VOIDED, "job-voided", "acme", "ok"),  # an earlier start voided it
    10: _submitted("job-gone"),
    11: Unsigned(Action.JOB_DELETED, "job-gone", "acme", "ok"),  # deleted by its tenant since
    12: Unsigned(Action.JOB_STARTED, "job-started-only", "acme", "ok"),
}


def test_the_accepted_submissions_are_the_jobs_to_look_up():
    assert submitted_jobs(RECORDS) == {"job-kept", "job-lost", "job-voided", "job-gone"}


def test_only_an_accepted_submission_whose_job_does_not_exist_and_was_not_voided_or_deleted_is_voided():
    assert to_void(RECORDS, existing={"job-kept"}) == [(7, RECORDS[7])]


def test_voiding_is_idempotent_once_the_voiding_record_is_in_the_log():
    again = {**RECORDS, 13: Unsigned(Action.JOB_SUBMISSION_VOIDED, "job-lost", "acme", "ok")}
    assert to_void(again, existing={"job-kept"}) == []


def test_every_orphan_is_voided_in_log_order():
    assert [seq for seq, _ in to_void(RECORDS, existing=set())] == [5, 7]
