"""Issue 30: chaos-testing a user's own job on the user's own records, judged by fault-free reference
runs (connectors.toolkit.oracle), through the pytest plugin as a user runs it.

``examples/windows`` (10-second windows in update mode through the foreachBatch upsert adapter, judged
by key against the reference runs) runs from the wheel with the other examples:
``integration/test_toolkit_wheel.py``.

``examples/broken``: a foreachBatch that INSERTs each batch: a kill after the write and before Spark's
commit duplicates a batch, the oracle (rows as multisets) catches it, and minimisation names the one
kill that is enough.
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


def test_non_idempotent_foreach_batch_insert_is_caught_and_minimised(
    eos_chaos: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _in(monkeypatch, "broken")
    plans = chaos.plan_kills("foreachbatch", 2, 49)
    assert plans[1].point == "sink.after_commit" and plans[0].kind == "kill", plans
    report = eos_chaos(
        "insert_job:build",
        generator="insert_job:records",
        records=200,
        kills=2,
        seed=49,
        max_offsets=40,
        sink_kind="foreachbatch",
        oracle="append",
        reference_runs=1,
        minimise=True,
    )
    assert not report.ok, report.table()
    table = report.get("oracle.table")
    assert not table.ok and table.counts["extra"] > 0 and table.counts["missing"] == 0, report.table()
    assert "EXACTLY-ONCE VIOLATED" in report.table()
    found = report.info["minimised"]
    assert found["kills"] == [1] and found["schedule"] == ["1: fault-point sink.after_commit"], found
    argv = shlex.split(found["command"])
    assert argv[argv.index("--only-kills") + 1] == "1" and argv[argv.index("--seed") + 1] == "49", argv
