"""The windowed job under chaos, judged by the reference-run oracle (fixture ``eos_chaos``)."""

from __future__ import annotations


def test_windowed_upserts_match_the_fault_free_runs_under_kills(eos_chaos) -> None:
    report = eos_chaos(
        "windows_job:build", generator="windows_job:records", records=300, kills=2, seed=19, max_offsets=60,
        sink_kind="foreachbatch", oracle="upsert:window_start,sensor", tolerance=1e-9,
    )  # fmt: skip
    assert report.ok, report.table()
    assert report.get("chaos.kills").counts["sigkilled"] == 2, report.table()
    assert report.get("oracle.reference_deterministic").ok and report.get("oracle.table").ok, report.table()
    assert report.info["reference_rows"] == report.info["sink_rows"] > 0, report.info
