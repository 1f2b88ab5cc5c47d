"""A short chaos run in CI, through the command users run: random kills while a producer writes, then
the checker's verdict, as JSON and as the files the run leaves in its workdir."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.toolkit import chaos

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def test_short_chaos_run_from_the_command_line_holds_exactly_once(kafka_service, postgres_service, tmp_path):
    work = tmp_path / "chaos"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "connectors.toolkit.chaos",
            "--pipeline",
            "2pc",
            "--kills",
            "3",
            "--seed",
            "11",
            "--records",
            "3000",
            "--max-offsets",
            "300",
            "--bootstrap",
            kafka_service.bootstrap,
            "--dsn",
            postgres_service.dsn,
            "--workdir",
            str(work),
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["ok"] is True, json.dumps(report["checks"], indent=1)
    checks = {c["name"]: c for c in report["checks"]}
    assert {"end.prepared", "end.decision_vs_commit", "chaos.kills", "chaos.final_run"} <= set(checks), sorted(checks)
    assert any(n.endswith(".losses") for n in checks) and any(n.endswith(".duplicates") for n in checks), sorted(checks)
    # non-vacuity: every planned kill really ended the pipeline by SIGKILL, on the seed's schedule
    assert checks["chaos.kills"]["counts"]["sigkilled"] == 3, checks["chaos.kills"]
    assert report["info"]["kills"] == 3
    assert report["info"]["source_records"] == 3000
    assert json.loads((work / "report.json").read_text())["ok"] is True
    events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    assert [e["exit"] for e in events] == ["killed by SIGKILL"] * 3, events
    planned = chaos.plan_kills("2pc", 3, 11)
    assert [e["point"] for e in events] == [p.point for p in planned]  # the seed fixes the schedule


def test_a_full_checkpoint_disk_ends_in_exactly_once_after_the_job_met_it(kafka_service, postgres_service, tmp_path):
    """disk-full (issue 43's new kind): the job's checkpoint on a filesystem of the run's own, filled to its
    last byte while records arrive; the job meets it (Spark cannot write offsets/n or commits/n), and once
    it is freed the next run resumes from the checkpoint; a kill after it. Exactly once, and the checkpoint
    is left on the workdir's disk, the mount gone."""
    work = tmp_path / "chaos"
    assert [p.kind for p in chaos.plan_kills("2pc", 2, 10, faults="kill:1,disk-full:1")] == ["disk-full", "kill"]
    argv = [sys.executable, "-m", "connectors.toolkit.chaos", "--pipeline", "2pc", "--kills", "2", "--seed", "10"]
    argv += ["--faults", "kill:1,disk-full:1", "--records", "2000", "--max-offsets", "200"]
    argv += ["--bootstrap", kafka_service.bootstrap, "--dsn", postgres_service.dsn, "--workdir", str(work)]
    out = subprocess.run([*argv, "--json", "--quiet"], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is True, json.dumps(report["checks"], indent=1)
    assert checks["records.losses"]["ok"] and checks["records.duplicates"]["ok"] and checks["end.prepared"]["ok"]
    assert checks["chaos.faults"]["counts"] == {"planned": 1, "proven": 1, "disk-full": 1}, checks["chaos.faults"]
    (full,) = [
        e for e in map(json.loads, (work / "faults.jsonl").read_text().splitlines()) if e["point"] == "chaos.disk-full"
    ]
    assert full["write_refused"] and full["job_met_it"] and full["free_while_full"] < 4096, full
    assert full["recovered"], full  # a batch committed after it, or the run ended and the next one resumed
    mounts = Path("/proc/mounts").read_text()
    assert str(work) not in mounts and sorted(p.name for p in (work / "checkpoint" / "commits").iterdir())
