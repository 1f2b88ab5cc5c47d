"""Every wait of the sinks on the network has a bound, and the error names what waited and the option.

- the sink's advisory lock held by a session that never lets go (a stopped driver): the task fails
  after ``lock.timeout``, naming the holder's pid and application and the option;
- the same lock asked for on a session without a ``lock_timeout`` of its own (operator commands):
  bounded by ``SINK_LOCK_TIMEOUT``;
- a row lock held by another session under ``postgres-upsert``: bounded by ``lock.timeout``;
- every sink connection carries TCP keepalives and ``tcp_user_timeout`` (read back from the socket),
  the dsn's own values win over the defaults, the user's server ``options`` are kept;
- a network that goes silent under a running statement (a private network namespace whose
  loopback is taken down, the server reached through the TCP proxy of integration/harness): the
  client gives up after the keepalives, not after the kernel's two hours.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eos_core.errors import EosError, RetriableError
from integration.test_twophase_protocol import SCHEMA, _batch, plan, sink
from integration.test_twophase_support import twophase_pg
from sinks.postgres.connection import connect
from sinks.postgres.options import ConnectionOptions
from sinks.postgres.twophase import TwoPhaseStreamWriter
from sinks.postgres.twophase import decisions as twophase_decisions
from sinks.postgres.twophase.decisions import sink_lock, sink_lock_key

__all__ = ["sink", "twophase_pg"]

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BOUND = 20.0  # seconds a bounded wait may take here at most (the bounds under test are 1-3 s)


def _bounded(fn: Callable[[], Any], release: Callable[[], None]) -> BaseException:
    """Run ``fn`` in a thread; it must fail within BOUND seconds. If it still waits, ``release`` the
    holder (so the thread ends) and fail the test: the wait was unbounded."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(BOUND)
    if t.is_alive():
        release()
        t.join(30)
        pytest.fail(f"the wait was not bounded: still waiting after {BOUND:g}s (released by the test)")
    assert "error" in outcome, f"expected the wait to fail, it returned {outcome.get('value')!r}"
    assert time.monotonic() - started < BOUND
    return outcome["error"]


@pytest.fixture
def holder(twophase_pg: Any) -> Iterator[psycopg.Connection]:
    conn = psycopg.connect(twophase_pg.dsn, autocommit=True, application_name="a frozen driver")
    try:
        yield conn
    finally:
        conn.close()


def test_a_task_behind_a_held_sink_lock_fails_after_lock_timeout_naming_the_holder(
    sink: dict[str, Any], holder: psycopg.Connection
) -> None:
    opts = dict(sink["opts"], **{"lock.timeout": "1s"})
    writer = TwoPhaseStreamWriter(opts, SCHEMA)
    holder.execute("SELECT pg_advisory_lock(%s)", (sink_lock_key(sink["sink_id"]),))
    pid = holder.info.backend_pid
    sink["state"]["ctx"] = (0, 0, 0, 0, "q1", "run1")
    plan(sink["checkpoint"], 0)
    error = _bounded(
        lambda: writer.write(iter([_batch(range(3))])),
        lambda: holder.execute("SELECT pg_advisory_unlock_all()"),
    )
    assert isinstance(error, RetriableError), error
    text = str(error)
    assert f"pid {pid}" in text and "a frozen driver" in text, text
    assert "'lock.timeout'" in text and repr(sink["sink_id"]) in text, text
    assert error.fields.get("sqlstate") == "55P03"
    # nothing was written or prepared; once the holder lets go the same task goes through
    holder.execute("SELECT pg_advisory_unlock_all()")
    msg = writer.write(iter([_batch(range(3))]))
    assert msg.gid is not None and msg.rows == 3
    TwoPhaseStreamWriter(opts, SCHEMA).abort([msg], 0)  # leave nothing prepared behind (as Spark's abort)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (msg.gid,)).fetchone() == (0,)


def test_the_sink_lock_is_bounded_on_a_session_without_a_lock_timeout(
    twophase_pg: Any, holder: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(twophase_decisions, "SINK_LOCK_TIMEOUT", 1.0)
    holder.execute("SELECT pg_advisory_lock(%s)", (sink_lock_key("bounded-sink"),))
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:  # lock_timeout 0: as a hand-made session
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)

        def take() -> None:
            with sink_lock(conn, "bounded-sink"):
                pass

        error = _bounded(take, lambda: holder.execute("SELECT pg_advisory_unlock_all()"))
        assert isinstance(error, RetriableError) and "1000ms" in str(error), error
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)  # the session's own setting is untouched
        holder.execute("SELECT pg_advisory_unlock_all()")
        with sink_lock(conn, "bounded-sink"):  # free again: taken at once
            assert conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            ).fetchone() == (1,)


def test_an_upsert_behind_a_held_row_lock_fails_after_lock_timeout(
    twophase_pg: Any, holder: psycopg.Connection
) -> None:
    from sinks.postgres.merge import KeyTracker
    from sinks.postgres.options import UpsertOptions
    from sinks.postgres.staging import UpsertPlanner, prepared_rows
    from sinks.postgres.upsert import write_transaction

    table = f"bw_{os.urandom(5).hex()}"
    holder.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text)")  # type: ignore[arg-type]
    holder.execute(f"INSERT INTO {table} VALUES (1, 'held')")  # type: ignore[arg-type]
    opts = UpsertOptions.from_options(
        {"dsn": twophase_pg.dsn, "table": table, "key": "id", "lock.timeout": "1s", "retry.attempts": "1"}
    )
    merge = UpsertPlanner(opts, SCHEMA).plan()
    holder.execute("BEGIN")
    holder.execute(f"SELECT * FROM {table} WHERE id = 1 FOR UPDATE")  # type: ignore[arg-type]
    rows = list(prepared_rows(iter([_batch(range(3))]), merge, opts, KeyTracker(merge.key)))
    error = _bounded(lambda: write_transaction(opts, merge, rows), lambda: holder.execute("ROLLBACK"))
    assert isinstance(error, (psycopg.errors.LockNotAvailable, EosError)), error
    holder.execute("ROLLBACK")
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT name FROM {table} ORDER BY id").fetchall() == [("held",)]  # type: ignore[arg-type]


def test_the_retried_lock_wait_names_the_option() -> None:
    from sinks.postgres.connection import classify

    class Diag:
        message_primary = "canceling statement due to lock timeout"
        message_detail = message_hint = None

    class Timeout(psycopg.errors.LockNotAvailable):
        sqlstate = "55P03"
        diag = Diag()

    err = classify(Timeout(), "postgres-upsert into t")
    assert isinstance(err, RetriableError) and "'lock.timeout'" in str(err) and "pg_locks" in str(err)
    lost = classify(psycopg.OperationalError("server closed the connection unexpectedly"), "publish batch 3")
    assert "publish batch 3" in str(lost) and "tcp_user_timeout" in str(lost) and "keepalives_idle" in str(lost)


def _sockopts(conn: psycopg.Connection) -> dict[str, int]:
    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        return {
            "keepalive": s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }
    finally:
        s.close()


def test_sink_connections_carry_keepalives_tcp_user_timeout_and_lock_timeout(twophase_pg: Any) -> None:
    conn = connect(ConnectionOptions(dsn=twophase_pg.dsn), autocommit=True)
    try:
        assert _sockopts(conn) == {"keepalive": 1, "idle": 30, "interval": 10, "count": 3, "user_timeout": 60000}
        assert conn.execute("SHOW lock_timeout").fetchone() == ("1min",)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)  # the documented choice
    finally:
        conn.close()
    # the dsn's own keepalive settings and server options stay; options given explicitly win over both
    dsn = psycopg.conninfo.make_conninfo(
        twophase_pg.dsn, keepalives_idle="7", tcp_user_timeout="4000", options="-c work_mem=8MB"
    )
    conn = connect(ConnectionOptions(dsn=dsn, keepalives_count=5, lock_timeout=2.5), autocommit=True)
    try:
        assert _sockopts(conn) == {"keepalive": 1, "idle": 7, "interval": 10, "count": 5, "user_timeout": 4000}
        assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
        assert conn.execute("SHOW lock_timeout").fetchone() == ("2500ms",)
    finally:
        conn.close()


# ---- a network that goes silent: a private network namespace, the server behind the TCP proxy -------

_CLIENT = textwrap.dedent(
    """
    import json, socket, subprocess, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from connectors.toolkit.chaos.proxy import TcpProxy
    from sinks.postgres.connection import classify, connect
    from sinks.postgres.options import ConnectionOptions

    bridge, dbname, user = sys.argv[2], sys.argv[3], sys.argv[4]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    # inside this namespace: 127.0.0.1:<port> -> a unix socket the test process bridges to the server
    relay = socket.socket(); relay.bind(("127.0.0.1", 0)); relay.listen(4)

    def pump(a, b):
        try:
            while (data := a.recv(65536)):
                b.sendall(data)
        except OSError:
            pass

    def serve():
        while True:
            c, _ = relay.accept()
            u = socket.socket(socket.AF_UNIX); u.connect(bridge)
            threading.Thread(target=pump, args=(c, u), daemon=True).start()
            threading.Thread(target=pump, args=(u, c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    proxy = TcpProxy("127.0.0.1", relay.getsockname()[1]).start()
    opts = ConnectionOptions(host="127.0.0.1", port=proxy.port, dbname=dbname, user=user,
                             keepalives_idle=1, keepalives_interval=1, keepalives_count=2, tcp_user_timeout=2)
    conn = connect(opts, autocommit=True)
    assert conn.execute("SELECT 1").fetchone() == (1,)

    def silence():
        time.sleep(1.0)
        subprocess.run(["ip", "link", "set", "lo", "down"], check=True)  # nothing answers any more

    threading.Thread(target=silence, daemon=True).start()
    started = time.monotonic()
    try:
        conn.execute("SELECT pg_sleep(120)")
        out = {"outcome": "returned"}
    except Exception as exc:
        out = {"outcome": "failed", "error": str(classify(exc, "a publish")), "type": type(exc).__name__}
    out["seconds"] = time.monotonic() - started
    print(json.dumps(out), flush=True)
    """
)


def _bridge(path: str, host: str, port: int) -> socket.socket:
    """A unix socket at ``path`` forwarding each connection to the server's TCP address."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(4)

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            u = socket.create_connection((host, port))
            threading.Thread(target=pump, args=(c, u), daemon=True).start()
            threading.Thread(target=pump, args=(u, c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_silent_network_under_a_statement_is_given_up_after_the_keepalives(twophase_pg: Any) -> None:
    assert shutil.which("unshare") and shutil.which("ip"), "this test needs unshare and ip (util-linux, iproute2)"
    assert os.geteuid() == 0, "this test needs root for a private network namespace (CI runs as root)"
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(twophase_pg.dsn)
    work = tempfile.mkdtemp(prefix="eos-netns-")
    listener = _bridge(os.path.join(work, "pg"), str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    try:
        script = os.path.join(work, "client.py")
        Path(script).write_text(_CLIENT)
        done = subprocess.run(
            [
                "unshare",
                "--net",
                sys.executable,
                script,
                str(ROOT),
                os.path.join(work, "pg"),
                str(info.get("dbname") or "postgres"),
                str(info.get("user") or "postgres"),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "PGPASSWORD": str(info.get("password") or "")},
        )
    finally:
        listener.close()
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["outcome"] == "failed", out
    # idle 1 s + 2 probes 1 s apart after the silence began (1 s in); the kernel default would be hours
    assert out["seconds"] < 15, out
    assert "a publish" in out["error"] and "keepalives_idle" in out["error"], out
    # the statement itself was not what ended: pg_sleep(120) would still be running
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
