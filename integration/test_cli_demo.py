"""`spark-eos demo` end to end (small): kills really happen, the verdict is computed, exit 0 only if it held."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def test_demo_kills_restarts_and_verifies(kafka_service, postgres_service, tmp_path) -> None:
    env = dict(os.environ, EOS_KAFKA_BOOTSTRAP=kafka_service.bootstrap, EOS_POSTGRES_DSN=postgres_service.dsn,
               SPARK_LOCAL_IP="127.0.0.1")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "demo", "--records", "400", "--kills", "2", "--seed", "3",
         "--workdir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=1500, env=env,
    )  # fmt: skip
    report = json.loads(out.stdout[out.stdout.index("{\n") :])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert report["ok"] is True
    assert report["events"] == 400 and report["ledger_rows"] == 400
    assert report["duplicates"] == 0 and report["missing"] == 0 and report["balances_wrong"] == 0
    # non-vacuity: both planned kills ended a pipeline by SIGKILL of its process group
    assert report["crashes_injected"] == report["kills_planned"] == 2
    assert all(k["killed"] for kills in report["kills"].values() for k in kills)
    assert report["prepared_left"] == 0
    # the malformed records mixed into the topic: each in both pipelines' dead-letter tables, once
    assert report["poison"] == 5 and report["poison_dead_letters"] == {"ledger": 5, "balances": 5}, report
    assert report["poison_extra_copies"] == 0
