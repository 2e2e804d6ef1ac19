"""Rendering an audit report as text, JSON, Markdown or one self-contained HTML file."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable

from .record import AuditRecord, format_time
from .report import Report

REPORT_FORMATS = ("text", "json", "markdown", "html")
_RECORD_COLUMNS = ("seq", "time", "tenant", "actor", "action", "resource", "outcome", "peer", "details")


def _iso(moment) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%SZ}" if moment is not None else "-"


def _verdict(report: Report) -> str:
    result = report.verification
    counts = (
        f"{result.records_valid}/{result.records_total} records valid, "
        f"{result.checkpoints_valid}/{result.checkpoints_total} checkpoints valid"
    )
    if result.ok:
        return f"INTACT: {counts}"
    where = f"seq {result.first_break}" if result.first_break is not None else "the checkpoints"
    return f"BROKEN at {where} ({result.kind}): {result.findings[0].message}; {counts}"


def _cells(record: AuditRecord) -> list[str]:
    return [
        str(record.seq),
        format_time(record.time),
        record.tenant,
        record.actor,
        record.action,
        record.resource,
        record.outcome,
        record.peer,
        json.dumps(dict(record.details), sort_keys=True) if record.details else "",
    ]


def _text_row(record: AuditRecord) -> str:
    row = f"  #{record.seq} {_iso(record.time)} {record.action} by {record.actor}"
    for name in ("resource", "tenant", "outcome", "peer"):
        if value := getattr(record, name):
            row += f" {name}={value}"
    return row + (f" {json.dumps(dict(record.details), sort_keys=True)}" if record.details else "")


def _width_words(report: Report) -> str:
    seconds = int(report.bucket_width.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


def _sections(report: Report) -> list[tuple[str, tuple[AuditRecord, ...]]]:
    return [
        ("Refusals: authentication failures and authorization denials", report.refusals),
        ("Anomalies: gradient anomalies and quarantined peers", report.anomalies),
        ("Tenant approvals", report.approvals),
    ]


def render_text(report: Report) -> str:
    lines = [
        f"Cantata audit report: {report.scope}",
        f"Generated {_iso(report.generated)}",
        f"Verification: {_verdict(report)}",
        "",
        f"Records: {report.total} ({_iso(report.first_time)} to {_iso(report.last_time)})",
        "",
        "Per tenant:",
    ]
    lines += [f"  {name:<24} {count:>8}" for name, count in report.by_tenant.items()] or ["  (none)"]
    lines += ["", "Per action:"]
    lines += [f"  {name:<32} {count:>8}" for name, count in report.by_action.items()] or ["  (none)"]
    lines += ["", "Per tenant and action:"]
    for name, counts in report.by_tenant_action.items():
        lines.append(f"  {name}: " + ", ".join(f"{action} {count}" for action, count in counts.items()))
    peak = max((bucket.records for bucket in report.timeline), default=0)
    lines += ["", f"Timeline ({_width_words(report)} per row; '#' records, refusals in brackets):"]
    for bucket in report.timeline:
        bar = "#" * (round(40 * bucket.records / peak) if peak else 0)
        lines.append(f"  {_iso(bucket.start)} {bar:<40} {bucket.records:>7} [{bucket.refusals}]")
    for title, records in _sections(report):
        lines += ["", f"{title}: {len(records)}"]
        lines += [_text_row(record) for record in records]
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    result = report.verification
    document = {
        "scope": {
            "tenant": report.tenant,
            "since": _iso(report.since) if report.since else None,
            "until": _iso(report.until) if report.until else None,
        },
        "generated": _iso(report.generated),
        "verification": {
            "ok": result.ok,
            "records_valid": result.records_valid,
            "records_total": result.records_total,
            "checkpoints_valid": result.checkpoints_valid,
            "checkpoints_total": result.checkpoints_total,
            "first_break": result.first_break,
            "kind": str(result.kind) if result.kind else None,
            "findings": [{"seq": f.seq, "kind": str(f.kind), "message": f.message} for f in result.findings],
        },
        "records": report.total,
        "first_time": _iso(report.first_time) if report.first_time else None,
        "last_time": _iso(report.last_time) if report.last_time else None,
        "by_tenant": report.by_tenant,
        "by_action": report.by_action,
        "by_tenant_action": report.by_tenant_action,
        "bucket_seconds": int(report.bucket_width.total_seconds()),
        "timeline": [{"start": _iso(b.start), "records": b.records, "refusals": b.refusals} for b in report.timeline],
        "refusals": [r.to_dict() for r in report.refusals],
        "anomalies": [r.to_dict() for r in report.anomalies],
        "approvals": [r.to_dict() for r in report.approvals],
    }
    return json.dumps(document, indent=2) + "\n"


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_markdown_cell(str(cell)) for cell in row) + " |" for row in rows]
    return lines


def render_markdown(report: Report) -> str:
    mark = "✅" if report.verification.ok else "❌"
    lines = [
        "# Cantata audit report",
        "",
        f"*{report.scope}; generated {_iso(report.generated)}*",
        "",
        f"**Verification:** {mark} {_markdown_cell(_verdict(report))}",
        "",
        f"**Records:** {report.total} ({_iso(report.first_time)} to {_iso(report.last_time)})",
        "",
        "## Per tenant",
        "",
    ]
    lines += _markdown_table(("tenant", "records"), report.by_tenant.items())
    lines += ["", "## Per action", ""]
    lines += _markdown_table(("action", "records"), report.by_action.items())
    lines += ["", "## Per tenant and action", ""]
    lines += _markdown_table(
        ("tenant", "action", "records"),
        ((t, a, n) for t, counts in report.by_tenant_action.items() for a, n in counts.items()),
    )
    lines += ["", f"## Timeline ({_width_words(report)} buckets)", ""]
    lines += _markdown_table(
        ("from", "records", "refusals"), ((_iso(b.start), b.records, b.refusals) for b in report.timeline)
    )
    for title, records in _sections(report):
        lines += ["", f"## {title} ({len(records)})", ""]
        lines += _markdown_table(_RECORD_COLUMNS, (_cells(record) for record in records))
    return "\n".join(lines) + "\n"


def activity_svg(report: Report, *, width: int = 760, height: int = 220) -> str:
    """An inline SVG bar chart of records (and refusals) per timeline bucket."""
    left, bottom, top = 48, 28, 12
    plot_w, plot_h = width - left - 8, height - bottom - top
    buckets = report.timeline
    peak = max((b.records for b in buckets), default=0) or 1
    bar_w = plot_w / max(len(buckets), 1)
    parts = [
        f'<svg role="img" aria-label="Audit records over time" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#555"/>',
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end" font-size="11">{peak}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    for index, bucket in enumerate(buckets):
        x = left + index * bar_w
        for count, colour in ((bucket.records, "#4a78c2"), (bucket.refusals, "#c8443a")):
            if count:
                h = plot_h * count / peak
                parts.append(
                    f'<rect x="{x + 0.5:.1f}" y="{top + plot_h - h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                    f'height="{h:.1f}" fill="{colour}"><title>{_iso(bucket.start)}: {bucket.records} '
                    f"records, {bucket.refusals} refusals</title></rect>"
                )
    if buckets:
        parts.append(f'<text x="{left}" y="{height - 8}" font-size="11">{_iso(buckets[0].start)}</text>')
        parts.append(
            f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end" font-size="11">'
            f"{_iso(buckets[-1].start)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _html_table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;font-size:.9em;text-align:left;vertical-align:top}th{background:#f2f2f2}
.ok{background:#e5f5e5;border:1px solid #5a5;padding:.6em}.broken{background:#fbe5e3;border:1px solid #c44;padding:.6em}
.legend span{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 1em;vertical-align:middle}"""


def render_html(report: Report) -> str:
    verdict_class = "ok" if report.verification.ok else "broken"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>Cantata audit report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Cantata audit report</h1>",
        f"<p><em>{html.escape(report.scope)}; generated {_iso(report.generated)}</em></p>",
        f'<p class="{verdict_class}"><strong>Verification:</strong> {html.escape(_verdict(report))}</p>',
        f"<p><strong>Records:</strong> {report.total} ({_iso(report.first_time)} to {_iso(report.last_time)})</p>",
        f"<h2>Activity over time ({_width_words(report)} buckets)</h2>",
        activity_svg(report),
        '<p class="legend"><span style="background:#4a78c2"></span>records'
        '<span style="background:#c8443a"></span>refusals</p>',
        "<h2>Per tenant</h2>",
        _html_table(("tenant", "records"), report.by_tenant.items()),
        "<h2>Per action</h2>",
        _html_table(("action", "records"), report.by_action.items()),
        "<h2>Per tenant and action</h2>",
        _html_table(
            ("tenant", "action", "records"),
            ((t, a, n) for t, counts in report.by_tenant_action.items() for a, n in counts.items()),
        ),
    ]
    for title, records in _sections(report):
        parts += [
            f"<h2>{html.escape(title)} ({len(records)})</h2>",
            _html_table(_RECORD_COLUMNS, (_cells(record) for record in records)),
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


_RENDERERS: dict[str, Callable[[Report], str]] = {
    "text": render_text,
    "json": render_json,
    "markdown": render_markdown,
    "html": render_html,
}


def render_report(report: Report, fmt: str = "text") -> str:
    """The report in ``fmt``: one of :data:`REPORT_FORMATS`."""
    try:
        renderer = _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown report format {fmt!r}; choose one of {', '.join(REPORT_FORMATS)}") from None
    return renderer(report)
