"""The stream-static join under chaos, judged by the reference-run oracle (fixture ``eos_chaos``)."""

from __future__ import annotations

from pathlib import Path


def test_enriched_orders_match_the_fault_free_run_under_kills_and_service_faults(eos_chaos, tmp_path: Path) -> None:
    report = eos_chaos(
        "enrich_job:build",
        generator="enrich_job:records",
        records=200,
        kills=3,
        seed=40,
        max_offsets=30,
        sink_kind="2pc",
        oracle="append",
        reference_runs=1,
        faults="kill:1,pg-crash:1,kafka-cut:1",
        report_dir=tmp_path / "report",
    )
    assert report.ok, report.table()
    # seed 40 draws pg-crash, kafka-cut, then a SIGKILL: each proven in the fault log
    assert report.get("chaos.faults").counts == {"planned": 2, "proven": 2, "pg-crash": 1, "kafka-cut": 1}, (
        report.table()
    )
    assert report.get("chaos.kills").counts["sigkilled"] == 1 and report.get("oracle.table").ok, report.table()
    assert report.info["reference_rows"] == report.info["sink_rows"] > 150, report.info  # ~1 in 20 orders dropped
    assert (tmp_path / "report" / "report.html").exists()
