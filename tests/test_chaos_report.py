"""Issue 30 item 5: report.html (self-contained: inline SVG timeline, findings, the oracle's first
differing rows) and junit.xml, from a chaos run's workdir; and the oracle's side-by-side differences."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from connectors.toolkit import checker, oracle, report


def _workdir(tmp_path: Path) -> Path:
    """A finished run's workdir: two chaos runs (the first SIGKILLed at a fault point), a drain, a
    pg-crash injected from outside, batches in the checkpoint, the events."""
    t0 = 1_800_000_000.0
    ck = tmp_path / "checkpoint"
    for d in ("offsets", "commits"):
        (ck / d).mkdir(parents=True)
    for n, (planned, committed) in enumerate([(2, 3), (4, 5), (6, None), (12, 13), (25, 26)]):
        (ck / "offsets" / str(n)).write_text("v1\n")
        os.utime(ck / "offsets" / str(n), (t0 + planned, t0 + planned))
        if committed is not None:
            (ck / "commits" / str(n)).write_text("v1\n")
            os.utime(ck / "commits" / str(n), (t0 + committed, t0 + committed))
    runs = [
        {
            "run": 1,
            "role": "chaos",
            "pid": 11,
            "start": t0,
            "end": t0 + 7,
            "exit": "killed by SIGKILL",
            "ended_by": "fault 1: fault sink.after_prepare",
            "checkpoint": str(ck),
        },
        {
            "run": 2,
            "role": "chaos",
            "pid": 12,
            "start": t0 + 10,
            "end": t0 + 20,
            "exit": "killed by SIGKILL",
            "ended_by": "SIGKILL: the schedule is over",
            "checkpoint": str(ck),
        },
        {
            "run": 3,
            "role": "drain",
            "pid": 13,
            "start": t0 + 21,
            "end": t0 + 30,
            "exit": "exit code 0",
            "ended_by": "drained",
            "checkpoint": str(ck),
        },
    ]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    log = [
        {
            "point": "sink.after_prepare",
            "action": "kill-group",
            "batch": 2,
            "partition": 0,
            "pid": 99,
            "time": t0 + 6.5,
            "rule": "sink.after_prepare:batch=2:action=kill-group:once",
        },
        {
            "point": "chaos.pg-crash",
            "action": "pg-crash",
            "began": t0 + 14,
            "healed": t0 + 17.5,
            "time": t0 + 17.5,
            "ok": True,
            "proof": "postmaster started A -> B; a connection while down was refused",
        },
    ]
    (tmp_path / "faults.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    events = [
        {
            "kill": 0,
            "kind": "fault",
            "fault": "fault-point",
            "point": "sink.after_prepare",
            "exit": "killed by SIGKILL",
            "ok": True,
            "proof": "killed by SIGKILL; sink.after_prepare fired (pid 99)",
            "run": 1,
        },
        {
            "kill": 1,
            "kind": "pg-crash",
            "fault": "pg-crash",
            "point": None,
            "exit": "still running",
            "ok": True,
            "proof": "postmaster started A -> B",
            "run": 2,
        },
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return tmp_path


def _failing_report() -> checker.Report:
    got = [
        {"account": "a1", "balance": 10, "events": 2},
        {"account": "a2", "balance": 7, "events": 1},
        {"account": "a3", "balance": 1, "events": 1},
    ]
    want = [
        {"account": "a1", "balance": 5, "events": 1},
        {"account": "a2", "balance": 7, "events": 1},
        {"account": "a4", "balance": 3, "events": 1},
    ]
    rep = oracle.judge(got, [want], mode="upsert", key=("account",))
    rep.add(checker.Check("chaos.kills", True, "1 of 1 planned kills ended the pipeline by SIGKILL"))
    rep.info.update(
        app="balances_job:build", seed=5, records=40, kills=2, faults="fault-point:1,pg-crash:1", wall_seconds=30.0
    )
    return rep


def test_oracle_differences_show_the_first_rows_side_by_side() -> None:
    rep = _failing_report()
    diff = rep.info["oracle_diff"]
    assert diff["columns"] == ["account", "balance", "events"] and diff["key"] == ["account"]
    by_what = {r["what"]: r for r in diff["rows"]}
    assert by_what["differ"]["chaos"]["balance"] == 10 and by_what["differ"]["reference"]["balance"] == 5
    assert sorted(by_what["differ"]["differ"]) == ["balance", "events"]
    assert by_what["missing"]["reference"]["account"] == "a4" and by_what["missing"]["chaos"] is None
    assert by_what["extra"]["chaos"]["account"] == "a3" and diff["total"] == 3
    # as multisets: a row written twice is one extra row
    rows = [{"id": 1, "v": "x"}, {"id": 2, "v": "y"}]
    multi = oracle.differences([*rows, rows[0]], rows, mode="append")
    assert multi["rows"] == [{"what": "extra", "chaos": {"id": 1, "v": "x"}, "reference": None, "differ": ["id", "v"]}]
    ok = oracle.judge(rows, [rows], mode="append")
    assert ok.ok and "oracle_diff" not in ok.info


def test_html_report_is_self_contained_with_timeline_findings_and_diff(tmp_path: Path) -> None:
    work = _workdir(tmp_path / "work")
    rep = _failing_report()
    written = report.write(rep, str(work), str(tmp_path / "out"), command="spark-eos chaos --app balances_job:build")
    assert [Path(p).name for p in written] == ["report.html", "junit.xml", "timeline.svg"]
    standalone = ET.fromstring((tmp_path / "out" / "timeline.svg").read_text())  # well-formed, an SVG of its own
    assert (
        standalone.tag == "{http://www.w3.org/2000/svg}svg"
        and "fill:#7cb342" in (tmp_path / "out" / "timeline.svg").read_text()
    )
    page = (tmp_path / "out" / "report.html").read_text()
    assert "http" not in page and "<script" not in page and "src=" not in page  # nothing fetched, nothing run
    assert "EXACTLY-ONCE VIOLATED" in page and "spark-eos chaos --app balances_job:build" in page
    svg = page[page.index("<svg") : page.index("</svg>")]
    # one row per process, the faults-from-outside row, the batches each run committed, the kills
    for label in ("run 1 (pid 11)", "run 2 (pid 12)", "drain 3 (pid 13)", "faults from outside"):
        assert label in svg, label
    assert svg.count('class="batch"') == 4  # batch 2 was never committed
    assert svg.count('class="kill"') == 2 and svg.count('class="restart"') == 2
    assert "sink.after_prepare (kill-group) batch 2" in svg and "pg-crash: postmaster started A -&gt; B" in svg
    assert 'class="outside ok"' in svg
    # the findings and the first differing rows, differing values marked
    assert "oracle.table" in page and "FAIL" in page
    table = page[page.index('<table class="diff">') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 2 * 3 and 'class="differ">10<' in table and 'class="differ">5<' in table
    assert "sink.after_prepare fired (pid 99)" in page  # the faults with their proofs


def test_junit_has_a_case_per_check_and_the_failures(tmp_path: Path) -> None:
    rep = _failing_report()
    root = ET.fromstring(report.junit_xml(rep, command="spark-eos chaos --seed 5"))
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c.name for c in rep.checks]
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["oracle.table"] and suite.get("failures") == "1"
    assert "1 keys missing" in (failed[0].find("failure").get("message") or "")  # type: ignore[union-attr]
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["seed"] == "5" and props["faults"] == "fault-point:1,pg-crash:1"
    assert props["command"] == "spark-eos chaos --seed 5"
    assert "verdict: EXACTLY-ONCE VIOLATED" in (suite.findtext("system-out") or "")


def test_a_held_run_renders_without_failures(tmp_path: Path) -> None:
    rep = checker.Report([checker.Check("records.duplicates", True, "0 extra rows")], info={"seed": 1})
    page = report.html_report(rep, str(tmp_path))  # an empty workdir: no timeline, still a page
    assert "EXACTLY-ONCE HELD" in page and "runs.jsonl is missing" in page
    root = ET.fromstring(report.junit_xml(rep))
    assert root.get("failures") == "0" and len(root.findall("testsuite/testcase")) == 1
