"""A short chaos run in CI: a few random kills while a producer writes, then the checker's verdict."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from connectors import chaos

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def test_short_chaos_run_holds_exactly_once(kafka_service, postgres_service, tmp_path):
    cfg = chaos.ChaosConfig(
        pipeline="2pc", kills=3, seed=11, records=3000, bootstrap=kafka_service.bootstrap,
        dsn=postgres_service.dsn, workdir=str(tmp_path / "chaos"), max_offsets=300, progress=False,
    )  # fmt: skip
    report = chaos.run(cfg)
    assert report.ok, report.table()
    kills = report.get("chaos.kills")
    assert kills.counts["sigkilled"] == 3  # non-vacuity: every planned kill really killed the pipeline
    assert report.info["source_records"] == 3000
    assert [e["exit"] for e in cfg.events] == ["killed by SIGKILL"] * 3
    planned = chaos.plan_kills("2pc", 3, 11)
    assert [e["point"] for e in cfg.events] == [p.point for p in planned]  # the seed fixes the schedule


def test_chaos_command_line_json(kafka_service, postgres_service, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "connectors.chaos", "--pipeline", "stateful", "--kills", "1", "--seed", "2",
         "--records", "600", "--max-offsets", "200", "--bootstrap", kafka_service.bootstrap,
         "--dsn", postgres_service.dsn, "--workdir", str(tmp_path / "w"), "--json", "--quiet"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["ok"] is True
    names = {c["name"] for c in report["checks"]}
    assert {"aggregates", "end.prepared", "chaos.kills", "chaos.final_run"} <= names
    assert report["info"]["kills"] == 1
    assert (tmp_path / "w" / "report.json").exists()
