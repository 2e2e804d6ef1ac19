"""Errors raised by the audit log."""

from __future__ import annotations


class AuditError(Exception):
    """Base class for audit-log failures."""


class AuditLogNotFound(AuditError, FileNotFoundError):
    """The directory holds no audit log (``init_audit`` was never run there)."""


class AuditLogExists(AuditError, FileExistsError):
    """``init_audit`` was asked to create a log where one already exists."""


class AuditLogCorrupt(AuditError):
    """A file of the audit log cannot be read as what it should be."""


class AuditLogBusy(AuditError):
    """Another process holds the log open for writing."""


class AuditLogClosed(AuditError):
    """An append or rotation was attempted on a closed log."""


class AuditLogUnavailable(AuditError):
    """The log cannot be written now (a full disk, an I/O error); the failed write left it as it was."""


class AuditKeyError(AuditError):
    """An audit signing or verification key is missing or unreadable."""


class SecretMaterialError(AuditError, ValueError):
    """Record details look like they carry secret material."""
