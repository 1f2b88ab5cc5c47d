"""A chaos run's report for people and for CI: ``report.html`` and ``junit.xml`` (``spark-eos chaos --report DIR``).

``report.html`` is one self-contained file (inline CSS and SVG, no script, nothing fetched): the
verdict; a timeline of every process of the run (the chaos runs, the draining run, the reference
runs) with the batches each committed (from the checkpoint's ``offsets/n`` and ``commits/n``), the
fault points that fired in it (from the fault log), how each run ended (SIGKILL, a fault point, by
itself) and the faults injected from outside (server restarts, cut or stalled connections, broker
crashes) as bands; the checker's findings; each fault with its proof; and, when the oracle
disagrees, the first differing rows side by side with the differing values marked.

``timeline.svg`` is the timeline alone (to put in a document or an issue). ``junit.xml`` holds one
test case per check (a failed check is a ``<failure>`` with its summary and
offending ids), the run's seed, kinds and command as properties, and the terminal table as
``system-out``: what Jenkins, GitLab and GitHub annotate.

Everything is read from the run's workdir (``report.json``'s report, ``runs.jsonl``,
``events.jsonl``, ``faults.jsonl``, the checkpoints), so ``write`` works on a finished run's
workdir too.
"""

from __future__ import annotations

import html
import json
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from connectors.toolkit.checker import Report
from eos_core.checkpoint import numbered

__all__ = ["batches", "html_report", "junit_xml", "timeline_svg", "write"]

_ROW = 30
_LEFT = 190
_WIDTH = 1100


def _jsonl(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (FileNotFoundError, ValueError):
        return []


def batches(checkpoint: str) -> list[dict[str, Any]]:
    """Each batch of a checkpoint: its number, when it was planned (``offsets/n``) and committed
    (``commits/n``; None while not committed), from the files' modification times."""
    out = []
    offsets = os.path.join(checkpoint, "offsets")
    commits = os.path.join(checkpoint, "commits")
    for n in numbered(checkpoint, "offsets"):
        planned = os.path.getmtime(os.path.join(offsets, str(n)))
        done = os.path.join(commits, str(n))
        out.append(
            {"batch": n, "planned": planned, "committed": os.path.getmtime(done) if os.path.exists(done) else None}
        )
    return out


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def timeline_svg(
    runs: Sequence[Mapping[str, Any]], fault_log: Sequence[Mapping[str, Any]], *, standalone: bool = False
) -> str:
    """The inline SVG timeline: one row per process, a row for the faults from outside. ``standalone``:
    an SVG file of its own (its namespace, its style, a white background), to put in a document."""
    if not runs:
        return "<p>No process of the run was recorded (runs.jsonl is missing).</p>"
    t0 = min(float(r["start"]) for r in runs)
    t1 = max(float(r.get("end") or r["start"]) for r in runs)
    span = max(t1 - t0, 1.0)
    scale = (_WIDTH - _LEFT - 20) / span

    def x(t: float) -> float:
        return round(_LEFT + (t - t0) * scale, 1)

    rows = len(runs) + 1
    height = 40 + rows * _ROW + 42
    parts = [
        f'<svg class="timeline" width="{_WIDTH}" height="{height}" viewBox="0 0 {_WIDTH} {height}" role="img" '
        'aria-label="timeline of the chaos run"' + (' xmlns="http://www.w3.org/2000/svg">' if standalone else ">")
    ]
    if standalone:
        rules = [line.replace("svg.timeline ", "") for line in _CSS.splitlines() if line.startswith("svg.timeline")]
        parts.append("<style>" + " ".join(rules) + "</style>")
        parts.append(f'<rect x="0" y="0" width="{_WIDTH}" height="{height}" fill="#fff"/>')
    step = _tick(span)
    tick = 0.0
    while tick <= span + 1e-6:
        tx = x(t0 + tick)
        parts.append(f'<line x1="{tx}" y1="30" x2="{tx}" y2="{height - 25}" class="grid"/>')
        parts.append(f'<text x="{tx}" y="{height - 10}" class="axis">{tick:.0f}s</text>')
        tick += step
    for i, run in enumerate(runs):
        restarted = bool(i) and runs[i - 1].get("role") == "chaos"
        parts += _run_row(run, 40 + i * _ROW, x, t0, t1, restarted, fault_log)
    parts += _outside_row(runs, fault_log, x, t1)
    parts.append("</svg>")
    return "\n".join(parts)


def _run_row(
    run: Mapping[str, Any],
    y: int,
    x: Callable[[float], float],
    t0: float,
    t1: float,
    restarted: bool,
    fault_log: Sequence[Mapping[str, Any]],
) -> list[str]:
    """One process's row: its bar, its batches (planned to committed), a restart mark (``restarted``: the run
    before it was a chaos run), its SIGKILL, and the fault points that fired in it."""
    parts = []
    role = run.get("role", "chaos")
    label = f"{'run' if role == 'chaos' else role} {run.get('run')} (pid {run.get('pid')})"
    parts.append(f'<text x="8" y="{y + 15}" class="label">{_esc(label)}</text>')
    start, end = float(run["start"]), float(run.get("end") or t1)
    ended = str(run.get("ended_by", ""))
    parts.append(
        f'<rect x="{x(start)}" y="{y + 4}" width="{max(1.0, x(end) - x(start))}" height="16" class="run {role}">'
        f"<title>{_esc(label)}: {_esc(run.get('exit', ''))}; {_esc(ended)}</title></rect>"
    )
    for b in batches(str(run.get("checkpoint", ""))):
        done = b["committed"]
        if done is None or not start - 1 <= done <= end + 1 or b["planned"] > end + 1:
            continue
        bx = x(max(b["planned"], start))
        parts.append(
            f'<rect x="{bx}" y="{y + 7}" width="{max(1.5, x(done) - bx)}" height="10" class="batch">'
            f"<title>batch {b['batch']}: planned +{b['planned'] - t0:.1f}s, committed +{done - t0:.1f}s</title></rect>"
        )
        parts.append(f'<line x1="{x(done)}" y1="{y + 4}" x2="{x(done)}" y2="{y + 20}" class="commit"/>')
    if restarted and role in ("chaos", "drain"):
        parts.append(
            f'<path d="M{x(start)},{y + 2} l5,-6 l-10,0 z" class="restart"><title>restart from the checkpoint'
            f"</title></path>"
        )
    if "SIGKILL" in str(run.get("exit", "")):
        ex = x(end)
        parts.append(
            f'<path d="M{ex - 5},{y + 7} l10,10 M{ex + 5},{y + 7} l-10,10" class="kill">'
            f"<title>{_esc(run.get('exit'))}: {_esc(ended)}</title></path>"
        )
    for e in fault_log:
        when = float(e.get("time", 0))
        if str(e.get("point", "")).startswith("chaos.") or not start <= when <= end:
            continue
        cls = "firing kill-group" if e.get("action") in ("kill-group", "kill", "exit") else "firing"
        if e.get("action") == "sleep" and float(_sleep(e)) == 0:
            continue  # a logging rule (a speculative copy passed): shown with its hold
        parts.append(
            f'<circle cx="{x(when)}" cy="{y + 12}" r="5" class="{cls}"><title>{_esc(e.get("point"))} '
            f"({_esc(e.get('action'))}) batch {_esc(e.get('batch', '-'))} partition {_esc(e.get('partition', '-'))} "
            f"pid {_esc(e.get('pid'))}</title></circle>"
        )
    return parts


def _outside_row(
    runs: Sequence[Mapping[str, Any]], fault_log: Sequence[Mapping[str, Any]], x: Callable[[float], float], t1: float
) -> list[str]:
    """The faults from outside (service faults, from began to healed) on a row of their own, and the
    executor losses and slow tasks marked on the row of the run they hit."""
    parts = []
    outside = [e for e in fault_log if str(e.get("point", "")).startswith("chaos.") and e.get("began")]
    y = 40 + len(runs) * _ROW
    parts.append(f'<text x="8" y="{y + 15}" class="label">faults from outside</text>')
    for e in outside:
        began, healed = float(e["began"]), float(e.get("healed") or e["began"])
        parts.append(
            f'<rect x="{x(began)}" y="{y + 3}" width="{max(3.0, x(healed) - x(began))}" height="18" '
            f'class="outside {"ok" if e.get("ok") else "bad"}"><title>{_esc(e.get("action"))}: '
            f"{_esc(e.get('proof', ''))}</title></rect>"
        )
        label_y = y + 35 + (outside.index(e) % 2) * 11  # neighbours' labels on two lines
        parts.append(f'<text x="{x(began) + 2}" y="{label_y}" class="small">{_esc(e.get("action"))}</text>')
    for e in fault_log:  # executor losses and slow tasks: marked on the row of their run
        if e.get("point") in ("chaos.executor-loss", "chaos.slow-task") and e.get("time"):
            when = float(e["time"])
            row = next((i for i, r in enumerate(runs) if float(r["start"]) <= when <= float(r.get("end") or t1)), None)
            if row is not None:
                parts.append(
                    f'<rect x="{x(when) - 5}" y="{40 + row * _ROW + 2}" width="10" height="20" class="outside '
                    f'{"ok" if e.get("ok") else "bad"}"><title>{_esc(e.get("action"))}: {_esc(e.get("proof", ""))}'
                    "</title></rect>"
                )
    return parts


def _sleep(entry: Mapping[str, Any]) -> float:
    rule = str(entry.get("rule", ""))
    for part in rule.split(":"):
        if part.startswith("seconds="):
            try:
                return float(part.split("=", 1)[1])
            except ValueError:
                return 1.0
    return 5.0


def _tick(span: float) -> float:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600):
        if span / step <= 12:
            return float(step)
    return 7200.0


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{display:inline-block;padding:6px 12px;border-radius:4px;font-weight:700;color:#fff}
.held{background:#2e7d32} .violated{background:#c62828} .undecided{background:#ef6c00}
table{border-collapse:collapse;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.ok{color:#2e7d32;font-weight:600} td.fail{color:#c62828;font-weight:700}
code,pre{font:12px ui-monospace,monospace} pre{background:#f6f6f6;padding:8px;overflow-x:auto}
.diff td.differ{background:#ffe0e0;font-weight:600}
svg.timeline .grid{stroke:#eee} svg.timeline .axis,svg.timeline .small{font:10px sans-serif;fill:#666}
svg.timeline .label{font:12px sans-serif;fill:#333}
svg.timeline .run{fill:#e3eaf3;stroke:#9fb3c8} svg.timeline .run.drain{fill:#e6f2e6} svg.timeline .run.reference{fill:#f1f1f1}
svg.timeline .batch{fill:#7cb342;opacity:.75} svg.timeline .commit{stroke:#33691e;stroke-width:1.5}
svg.timeline .kill{stroke:#c62828;stroke-width:2.5} svg.timeline .firing{fill:#ff9800;stroke:#e65100}
svg.timeline .firing.kill-group{fill:#c62828;stroke:#7f0000} svg.timeline .restart{fill:#1565c0}
svg.timeline .outside.ok{fill:#ffb74d;opacity:.8} svg.timeline .outside.bad{fill:#c62828;opacity:.8}
.legend span{margin-right:14px} .sw{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:middle}
"""


def _verdict(report: Report) -> tuple[str, str]:
    if report.ok:
        return "held", "EXACTLY-ONCE HELD"
    if report.info.get("verdict"):
        return "undecided", str(report.info["verdict"])
    return "violated", "EXACTLY-ONCE VIOLATED"


def _diff_table(diff: Mapping[str, Any]) -> str:
    columns = [str(c) for c in diff.get("columns", [])]
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    out = [f'<table class="diff"><tr><th>row</th><th>side</th>{head}</tr>']
    for i, row in enumerate(diff.get("rows", [])):
        differ = set(row.get("differ") or [])
        what = str(row.get("what"))
        for side, values in (("chaos run", row.get("chaos")), ("reference run", row.get("reference"))):
            cells = "".join(
                f'<td class="{"differ" if c in differ or values is None else ""}">'
                f"{'&mdash;' if values is None else _esc(values.get(c))}</td>"
                for c in columns
            )
            first = f'<td rowspan="2">{i + 1}: {_esc(what)}</td>' if side == "chaos run" else ""
            out.append(f"<tr>{first}<td>{side}</td>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def html_report(report: Report, workdir: str, command: str | None = None) -> str:
    """The whole ``report.html`` as a string."""
    runs = _jsonl(os.path.join(workdir, "runs.jsonl"))
    fault_log = _jsonl(os.path.join(workdir, "faults.jsonl"))
    events = _jsonl(os.path.join(workdir, "events.jsonl"))
    cls, verdict = _verdict(report)
    info = report.info
    title = f"spark-eos chaos: {info.get('app') or info.get('pipeline', '')} seed {info.get('seed', '')}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p><span class="verdict {cls}">{_esc(verdict)}</span> &nbsp; {_esc(info.get("records", ""))} records, '
        f"{_esc(info.get('kills', ''))} faults ({_esc(info.get('faults', 'kill:1,fault-point:1'))}), "
        f"{_esc(info.get('wall_seconds', ''))} s, generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>",
    ]
    if command:
        out.append(f"<p>Reproduce: <code>{_esc(command)}</code></p>")
    out += [
        "<h2>Timeline</h2>",
        '<p class="legend"><span><i class="sw" style="background:#e3eaf3"></i>a run of the job</span>'
        '<span><i class="sw" style="background:#7cb342"></i>a batch, planned to committed</span>'
        '<span><i class="sw" style="background:#c62828"></i>SIGKILL / a kill at a fault point</span>'
        '<span><i class="sw" style="background:#ff9800"></i>a fault point that held a task</span>'
        '<span><i class="sw" style="background:#1565c0"></i>restart from the checkpoint</span>'
        '<span><i class="sw" style="background:#ffb74d"></i>a fault from outside (hover for its proof)</span></p>',
        timeline_svg(runs, fault_log),
        "<h2>Findings</h2>",
        "<table><tr><th>check</th><th>result</th><th>detail</th></tr>",
    ]
    for c in report.checks:
        out.append(
            f'<tr><td>{_esc(c.name)}</td><td class="{"ok" if c.ok else "fail"}">{"ok" if c.ok else "FAIL"}</td>'
            f"<td>{_esc(c.summary)}</td></tr>"
        )
    out.append("</table>")
    for c in report.failures:
        for kind, ids in c.ids.items():
            if ids:
                out.append(f"<p><b>{_esc(c.name)}.{_esc(kind)}</b>:</p><pre>{_esc(chr(10).join(map(str, ids)))}</pre>")
    diff = info.get("oracle_diff")
    if diff and diff.get("rows"):
        out.append("<h2>The first rows where the chaos run and the reference run differ</h2>")
        out.append(
            f"<p>Compared {_esc(diff.get('mode'))}"
            + (f" by key ({_esc(', '.join(diff.get('key') or []))})" if diff.get("key") else " as multisets")
            + (f", tolerance {_esc(diff.get('tolerance'))}" if diff.get("tolerance") else "")
            + "; differing values are marked.</p>"
        )
        out.append(_diff_table(diff))
    minimised = info.get("minimised")
    if minimised:
        out.append("<h2>The smallest failing schedule</h2>")
        out.append(f"<p>{_esc(', '.join(minimised.get('schedule', [])))}</p>")
        out.append(f"<p>Reproduce: <code>{_esc(minimised.get('command', ''))}</code></p>")
    if events:
        out.append("<h2>Faults</h2><table><tr><th>#</th><th>kind</th><th>point</th><th>run</th><th>proof</th></tr>")
        for e in events:
            ok = e.get("ok", "SIGKILL" in str(e.get("exit", "")))
            out.append(
                f"<tr><td>{_esc(e.get('kill'))}</td><td>{_esc(e.get('fault') or e.get('kind'))}</td>"
                f"<td>{_esc(e.get('point') or '')}</td><td>{_esc(e.get('run', ''))}</td>"
                f'<td class="{"" if ok else "fail"}">{_esc(e.get("proof") or e.get("exit"))}</td></tr>'
            )
        out.append("</table>")
    out.append("<h2>Run</h2><table>")
    for key, value in info.items():
        if key in ("oracle_diff", "minimised"):
            continue
        out.append(f"<tr><th>{_esc(key)}</th><td>{_esc(value)}</td></tr>")
    out.append("</table></body></html>")
    return "\n".join(out)


def junit_xml(report: Report, command: str | None = None) -> str:
    """JUnit XML: one test case per check; the run's facts as properties; the table as system-out."""
    info = report.info
    name = f"spark-eos chaos {info.get('app') or info.get('pipeline', '')}".strip()
    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(report.checks)),
        failures=str(len(report.failures)),
        errors="0",
        skipped="0",
        time=str(info.get("wall_seconds", 0)),
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    props = ET.SubElement(suite, "properties")
    for key in ("seed", "records", "kills", "faults", "app", "pipeline", "sink_kind", "oracle", "workdir"):
        if key in info:
            ET.SubElement(props, "property", name=key, value=str(info[key]))
    if command:
        ET.SubElement(props, "property", name="command", value=command)
    classname = "spark_eos.chaos." + str(info.get("app") or info.get("pipeline", "run")).replace(":", ".")
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname=classname, name=c.name, time="0")
        if not c.ok:
            failure = ET.SubElement(case, "failure", message=c.summary, type="ExactlyOnceViolated")
            lines = [f"{c.name}.{k}: {', '.join(map(str, ids))}" for k, ids in c.ids.items() if ids]
            failure.text = "\n".join([c.summary, *lines])
    out = ET.SubElement(suite, "system-out")
    out.text = report.table()
    root = ET.Element("testsuites", tests=suite.get("tests", "0"), failures=suite.get("failures", "0"))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write(report: Report, workdir: str, out_dir: str, *, command: str | None = None) -> list[str]:
    """Write ``report.html``, ``junit.xml`` and ``timeline.svg`` (the timeline alone, to put in a
    document or an issue) into ``out_dir`` (created); their paths."""
    os.makedirs(out_dir, exist_ok=True)
    page = os.path.join(out_dir, "report.html")
    junit = os.path.join(out_dir, "junit.xml")
    svg = os.path.join(out_dir, "timeline.svg")
    with open(page, "w", encoding="utf-8") as fh:
        fh.write(html_report(report, workdir, command))
    with open(junit, "w", encoding="utf-8") as fh:
        fh.write(junit_xml(report, command))
    runs = _jsonl(os.path.join(workdir, "runs.jsonl"))
    with open(svg, "w", encoding="utf-8") as fh:
        fh.write(timeline_svg(runs, _jsonl(os.path.join(workdir, "faults.jsonl")), standalone=True) if runs else "")
    return [page, junit, svg]
