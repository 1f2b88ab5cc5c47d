"""The windowed job under chaos, judged by the reference-run oracle (fixture ``eos_chaos``)."""

from __future__ import annotations


def test_windowed_upserts_match_the_fault_free_runs_under_a_kill_after_the_write(eos_chaos) -> None:
    # seed 19: the one kill is the fault point after the foreachBatch upsert of a batch, before Spark
    # commits it: the batch is replayed over rows it wrote
    report = eos_chaos(
        "windows_job:build",
        generator="windows_job:records",
        records=300,
        kills=1,
        seed=19,
        max_offsets=60,
        sink_kind="foreachbatch",
        oracle="upsert:window_start,sensor",
        tolerance=1e-9,
    )
    assert report.ok, report.table()
    assert report.get("chaos.kills").counts == {"planned": 1, "sigkilled": 1, "fault_point_kills": 1}, report.table()
    assert report.get("oracle.reference_deterministic").ok and report.get("oracle.table").ok, report.table()
    assert report.info["reference_rows"] == report.info["sink_rows"] > 8, report.info  # 8 sensors, several windows
