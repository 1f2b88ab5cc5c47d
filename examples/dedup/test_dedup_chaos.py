"""The deduplication under chaos, judged by the reference-run oracle (fixture ``eos_chaos``)."""

from __future__ import annotations


def test_each_click_is_stored_once_under_kills_and_postgres_faults(eos_chaos) -> None:
    report = eos_chaos(
        "dedup_job:build",
        generator="dedup_job:records",
        records=200,
        kills=3,
        seed=40,
        max_offsets=30,
        sink_kind="foreachbatch",
        oracle="append",
        reference_runs=1,
        faults="kill:1,pg-restart:1,pg-stall:1",
    )
    assert report.ok, report.table()
    # seed 40: pg-restart and pg-stall while the first run writes, then a SIGKILL of it
    assert report.get("chaos.kills").counts["sigkilled"] == 1, report.table()
    assert report.get("chaos.faults").counts == {"planned": 2, "proven": 2, "pg-restart": 1, "pg-stall": 1}, (
        report.table()
    )
    assert report.get("oracle.table").ok, report.table()
    assert 100 < report.info["reference_rows"] == report.info["sink_rows"] < 200, report.info  # resends dropped
