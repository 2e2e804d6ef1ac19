"""Audit log throughput: signed, hash-chained appends and full verification, next to plain unsigned JSONL.

Run: .venv/bin/python benchmarks/bench_audit.py [--quick]

Measures, in one run on the same disk, the two sides taking turns (median of the rounds):
  * append records/s with the audit log's two fsync policies
    - at_checkpoint: records buffered by the OS, fsync + Ed25519 checkpoint every 1000 records
    - each_record:   fdatasync before every append returns (the default policy)
    and a plain JSONL writer (json.dumps + write) with the same two policies;
  * verify records/s over the whole audit log (hash chain, canonical form, checkpoint signatures)
    next to reading the plain JSONL back with json.loads (no integrity at all).
Writes benchmarks/results/bench_audit.json and bench_audit.png (``--quick``: a temporary folder, or ``--out``).
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

from cantata.security.audit import Action, AuditLog, Durability, init_audit, verify

ROUNDS = 4  # buffered appends and verification: 4 turns per side
SYNCED_ROUNDS = 8  # fsync-per-record appends: short turns, as the disk's fsync latency drifts


def sample(i: int) -> dict:
    tenant = ("acme", "globex", "initech")[i % 3]
    return {
        "actor": f"spiffe://cantata/tenant/{tenant}",
        "action": Action.JOB_SUBMITTED.value,
        "resource": f"job-{i:06d}",
        "tenant": tenant,
        "outcome": "ok",
        "peer": "ipv4:10.0.0.7:40112",
        "details": {"workers": 4, "algorithm": "gasloc", "steps": 300},
    }


def audit_append(directory: Path, first: int, count: int, durability: Durability) -> float:
    """Append records ``first..first+count`` to the audit log in ``directory`` (made on first use)."""
    if not directory.exists():
        init_audit(directory)
    log = AuditLog.open(directory, durability=durability)
    start = time.perf_counter()
    for i in range(first, first + count):
        fields = sample(i)
        log.append(fields.pop("actor"), fields.pop("action"), **fields)
    log.close()
    return count / (time.perf_counter() - start)


def plain_append(path: Path, first: int, count: int, fsync_each: bool) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for i in range(first, first + count):
        os.write(fd, json.dumps(sample(i), sort_keys=True).encode() + b"\n")
        if fsync_each:
            os.fdatasync(fd)
    os.fsync(fd)
    os.close(fd)
    return count / (time.perf_counter() - start)


def audit_verify(directory: Path, count: int) -> float:
    start = time.perf_counter()
    result = verify(directory)
    elapsed = time.perf_counter() - start
    if not result.ok or result.records_total != count:
        raise SystemExit(f"benchmark log failed verification: {result.message}")
    return count / elapsed


def plain_read(path: Path, count: int) -> float:
    start = time.perf_counter()
    with path.open("rb") as lines:
        parsed = sum(1 for line in lines if json.loads(line))
    elapsed = time.perf_counter() - start
    assert parsed == count
    return count / elapsed


def alternate(rounds: int, audit: Callable[[int], float], plain: Callable[[int], float]) -> tuple[float, float]:
    """Run the two sides in turns (so disk and CPU noise hits both alike); median records/s of each."""
    rates = harness.medians(harness.interleave({"audit": audit, "plain": plain}, rounds))
    return rates["audit"], rates["plain"]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["append\nat_checkpoint", "append\neach_record", "verify / read"]
    audit = [
        results["append"]["at_checkpoint"]["audit_records_per_s"],
        results["append"]["each_record"]["audit_records_per_s"],
        results["verify"]["audit_records_per_s"],
    ]
    plain = [
        results["append"]["at_checkpoint"]["plain_records_per_s"],
        results["append"]["each_record"]["plain_records_per_s"],
        results["verify"]["plain_records_per_s"],
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], audit, width=0.4, label="audit log (chained, signed)")
    ax.bar([x + 0.2 for x in xs], plain, width=0.4, label="plain JSONL")
    ax.set_xticks(list(xs), labels)
    ax.set_yscale("log")
    ax.set_ylim(top=max(audit + plain) * 10)
    ax.set_ylabel("records / s (log scale)")
    ax.set_title(f"Audit log throughput ({results['records']} records)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 records instead of 100,000")
    harness.add_output_argument(parser)
    args = parser.parse_args()
    count = 10_000 if args.quick else 100_000
    batch = count // ROUNDS
    synced = 100 if args.quick else 250
    work = Path(tempfile.mkdtemp(prefix="bench-audit-", dir=os.environ.get("BENCH_DIR")))
    try:
        buffered_audit, buffered_plain = alternate(
            ROUNDS,
            lambda r: audit_append(work / "audit", r * batch, batch, Durability.AT_CHECKPOINT),
            lambda r: plain_append(work / "plain.jsonl", r * batch, batch, fsync_each=False),
        )
        synced_audit, synced_plain = alternate(
            SYNCED_ROUNDS,
            lambda r: audit_append(work / "audit-synced", r * synced, synced, Durability.EACH_RECORD),
            lambda r: plain_append(work / "plain-synced.jsonl", r * synced, synced, fsync_each=True),
        )
        verify_audit, read_plain = alternate(
            ROUNDS, lambda _: audit_verify(work / "audit", count), lambda _: plain_read(work / "plain.jsonl", count)
        )
        audit_bytes = sum(p.stat().st_size for p in (work / "audit" / "segments").iterdir())
        plain_bytes = (work / "plain.jsonl").stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def pair(audit: float, plain: float, records: int, policy: str) -> dict:
        return {
            "records": records,
            "fsync_policy": policy,
            "audit_records_per_s": round(audit),
            "plain_records_per_s": round(plain),
            "audit_over_plain": round(audit / plain, 3),
        }

    results = {
        "records": count,
        "quick": args.quick,
        "append": {
            "at_checkpoint": pair(
                buffered_audit,
                buffered_plain,
                count,
                "OS-buffered; audit fsyncs segment + signs a checkpoint every 1000 records; "
                "plain fsyncs once at the end",
            ),
            "each_record": pair(
                synced_audit, synced_plain, synced * SYNCED_ROUNDS, "fdatasync after every record (both)"
            )
            | {"note": "bound by the disk's fsync latency, which drifts on a shared machine; expect a ratio near 1"},
        },
        "verify": pair(verify_audit, read_plain, count, "n/a (read path)")
        | {"what": "audit: full verify (chain, canonical form, signatures); plain: json.loads per line"},
        "bytes_per_record": {"audit": round(audit_bytes / count, 1), "plain": round(plain_bytes / count, 1)},
    }
    out = harness.output_dir(args.out, args.quick)
    print(json.dumps(results, indent=2))
    print(f"wrote {harness.write_results('audit', results, out)}")
    plot(results, harness.result_file(out, "audit", ".png"))


if __name__ == "__main__":
    main()
