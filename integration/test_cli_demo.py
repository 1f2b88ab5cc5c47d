"""`spark-eos demo` end to end (small): kills really happen, the verdict is computed, exit 0 only if it held."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eos_core import faults

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def test_demo_kills_restarts_and_verifies(tmp_path) -> None:
    # make demo's services: embedded and secured (SASL_SSL with ACLs, the pipelines as an app principal granted
    # what they declare; TLS Postgres, an app role), whatever the session's brokers are
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EOS_KAFKA", "EOS_POSTGRES"))}
    env.update(EOS_SERVICES="embedded", SPARK_LOCAL_IP="127.0.0.1")
    # 3 kills, dealt round-robin: ledger a SIGKILL, transfers a fault point of the Kafka sink, balances a SIGKILL
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "connectors.cli",
            "demo",
            "--records",
            "400",
            "--kills",
            "3",
            "--seed",
            "3",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert "{\n" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout[out.stdout.index("{\n") :])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "SASL_SSL + ACLs, the pipelines as an app principal" in out.stdout, out.stdout[:2000]
    assert "(an app role, not a superuser)" in out.stdout
    assert report["ok"] is True
    assert report["events"] == 400 and report["ledger_rows"] == 400
    assert report["duplicates"] == 0 and report["missing"] == 0 and report["balances_wrong"] == 0
    # non-vacuity: every planned kill ended its pipeline by SIGKILL of its process group
    assert report["crashes_injected"] == report["kills_planned"] == 3
    assert all(k["killed"] for kills in report["kills"].values() for k in kills)
    assert [k["how"] for k in report["kills"]["transfers"]] == ["fault sink.commit.before_decision"], report["kills"]
    fired = faults.fired(str(tmp_path / "faults-transfers.jsonl"))
    assert [(e["point"], e["action"]) for e in fired] == [("sink.commit.before_decision", "kill-group")], fired
    assert report["prepared_left"] == 0
    # the third track, Kafka -> Kafka: every event once in the output topic (read_committed), no
    # transaction left open, the sink's last marker where Spark's commit log ends
    transfers = report["transfers"]
    assert transfers["records"] == 400, transfers
    assert (transfers["duplicates"], transfers["missing"], transfers["phantoms"], transfers["payload_mismatches"]) == (
        0,
        0,
        0,
        0,
    )
    assert transfers["open_transactions"] == 0 and transfers["marker_ok"] and transfers["positions_ok"], transfers
    # the malformed records mixed into the topic: each in every pipeline's dead letters, once
    assert report["poison"] == 5, report
    assert report["poison_dead_letters"] == {"ledger": 5, "balances": 5, "transfers": 5}, report
    assert report["poison_extra_copies"] == 0
