"""``python -m connectors.services up|status|env|down``: services outlive the command, then stop for good."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from connectors.services import _proc
from eos_core.kafka_config import client_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("EOS_", "PG"))}


def _argv(state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "connectors.services", *args, "--state-dir", str(state)]


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(state, *args), capture_output=True, text=True, timeout=180, cwd=ROOT, env=_env())


def test_up_status_env_down(tmp_path: Path) -> None:
    state_dir = tmp_path / "eos"
    started = _cli(state_dir, "up")
    try:
        assert started.returncode == 0, started.stderr
        state = json.loads((state_dir / "services.json").read_text())
        assert oct((state_dir / "services.json").stat().st_mode & 0o777) == "0o600"  # it holds the password
        kafka, pg = state["kafka"], state["postgres"]
        password = psycopg.conninfo.conninfo_to_dict(pg["dsn"])["password"]
        assert kafka["bootstrap"] in started.stdout
        assert f"postgresql://eos_admin:***@127.0.0.1:{pg['port']}/postgres" in started.stdout
        assert password not in started.stdout + started.stderr

        # The command has exited; its services run on, detached, and answer.
        pids = _proc.process_tree(kafka["pid"]) + _proc.process_tree(pg["pid"])
        assert all(_proc.pid_alive(p) for p in (kafka["pid"], pg["pid"]))
        # secured by default: SASL_SSL for the admin's settings; a client without them is refused at once
        assert kafka["security"] == "sasl_ssl" and "SASL_SSL + ACLs" in started.stdout
        admin = {"bootstrap.servers": kafka["bootstrap"], **client_settings(kafka["client_config"])}
        assert AdminClient(admin).list_topics(timeout=10).brokers
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": kafka["bootstrap"]}).list_topics(timeout=3)
        with psycopg.connect(pg["dsn"], connect_timeout=10) as conn:
            assert conn.execute("SHOW max_prepared_transactions").fetchone() == ("64",)

        status = _cli(state_dir, "status")
        assert status.returncode == 0 and status.stdout.count(" up ") == 2, status.stdout
        again = _cli(state_dir, "up")  # idempotent: nothing new starts
        assert again.returncode == 0 and "already up" in again.stdout
        assert json.loads((state_dir / "services.json").read_text())["kafka"]["pid"] == kafka["pid"]
        env = _cli(state_dir, "env")
        assert f"export EOS_KAFKA_BOOTSTRAP={kafka['bootstrap']}" in env.stdout
        assert f"export EOS_KAFKA_CONFIG={kafka['client_config']}" in env.stdout
        # the DSN verifies the server and holds no password: libpq reads it from the 0600 passfile
        exported = dict(line[len("export ") :].split("=", 1) for line in env.stdout.splitlines())
        dsn, passfile = shlex.split(exported["EOS_POSTGRES_DSN"])[0], shlex.split(exported["PGPASSFILE"])[0]
        assert password not in env.stdout and "sslmode=verify-full" in dsn, env.stdout
        assert oct(Path(passfile).stat().st_mode & 0o777) == "0o600"
        shell = f'eval "$({shlex.join(_argv(state_dir, "env"))})" && {shlex.quote(sys.executable)} -c ' + shlex.quote(
            "import os, psycopg; from confluent_kafka.admin import AdminClient; "
            "from eos_core.kafka_config import client_settings; "
            "print(psycopg.connect(os.environ['EOS_POSTGRES_DSN']).execute('SELECT current_user').fetchone()[0]); "
            "print(len(AdminClient({'bootstrap.servers': os.environ['EOS_KAFKA_BOOTSTRAP'], **client_settings()})"
            ".list_topics(timeout=10).brokers))"
        )
        used = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60, cwd=ROOT, env=_env())
        assert used.returncode == 0 and used.stdout.split() == ["eos_admin", "1"], used.stderr[-2000:]
    finally:
        stopped = _cli(state_dir, "down")
    assert stopped.returncode == 0 and stopped.stdout.count("stopped") == 2, stopped.stdout
    assert _proc.wait_until(lambda: not [p for p in pids if _proc.pid_alive(p)], 15)
    assert not Path(pg["base"]).exists() and not Path(passfile).exists()
    after = _cli(state_dir, "status")
    assert after.returncode == 3 and "no services recorded" in after.stdout


def test_status_reports_a_dead_service(tmp_path: Path) -> None:
    state_dir = tmp_path / "eos"
    assert _cli(state_dir, "up", "--no-postgres").returncode == 0
    pid = json.loads((state_dir / "services.json").read_text())["kafka"]["pid"]
    try:
        _proc.stop_group(None, pid, grace=5.0)  # killed behind the CLI's back
        status = _cli(state_dir, "status")
        assert status.returncode == 3 and "kafka     DOWN" in status.stdout
    finally:
        down = _cli(state_dir, "down")
    assert "was not running" in down.stdout


def test_up_on_a_taken_port_fails_clearly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        failed = _cli(tmp_path / "eos", "up", "--no-postgres", "--kafka-port", str(port))
    assert failed.returncode == 2
    assert f"127.0.0.1:{port}: the port is in use" in failed.stderr
    assert not (tmp_path / "eos" / "services.json").exists()
