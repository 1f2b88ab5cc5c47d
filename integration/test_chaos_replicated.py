"""Issue 46: the chaos toolkit's replicated-Kafka fault kinds through the command users run (``spark-eos chaos
--faults leader-kill,rolling-restart``, from the clone) on ``examples/orders``: the run starts a three-node
cluster of its own (secured as ``spark-eos services up`` starts Kafka), kills the node leading most of the run's
partitions and later restarts every node in turn while the job runs and records keep coming; each fault is
proven in the fault log and the exact checker judges the sink. On the cluster tests' pytest worker
(``xdist_group``): never two clusters at once in CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.toolkit import chaos

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow, pytest.mark.xdist_group("kafka-cluster")]

ORDERS = Path(__file__).resolve().parent.parent / "examples" / "orders"
FAULTS = "leader-kill:1,rolling-restart:1"


def test_leader_kill_and_rolling_restart_on_the_runs_own_cluster_are_proven(tmp_path: Path) -> None:
    plans = chaos.plan_kills("2pc", 2, 1, faults=FAULTS)
    assert sorted(p.kind for p in plans) == ["leader-kill", "rolling-restart"]
    work = tmp_path / "chaos"
    env = {k: v for k, v in os.environ.items() if k not in ("EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN")}
    env.update(EOS_SERVICES="embedded", PYSPARK_PYTHON=sys.executable, EOS_KAFKA_SECURITY="sasl_ssl")
    env.pop("EOS_KAFKA_CONFIG", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "connectors.toolkit.chaos",
            "--app",
            "orders_job:build",
            "--kills",
            "2",
            "--seed",
            "1",
            "--faults",
            FAULTS,
            "--records",
            "300",
            "--max-offsets",
            "30",
            "--payload",
            "key,amount",
            "--workdir",
            str(work),
            "--json",
            "--quiet",
        ],
        cwd=ORDERS,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and checks["records.duplicates"]["ok"] and checks["records.losses"]["ok"], checks
    assert checks["chaos.faults"]["counts"] == {"planned": 2, "proven": 2, "leader-kill": 1, "rolling-restart": 1}
    assert report["info"]["own_broker"] == "sasl_ssl", report["info"]
    assert report["info"]["kafka_nodes"] == 3, report["info"]  # the job's Kafka was the run's own cluster
    logged = {
        e["action"]: e
        for e in map(json.loads, (work / "faults.jsonl").read_text().splitlines())
        if str(e.get("point", "")).startswith("chaos.")
    }
    kill = logged["leader-kill"]
    assert kill["ok"] and kill["pid_after"] != kill["pid_before"] and kill["moved"], kill
    assert all(leader != kill["node"] for leader in kill["moved"].values()), kill
    roll = logged["rolling-restart"]
    assert [r["node"] for r in roll["restarts"]] == [1, 2, 3], roll
    assert all(r["gone"] and r["pid_after"] != r["pid_before"] for r in roll["restarts"]), roll
