"""The names of audited acts and their outcomes, shared by every writer of the log."""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """A security-relevant act recorded in the audit log."""

    # tenancy and identity
    TENANCY_REQUESTED = "tenancy_requested"
    TENANCY_EXPIRED = "tenancy_expired"  # a pending request nobody approved in time: its name is free again
    TENANT_APPROVED = "tenant_approved"
    TENANT_REJECTED = "tenant_rejected"
    TENANT_SUSPENDED = "tenant_suspended"
    TENANT_RESUMED = "tenant_resumed"
    CERTIFICATE_ISSUED = "certificate_issued"
    CERTIFICATE_REVOKED = "certificate_revoked"
    QUOTA_CHANGED = "quota_changed"
    RETENTION_CHANGED = "retention_changed"
    DASHBOARD_LINK_ISSUED = "dashboard_link_issued"  # a one-time login link for the web dashboard
    DASHBOARD_LOGIN = "dashboard_login"  # a login link redeemed (ok) or refused: unknown, expired or used
    # authentication and authorization refusals
    AUTH_FAILED = "auth_failed"
    AUTHZ_DENIED = "authz_denied"
    # jobs
    JOB_SUBMITTED = "job_submitted"
    JOB_STARTED = "job_started"
    JOB_RESTARTED = "job_restarted"  # a worker failed: its group restarts from the latest checkpoint
    JOB_CANCEL_REQUESTED = "job_cancel_requested"
    JOB_CANCELLED = "job_cancelled"
    JOB_FINISHED = "job_finished"
    JOB_RESUMED = "job_resumed"
    JOB_DELETED = "job_deleted"  # its records and checkpoints, by its tenant or by the tenant's retention
    # a job_submitted record whose job a crash took before its commit was durable: that job never existed
    JOB_SUBMISSION_VOIDED = "job_submission_voided"
    # sweeps: a search over job fields whose trials are jobs (their own records are the jobs')
    SWEEP_SUBMITTED = "sweep_submitted"
    SWEEP_CANCEL_REQUESTED = "sweep_cancel_requested"
    SWEEP_TRIAL_STARTED = "sweep_trial_started"  # a trial's job was submitted
    SWEEP_TRIAL_PRUNED = "sweep_trial_pruned"  # the pruner stopped a trial early: its job is cancelled as "pruned"
    SWEEP_FINISHED = "sweep_finished"
    # checkpoints
    CHECKPOINT_WRITTEN = "checkpoint_written"
    CHECKPOINT_READ = "checkpoint_read"
    CHECKPOINT_DOWNLOADED = "checkpoint_downloaded"
    # data keys
    KEY_CREATED = "key_created"
    KEY_ROTATED = "key_rotated"
    KEY_UNWRAPPED = "key_unwrapped"
    # tenant data sources
    DATA_SOURCE_REGISTERED = "data_source_registered"
    DATA_SOURCE_DELETED = "data_source_deleted"
    DATA_SOURCE_RELEASED = "data_source_released"  # credentials handed to one job's workers
    # tenant webhooks
    WEBHOOK_ADDED = "webhook_added"
    WEBHOOK_REMOVED = "webhook_removed"
    # training integrity
    GRADIENT_ANOMALY_DETECTED = "gradient_anomaly_detected"
    PEER_QUARANTINED = "peer_quarantined"
    ATTACK_SIMULATION_PLANNED = "attack_simulation_planned"
    FAULT_INJECTION_PLANNED = "fault_injection_planned"  # evaluation only: an admin corrupts a queued job's loss
    JOB_ROLLED_BACK = "job_rolled_back"  # a recovery policy restored a checkpoint and skipped the data since
    # platform
    SERVER_STARTED = "server_started"
    SERVER_STOPPED = "server_stopped"
    WORKER_UID_RETIRED = "worker_uid_retired"  # a job's uid could not be taken back: it is never used again
    AUDIT_KEY_ROTATED = "audit_key_rotated"
    AUDIT_LOG_RECOVERED = "audit_log_recovered"


class Outcome(StrEnum):
    """How an audited act ended; writers may also use other lowercase words."""

    OK = "ok"
    DENIED = "denied"
    REFUSED = "refused"
    FAILED = "failed"


DENIAL_ACTIONS = frozenset({Action.AUTH_FAILED, Action.AUTHZ_DENIED})
ANOMALY_ACTIONS = frozenset({Action.GRADIENT_ANOMALY_DETECTED, Action.PEER_QUARANTINED})
