"""Issue 30: chaos-testing a user's own job on the user's own records, judged by fault-free reference
runs (connectors.toolkit.oracle), through the pytest plugin as a user runs it.

1. ``examples/windows``: sensor readings in the user's text format, event time from the records'
   Kafka timestamps, 10-second windows in update mode through the foreachBatch upsert adapter; a kill
   lands after the batch's upsert and before Spark's commit, the batch is replayed, and the final
   table equals the reference runs' by key (float sums within a tolerance).
2. ``examples/broken``: a foreachBatch that INSERTs each batch: the same kind of kill duplicates a
   batch, the oracle (rows as multisets) catches it, and minimisation names the one kill that is enough.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from connectors.toolkit import chaos

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _in(monkeypatch: pytest.MonkeyPatch, example: str) -> None:
    monkeypatch.chdir(EXAMPLES / example)  # the job's module is imported from the current directory
    monkeypatch.syspath_prepend(str(EXAMPLES / example))


def test_windowed_upsert_job_matches_its_fault_free_runs_under_a_kill_after_the_write(
    eos_chaos: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _in(monkeypatch, "windows")
    # seed 19: the one kill is a fault after the foreachBatch upsert of a batch, before Spark commits it
    (plan,) = chaos.plan_kills("foreachbatch", 1, 19)
    assert plan.point == "sink.after_commit", plan
    report = eos_chaos(
        "windows_job:build", generator="windows_job:records", records=300, kills=1, seed=19, max_offsets=60,
        sink_kind="foreachbatch", oracle="upsert:window_start,sensor", tolerance=1e-9,
    )  # fmt: skip
    assert report.ok, report.table()
    assert report.get("chaos.kills").counts == {"planned": 1, "sigkilled": 1, "fault_point_kills": 1}, report.table()
    assert report.get("oracle.reference_deterministic").ok and report.get("oracle.table").ok, report.table()
    assert report.info["reference_rows"] == report.info["sink_rows"] > 8, report.info  # 8 sensors, several windows


def test_non_idempotent_foreach_batch_insert_is_caught_and_minimised(
    eos_chaos: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _in(monkeypatch, "broken")
    plans = chaos.plan_kills("foreachbatch", 2, 49)
    assert plans[1].point == "sink.after_commit" and plans[0].kind == "sigkill", plans
    report = eos_chaos(
        "insert_job:build", generator="insert_job:records", records=200, kills=2, seed=49, max_offsets=40,
        sink_kind="foreachbatch", oracle="append", reference_runs=1, minimise=True,
    )  # fmt: skip
    assert not report.ok, report.table()
    table = report.get("oracle.table")
    assert not table.ok and table.counts["extra"] > 0 and table.counts["missing"] == 0, report.table()
    assert "EXACTLY-ONCE VIOLATED" in report.table()
    found = report.info["minimised"]
    assert found["kills"] == [1] and found["schedule"] == ["1: fault sink.after_commit"], found
    argv = shlex.split(found["command"])
    assert argv[argv.index("--only-kills") + 1] == "1" and argv[argv.index("--seed") + 1] == "49", argv
