"""The server's log lines: plain text for people, or one JSON object per line for log shippers.

``cantata server start --log-format json`` writes each record as a JSON object
with ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, plus the
fields a call's line carries (``method``, ``principal``, ``code``,
``latency_ms``, ``request_id``) and ``exception`` with a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CALL_FIELDS = ("method", "principal", "code", "latency_ms", "request_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({name: getattr(record, name) for name in CALL_FIELDS if hasattr(record, name)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str, level: int = logging.INFO) -> None:
    """Send the root logger's records to stderr in ``log_format`` (``text`` or ``json``)."""
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; choose one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
