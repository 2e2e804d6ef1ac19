"""Tamper-evident audit log: hash-chained records, Ed25519-signed checkpoints, verification and reports.

Typical use::

    init_audit(data_dir / "audit")                      # once, at `cantata server init`
    log = AuditLog.open(data_dir / "audit")
    log.append(principal.uri, Action.TENANT_APPROVED, resource="acme", tenant="acme", peer=peer)
    log.close()                                         # signs a final checkpoint
    result = verify(data_dir / "audit"); print(result.summary())
    print(render_report(build_report(data_dir / "audit", tenant="acme"), "markdown"))
"""

from .actions import ANOMALY_ACTIONS, DENIAL_ACTIONS, Action, Outcome
from .anchor import export_checkpoints, read_anchor
from .errors import (
    AuditError,
    AuditKeyError,
    AuditLogBusy,
    AuditLogClosed,
    AuditLogCorrupt,
    AuditLogExists,
    AuditLogNotFound,
    AuditLogUnavailable,
    SecretMaterialError,
)
from .keys import load_public_keys_file
from .log import AuditEntry, AuditLog, Durability, init_audit
from .lookup import REQUEST_ID_DETAIL, find_records
from .record import AuditRecord
from .render import REPORT_FORMATS, render_report
from .report import Report, build_report
from .segments import read_records
from .tail import Unsigned
from .verify import BreakKind, Finding, VerifyResult, verify

__all__ = [
    "ANOMALY_ACTIONS",
    "DENIAL_ACTIONS",
    "REPORT_FORMATS",
    "REQUEST_ID_DETAIL",
    "Action",
    "AuditEntry",
    "AuditError",
    "AuditKeyError",
    "AuditLog",
    "AuditLogBusy",
    "AuditLogClosed",
    "AuditLogCorrupt",
    "AuditLogExists",
    "AuditLogNotFound",
    "AuditLogUnavailable",
    "AuditRecord",
    "BreakKind",
    "Durability",
    "Finding",
    "Outcome",
    "Report",
    "SecretMaterialError",
    "Unsigned",
    "VerifyResult",
    "build_report",
    "export_checkpoints",
    "find_records",
    "init_audit",
    "load_public_keys_file",
    "read_anchor",
    "read_records",
    "render_report",
    "verify",
]
