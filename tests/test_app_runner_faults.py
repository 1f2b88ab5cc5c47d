"""The fault points the chaos runner puts around a user's foreachBatch function (--sink-kind foreachbatch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.toolkit import app_runner, chaos
from eos_core import faults


def test_foreach_batch_points_fire_before_the_users_write_and_after_it_before_spark_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    wrapped = app_runner.foreach_batch_with_fault_points(lambda df, batch_id: calls.append((df, batch_id)))
    log = tmp_path / "faults.jsonl"
    monkeypatch.setenv(faults.ENV_LOG, str(log))
    monkeypatch.setenv(faults.ENV_STATE, str(tmp_path / "state"))
    monkeypatch.setenv(faults.ENV_SPEC, "sink.after_commit:batch=4:action=raise")
    wrapped("df3", 3)  # another batch: no fault
    with pytest.raises(faults.FaultInjected):
        wrapped("df4", 4)
    assert calls == [("df3", 3), ("df4", 4)]  # the user's write ran, then the fault (a replay would repeat it)
    monkeypatch.setenv(faults.ENV_SPEC, "pipeline.batch:batch=5:action=raise")
    with pytest.raises(faults.FaultInjected):
        wrapped("df5", 5)
    assert calls[-1] == ("df4", 4)  # before the write: the user's function never ran
    assert [(e["point"], e["batch"]) for e in faults.fired(str(log))] == [
        ("sink.after_commit", 4),
        ("pipeline.batch", 5),
    ]


def test_foreachbatch_kills_carry_the_batch_they_strike() -> None:
    plans = [p for p in chaos.plan_kills("foreachbatch", 40, 2) if p.point]
    assert {p.point for p in plans} == {"source.read.mid", "pipeline.batch", "sink.after_commit"}
    after = next(p for p in plans if p.point == "sink.after_commit")
    assert after.spec(6) == f"sink.after_commit:batch={7 + after.skip}:action=kill-group:once"
    before = next(p for p in plans if p.point == "pipeline.batch")
    # a fresh checkpoint: batch 0 runs on the empty topic (the producer starts with the query), so from batch 1
    assert before.spec(None) == f"pipeline.batch:batch={1 + before.skip}:action=kill-group:once"


def test_serve_reports_where_a_query_hangs_when_it_outlives_its_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.toolkit.app_runner import serve

    class Stuck:
        id = "q"
        stopped = False

        def awaitTermination(self, timeout: float) -> bool:
            return False

        def stop(self) -> None:
            self.stopped = True

    query = Stuck()
    assert serve(lambda: query, 0.1) == 3 and query.stopped
    err = capsys.readouterr().err
    # the stacks come before the last line the chaos loop and the harness read: here no query's stream
    # execution thread (no JVM at all when this test runs alone; the suite's Spark session's otherwise)
    assert "RUNNER STACKS of the query still running after 0.1s" in err, err
    assert "(no JVM stacks" in err or "(no stream execution thread)" in err, err
    assert err.rstrip().splitlines()[-1] == "RUNNER TIMEOUT after 0.1s"
