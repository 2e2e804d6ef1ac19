"""Audit lookup: ``find_records`` (segment skipping and a byte prefilter) next to parsing every record and filtering.

Run: .venv/bin/python benchmarks/bench_audit_lookup.py [--quick]

One log of 100,000 records (``--quick``: 20,000) over three tenants, each record with its request id,
as ``cantata audit events`` reads it. Each query is answered both ways, the two taking turns (median of
the rounds); both must return the same records. The baseline is what a lookup without an index does:
``read_records`` (every line parsed into a record) and the filters in Python.
Writes benchmarks/results/bench_audit_lookup.json (``--quick``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import harness

from cantata.security.audit import AuditEntry, AuditLog, Durability, find_records, init_audit, read_records

ROUNDS = 3
PAGE = 100


def build(directory: Path, count: int) -> None:
    init_audit(directory)
    with AuditLog.open(directory, durability=Durability.AT_CHECKPOINT) as log:
        for first in range(0, count, 1000):
            log.append_all(
                [
                    AuditEntry(
                        f"spiffe://cantata/tenant/{('acme', 'globex', 'initech')[i % 3]}",
                        "job_deleted" if i % 500 == 0 else "job_submitted",
                        resource=f"job-{i:06d}",
                        tenant=("acme", "globex", "initech")[i % 3],
                        peer="ipv4:10.0.0.7:40112",
                        details={"request_id": f"{i:032x}", "workers": 4, "steps": 300},
                    )
                    for i in range(first, min(first + 1000, count))
                ]
            )


def baseline(directory: Path, query: dict) -> list[int]:
    """Every record parsed, then filtered: at most one page."""
    found = []
    for record in read_records(directory, tenant=query.get("tenant")):
        if record.seq <= query.get("after", 0):
            continue
        if query.get("action") and record.action != query["action"]:
            continue
        if query.get("request_id") and record.details.get("request_id") != query["request_id"]:
            continue
        found.append(record.seq)
        if len(found) == PAGE:
            break
    return found


def lookup(directory: Path, query: dict) -> list[int]:
    return [r.seq for r in find_records(directory, limit=PAGE, **query)]


def timed(answer: Callable[[], list[int]], answers: list[list[int]]) -> float:
    start = time.perf_counter()
    answers.append(answer())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 records instead of 100,000")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    count = 20_000 if args.quick else 100_000
    queries = {
        "one request id": {"request_id": f"{count // 2:032x}"},
        "a tenant's deletions": {"tenant": "globex", "action": "job_deleted"},
        "the last page of all records": {"after": count - PAGE},
    }
    work = Path(tempfile.mkdtemp(prefix="bench-audit-lookup-", dir=os.environ.get("BENCH_DIR")))
    results: dict = {"records": count, "page": PAGE, "rounds": ROUNDS, "quick": args.quick, "queries": {}}
    try:
        build(work / "audit", count)
        results["log_bytes"] = sum(p.stat().st_size for p in (work / "audit" / "segments").iterdir())
        for label, query in queries.items():
            answers: dict[str, list[list[int]]] = {"lookup": [], "baseline": []}
            seconds = harness.medians(
                harness.interleave(
                    {
                        "lookup": lambda _, q=query, a=answers: timed(lambda: lookup(work / "audit", q), a["lookup"]),
                        "baseline": lambda _, q=query, a=answers: timed(
                            lambda: baseline(work / "audit", q), a["baseline"]
                        ),
                    },
                    ROUNDS,
                )
            )
            if any(a != answers["baseline"][0] for a in answers["lookup"] + answers["baseline"]):
                raise SystemExit(f"{label}: the two ways found different records")
            results["queries"][label] = {
                "query": query,
                "matches": len(answers["lookup"][0]),
                "lookup_s": round(seconds["lookup"], 4),
                "baseline_s": round(seconds["baseline"], 4),
                "speedup": round(seconds["baseline"] / seconds["lookup"], 1),
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = harness.output_dir(args.out, args.quick)
    print(json.dumps(results, indent=2))
    print(f"wrote {harness.write_results('audit_lookup', results, out)}")


if __name__ == "__main__":
    main()
