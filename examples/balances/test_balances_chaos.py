"""The transformWithStateInPandas job under chaos, judged by the reference-run oracle (``eos_chaos``)."""

from __future__ import annotations


def test_balances_match_the_fault_free_run_under_kills_and_executor_loss(eos_chaos) -> None:
    report = eos_chaos(
        "balances_job:build",
        generator="balances_job:records",
        records=200,
        kills=2,
        seed=10,
        max_offsets=30,
        sink_kind="foreachbatch",
        oracle="upsert:account",
        reference_runs=1,
        faults="kill:1,executor-loss:1",
    )
    assert report.ok, report.table()
    # seed 10: an executor lost with a task held (local-cluster), then a SIGKILL of the run
    assert report.get("chaos.kills").counts["sigkilled"] == 1, report.table()
    assert report.get("chaos.faults").counts == {"planned": 1, "proven": 1, "executor-loss": 1}, report.table()
    assert report.get("oracle.table").ok, report.table()
    assert report.info["reference_rows"] == report.info["sink_rows"] == 12, report.info  # every account
