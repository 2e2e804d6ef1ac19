"""Log lines as people and log shippers read them: plain text, or one JSON object per line.

``CANTATA_LOG_FORMAT`` (``text``, the default, or ``json``) chooses; a server
passes its environment on to the workers it starts, so one setting covers
both. A record's ``fields`` (``logger.info(..., extra={"fields": {...}})``)
become keys of its JSON object; the text form shows the message only.
Imports nothing of ours, so any package may use it.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import time
from typing import IO

LOG_FORMAT_ENV = "CANTATA_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def log_format(environ: dict[str, str] | os._Environ[str] = os.environ) -> LogFormat:
    """The format ``CANTATA_LOG_FORMAT`` names; a ValueError names the allowed ones."""
    value = environ.get(LOG_FORMAT_ENV, "") or LogFormat.TEXT.value
    try:
        return LogFormat(value.lower())
    except ValueError:
        raise ValueError(f"{LOG_FORMAT_ENV}={value!r}: use {' or '.join(LogFormat)}") from None


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, RFC 3339), level, logger, message, then the record's fields."""

    def __init__(self, static: dict[str, object] | None = None) -> None:
        super().__init__()
        self._static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            **self._static,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(stream: IO[str], fmt: LogFormat, *, level: int = logging.INFO, static: dict | None = None) -> None:
    """Send the root logger's records at ``level`` and above to ``stream`` in ``fmt``."""
    handler = logging.StreamHandler(stream)
    if fmt is LogFormat.JSON:
        handler.setFormatter(JsonFormatter(static))
    else:
        formatter = logging.Formatter(TEXT_FORMAT, "%Y-%m-%dT%H:%M:%SZ")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
