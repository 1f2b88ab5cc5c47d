"""The example job under chaos, through spark-eos's pytest plugin (fixtures ``eos_chaos`` & co.)."""

from __future__ import annotations

import json
from pathlib import Path


def test_orders_job_is_exactly_once_under_kills(eos_chaos, tmp_path: Path) -> None:
    report = eos_chaos("orders_job:build", kills=2, records=600, seed=3, payload=("key", "amount"))
    assert report.ok, report.table()
    # the kills happened: each one ended the job by SIGKILL, then a last run drained the topic
    assert report.get("chaos.kills").counts["sigkilled"] == 2, report.table()
    assert report.info["source_records"] == 600 and report.info["sink_rows"] == 600, report.info
    events = [json.loads(line) for p in tmp_path.glob("chaos-*/events.jsonl") for line in p.read_text().splitlines()]
    assert [e["exit"] for e in events] == ["killed by SIGKILL"] * 2, events
