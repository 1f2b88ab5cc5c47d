"""Service lifecycle: env vars reuse running servers, no process outlives its owner, bad input fails clearly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from connectors import services
from connectors.services import _proc, embedded_postgres
from connectors.services.base import KafkaService, PostgresService
from connectors.services.embedded_kafka import EmbeddedKafka
from connectors.services.embedded_postgres import EmbeddedPostgres
from eos_core.errors import ServiceError

pytestmark = pytest.mark.integration


@pytest.fixture
def auto_mode(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The provider order of a user who set nothing but what the test sets."""
    for var in ("EOS_SERVICES", "EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN", "EOS_SERVICE_TIMEOUT", "EOS_KAFKA_IS_TANSU"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port some other process (here: a plain socket) listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _children() -> set[int]:
    """Our direct child processes: every service we start is one (its backends are the server's children)."""
    me = os.getpid()
    return {p for p in _proc.descendants(me) if _ppid(p) == me}


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return -1
    return int(stat[stat.rindex(")") + 2 :].split()[1])


# ---- the env-var path reuses what runs ----------------------------------------------------------
def test_env_kafka_reuses_running_broker(kafka_service: KafkaService, auto_mode: pytest.MonkeyPatch) -> None:
    auto_mode.setenv("EOS_KAFKA_BOOTSTRAP", kafka_service.bootstrap)
    before = _children()
    with services.kafka() as named:
        assert named.kind == "env"
        assert named.bootstrap == kafka_service.bootstrap
        assert named.is_tansu == kafka_service.is_tansu  # tansu recognised by its cluster id
        assert _children() == before  # nothing was started
    # stop() of a named broker leaves it running
    from confluent_kafka.admin import AdminClient

    assert (
        AdminClient({"bootstrap.servers": kafka_service.bootstrap, **kafka_service.client_config()})
        .list_topics(timeout=10)
        .brokers
    )


def test_env_postgres_reuses_running_server(postgres_service: PostgresService, auto_mode: pytest.MonkeyPatch) -> None:
    auto_mode.setenv("EOS_POSTGRES_DSN", postgres_service.dsn)
    before = _children()
    with services.postgres() as named:
        assert (named.kind, named.dsn, named.port) == ("env", postgres_service.dsn, postgres_service.port)
        assert _children() == before
        with pytest.raises(ServiceError, match="not run by spark-eos"):
            named.crash()
    with psycopg.connect(postgres_service.dsn, connect_timeout=5) as conn:  # still up after stop()
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_embedded_forced_even_when_env_names_one(kafka_service: KafkaService, auto_mode: pytest.MonkeyPatch) -> None:
    auto_mode.setenv("EOS_KAFKA_BOOTSTRAP", kafka_service.bootstrap)
    auto_mode.setenv("EOS_SERVICES", "embedded")
    with services.kafka() as own:
        assert own.kind == "embedded" and own.bootstrap != kafka_service.bootstrap


# ---- no orphans -------------------------------------------------------------------------------
def test_stop_leaves_no_process() -> None:
    kafka = EmbeddedKafka()
    pg = EmbeddedPostgres()
    conn = psycopg.connect(pg.dsn)  # a backend process too
    trees = _proc.process_tree(kafka.pid) + _proc.process_tree(pg.pid)
    assert kafka.pid in trees and pg.pid in trees and len(trees) >= 4
    base = pg.base
    kafka.stop()
    pg.stop()
    conn.close()
    assert [p for p in trees if _proc.pid_alive(p)] == []
    assert not _children() & set(trees)
    assert not base.exists()
    kafka.stop()  # idempotent
    pg.stop()


_OWNER = textwrap.dedent(
    """
    import os, sys, time
    from connectors.services.embedded_kafka import EmbeddedKafka
    from connectors.services.embedded_postgres import EmbeddedPostgres
    from connectors.services import _proc
    k = EmbeddedKafka(); p = EmbeddedPostgres()
    print(" ".join(str(x) for x in _proc.process_tree(k.pid) + _proc.process_tree(p.pid)), flush=True)
    print(p.base, k.log_path.parent, flush=True)
    mode = sys.argv[1]
    if mode in ("exit", "raise"):
        sys.stdin.readline()   # the test has looked at what we started: now end as told
    if mode == "exit":
        sys.exit(3)            # no stop(): atexit must clean up
    if mode == "raise":
        raise RuntimeError("a test failed")
    time.sleep(600)            # "sigkill"/"sigterm": the parent kills us
    """
)


@pytest.mark.parametrize("how", ["exit", "raise", "sigterm", "sigkill"])
def test_no_orphan_when_owner_ends(how: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    dirs = [Path(x) for x in proc.stdout.readline().split()]
    assert len(dirs) == 2 and all(d.is_dir() for d in dirs)
    assert len(pids) >= 3, "the owner did not start both services"
    assert all(_proc.pid_alive(p) for p in pids)
    assert proc.stdin is not None
    if how in ("exit", "raise"):  # only now may the owner end (it raced the checks above when it ended at once)
        proc.stdin.write("go\n")
        proc.stdin.flush()
    if how in ("sigterm", "sigkill"):
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    proc.communicate(timeout=60)  # reaps it and closes its pipes
    rc = proc.returncode
    expected = {"exit": 3, "raise": 1, "sigterm": -signal.SIGTERM, "sigkill": -signal.SIGKILL}[how]
    assert rc == expected  # the owner really ended the way the test says
    # SIGKILL leaves no chance to clean up: the kernel's parent-death signal ends the servers, and
    # Postgres backends follow their postmaster.
    assert _proc.wait_until(lambda: not [p for p in pids if _proc.pid_alive(p)], 30), [
        p for p in pids if _proc.pid_alive(p)
    ]
    if how == "sigkill":
        # No cleanup code ran, so the temp dirs are left for the next service start to sweep (with two
        # pytest workers, the other worker's start may sweep them before this line: same mechanism).
        _proc.sweep_stale("eos-pg-")
        _proc.sweep_stale("eos-kafka-")
    assert not any(d.exists() for d in dirs)


_FIXTURE_USER = textwrap.dedent(
    """
    import os
    from connectors.services import _proc

    def test_uses_services(kafka_service, postgres_service, pg_conn):
        assert kafka_service.kind == postgres_service.kind == "embedded"
        pids = _proc.process_tree(kafka_service.pid) + _proc.process_tree(postgres_service.pid)
        with open(os.environ["PIDS_OUT"], "w") as f:
            f.write(" ".join(map(str, pids)))
    """
)


def test_session_fixtures_leave_no_process(tmp_path: Path) -> None:
    """The shared fixtures themselves: after a pytest session that used them, none of their processes runs."""
    (tmp_path / "test_user.py").write_text(_FIXTURE_USER)
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOS_")}
    env.update(EOS_SERVICES="embedded", PIDS_OUT=str(tmp_path / "pids"), PYTHONPATH=str(root))
    plugins = [a for m in ("services", "kafka", "postgres") for a in ("-p", f"integration.fixtures.{m}")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *plugins,
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_user.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert len(pids) >= 4  # tansu, postmaster, its auxiliary processes and pg_conn's backend
    assert [p for p in pids if _proc.pid_alive(p)] == []


# ---- bad input --------------------------------------------------------------------------------
def test_missing_tansu_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(ServiceError, match=r"CALF_TANSU_BIN.*EOS_KAFKA_BOOTSTRAP"):
        EmbeddedKafka()
    monkeypatch.delenv("CALF_TANSU_BIN")
    text = tmp_path / "tansu"
    text.write_text("not a program")
    text.chmod(0o644)
    with pytest.raises(ServiceError, match="not an executable file"):
        EmbeddedKafka(binary=str(text))
    text.chmod(0o755)  # executable bit, but no valid program
    with pytest.raises(ServiceError, match="cannot run the tansu binary"):
        EmbeddedKafka(binary=str(text))


def test_missing_postgres_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EOS_PG_BIN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(embedded_postgres, "PG_BIN_GLOBS", ["/nonexistent/*/bin"])
    with pytest.raises(ServiceError, match=r"initdb.*apt-get install postgresql.*EOS_PG_BIN.*EOS_POSTGRES_DSN"):
        EmbeddedPostgres()
    monkeypatch.setenv("EOS_PG_BIN", "/usr/bin")
    with pytest.raises(ServiceError, match="EOS_PG_BIN='/usr/bin' does not hold"):
        EmbeddedPostgres()


def test_occupied_port(listening_port: int) -> None:
    with pytest.raises(ServiceError, match=f"127.0.0.1:{listening_port}: the port is in use"):
        EmbeddedKafka(port=listening_port)
    with pytest.raises(ServiceError, match=f"127.0.0.1:{listening_port}: the port is in use"):
        EmbeddedPostgres(port=listening_port)


def test_unreachable_named_services(auto_mode: pytest.MonkeyPatch) -> None:
    port = _proc.free_port()
    auto_mode.setenv("EOS_SERVICE_TIMEOUT", "1")
    auto_mode.setenv("EOS_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    auto_mode.setenv("EOS_POSTGRES_DSN", f"postgresql://eos:secret@127.0.0.1:{port}/postgres")
    before = _children()
    with pytest.raises(ServiceError, match=f"EOS_KAFKA_BOOTSTRAP='127.0.0.1:{port}': no Kafka broker answered"):
        services.kafka()
    with pytest.raises(ServiceError, match=r"EOS_POSTGRES_DSN=.*did not accept connections") as err:
        services.postgres()
    assert "secret" not in str(err.value)  # the password is redacted in the message
    assert _children() == before  # a named but dead service is an error, never silently replaced


def test_postgres_without_prepared_transactions(auto_mode: pytest.MonkeyPatch) -> None:
    with EmbeddedPostgres(max_prepared_transactions=0, max_connections=20) as no2pc:
        auto_mode.setenv("EOS_POSTGRES_DSN", no2pc.dsn)
        with pytest.raises(ServiceError, match=r"max_prepared_transactions is 0.*max_prepared_transactions = 64"):
            services.postgres()
