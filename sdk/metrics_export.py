"""A job's metrics history as a file a BI tool opens as it is: CSV, JSON or Parquet.

One row per point, in the columns of :data:`COLUMNS`: ``time`` is the UTC
time the server recorded the point (Parquet: ``timestamp[ms, UTC]``; CSV and
JSON: ISO 8601 with ``Z``); ``peer`` is empty (null) except for per-peer
metrics; a value that was not a number (a diverged loss) is empty (null).
Parquet needs ``pyarrow`` (``pip install 'cantata[parquet]'``), loaded only
when that format is asked for.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from cantata.sdk.client import MetricRow

FORMATS = ("csv", "json", "parquet")
COLUMNS = ("job_id", "time", "step", "worker", "name", "value", "peer", "seq")


def records(job_id: str, rows: Sequence[MetricRow]) -> list[dict[str, Any]]:
    """The rows as plain values: ISO times, None for no peer and for a value that is not a number."""
    return [
        {
            "job_id": job_id,
            "time": r.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "step": r.step,
            "worker": r.worker,
            "name": r.name,
            "value": r.value if math.isfinite(r.value) else None,
            "peer": r.peer,
            "seq": r.seq,
        }
        for r in rows
    ]


def write_csv(job_id: str, rows: Sequence[MetricRow], out: IO[str]) -> None:
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for record in records(job_id, rows):
        writer.writerow({k: "" if v is None else v for k, v in record.items()})


def write_json(job_id: str, rows: Sequence[MetricRow], out: IO[str]) -> None:
    json.dump(records(job_id, rows), out, indent=None, separators=(",", ":"))
    out.write("\n")


def parquet_bytes(job_id: str, rows: Sequence[MetricRow]) -> bytes:
    """The rows as one Parquet file with typed columns (a ``timestamp[ms, UTC]`` time, ``int64`` steps ...)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("job_id", pa.string()),
            ("time", pa.timestamp("ms", tz="UTC")),
            ("step", pa.int64()),
            ("worker", pa.int32()),
            ("name", pa.string()),
            ("value", pa.float64()),
            ("peer", pa.int32()),
            ("seq", pa.int64()),
        ]
    )
    table = pa.table(
        {
            "job_id": [job_id] * len(rows),
            "time": [r.time for r in rows],
            "step": [r.step for r in rows],
            "worker": [r.worker for r in rows],
            "name": [r.name for r in rows],
            "value": [r.value if math.isfinite(r.value) else None for r in rows],
            "peer": [r.peer for r in rows],
            "seq": [r.seq for r in rows],
        },
        schema=schema,
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def export(job_id: str, rows: Sequence[MetricRow], fmt: str, out: Path | None, stdout: IO[str]) -> None:
    """Write the rows in ``fmt`` to ``out`` (replaced whole, never left half written), or to ``stdout``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if out is None:
            raise ValueError("parquet is binary: give --out FILE")
        data = parquet_bytes(job_id, rows)
    else:
        text = io.StringIO()
        (write_csv if fmt == "csv" else write_json)(job_id, rows, text)
        if out is None:
            stdout.write(text.getvalue())
            return
        data = text.getvalue().encode()
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(data)
    partial.replace(out)
