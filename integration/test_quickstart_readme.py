"""The README's Quick start, run exactly as written (issue 32 item 1).

The shell lines are parsed from the README's ``quickstart`` block, so the page and the test cannot
drift: ``. .venv/bin/activate``, ``spark-eos services up``, ``eval "$(spark-eos services env)"``,
``python examples/quickstart.py --produce 1000``, ``spark-eos verify ...``, then (after this test
read the table) ``spark-eos services down``. They run in bash in a directory laid out like the clone
(``.venv`` is the interpreter running this test, ``examples`` the repo's), with a private services
state dir and TMPDIR, and without the test session's Kafka, Postgres or ``PYSPARK_PYTHON``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from eos_core.kafka_config import client_settings

REPO = Path(__file__).resolve().parents[1]
RECORDS = 1000


def readme_quickstart() -> list[str]:
    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- quickstart:[^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert m, "README.md lost its <!-- quickstart --> bash block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def test_readme_names_the_commands_a_new_user_needs() -> None:
    lines = readme_quickstart()
    assert lines[0].startswith(". .venv/bin/activate")
    assert any(line.startswith('eval "$(spark-eos services env)"') for line in lines)
    assert any(line.startswith("python examples/quickstart.py") for line in lines)
    assert lines[-1].startswith("spark-eos services down")


def bash(lines: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    import psycopg
    from confluent_kafka import Consumer, TopicPartition

    lines = readme_quickstart()
    cut = next(i for i, line in enumerate(lines) if line.startswith("spark-eos services down"))
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(sys.prefix)
    (clone / "examples").symlink_to(REPO / "examples")
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EOS_", "PYSPARK_", "VIRTUAL_ENV"))}
    # TMPDIR (the embedded Postgres' data dir, the checkpoint) outside pytest's root-only tmp: as root
    # the embedded Postgres runs as the user postgres, which must reach its directory
    tmp = Path(tempfile.mkdtemp(prefix="eos-quickstart-"))
    tmp.chmod(0o755)
    env.update(EOS_STATE_DIR=str(state), TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    try:
        run = bash(lines[:cut], clone, env, timeout=900)
        assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-4000:]}\n{run.stderr[-6000:]}"
        assert "verdict: EXACTLY-ONCE HELD" in run.stdout, run.stdout
        assert f"produced payments 0..{RECORDS - 1} to topic payments" in run.stdout, run.stdout

        services = json.loads((state / "services.json").read_text())
        with psycopg.connect(services["postgres"]["dsn"], autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id, account, amount, src_partition, src_offset FROM payments ORDER BY id"
            ).fetchall()
            prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
        # every payment exactly once, as produced
        assert [r[0] for r in rows] == list(range(RECORDS))
        assert all(r[1] == f"acct-{r[0] % 10}" and r[2] == (r[0] * 37) % 1000 for r in rows), rows[:5]
        # ... from every position of the topic once: the broker showed each partition up to its end
        kafka = services["kafka"]  # secured by default: the admin's settings the services recorded
        assert kafka["security"] == "sasl_ssl"
        settings = client_settings(kafka["client_config"])
        consumer = Consumer({"bootstrap.servers": kafka["bootstrap"], **settings, "group.id": "quickstart-test"})
        try:
            ends = {p: consumer.get_watermark_offsets(TopicPartition("payments", p), timeout=15)[1] for p in (0, 1)}
        finally:
            consumer.close()
        assert sum(ends.values()) == RECORDS
        assert sorted((r[3], r[4]) for r in rows) == [(p, o) for p in (0, 1) for o in range(ends[p])]
        assert prepared == (0,)
    finally:
        down = bash([lines[0], *lines[cut:]], clone, env, timeout=120)  # the same shell: venv still active
        if down.returncode == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout and not (state / "services.json").exists()
