"""Postgres two-phase commit on the provided servers: PREPARE, disconnect, reconnect, COMMIT PREPARED, crash."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from connectors.services import _proc
from connectors.services.base import PostgresService
from connectors.services.embedded_postgres import EmbeddedPostgres

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_pg() -> Iterator[EmbeddedPostgres]:
    """An embedded cluster of this module's own, whatever provides the session's Postgres: it gets crashed."""
    with EmbeddedPostgres() as pg:
        yield pg


def _prepare(dsn: str, table: str, gid: str, value: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(f"INSERT INTO {table} VALUES (%s)", (value,))
        conn.execute(f"PREPARE TRANSACTION '{gid}'")  # utility statements take no parameters
    # The connection is closed here: the prepared transaction belongs to no session any more.


def _prepared(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()}


def test_prepare_disconnect_reconnect_commit_prepared(
    postgres_service: PostgresService, pg_conn: psycopg.Connection, new_table: Callable[..., str]
) -> None:
    table = new_table()
    pg_conn.execute(f"CREATE TABLE {table} (v int)")
    gid_commit, gid_abort = f"eos-{uuid.uuid4().hex}", f"eos-{uuid.uuid4().hex}"
    _prepare(postgres_service.dsn, table, gid_commit, 1)
    _prepare(postgres_service.dsn, table, gid_abort, 2)

    with psycopg.connect(postgres_service.dsn, autocommit=True) as again:
        assert {gid_commit, gid_abort} <= _prepared(again)
        assert again.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)  # prepared, not yet visible
        again.execute(f"COMMIT PREPARED '{gid_commit}'")
        again.execute(f"ROLLBACK PREPARED '{gid_abort}'")
        assert not {gid_commit, gid_abort} & _prepared(again)
    assert pg_conn.execute(f"SELECT v FROM {table}").fetchall() == [(1,)]
    with pytest.raises(psycopg.errors.UndefinedObject):  # a gid commits at most once
        pg_conn.execute(f"COMMIT PREPARED '{gid_commit}'")


@pytest.mark.parametrize("how", ["immediate", "sigkill"])
def test_prepared_transaction_survives_crash_and_restart(own_pg: EmbeddedPostgres, how: str) -> None:
    table = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(own_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (v int)")
    gid = f"eos-{uuid.uuid4().hex}"
    _prepare(own_pg.dsn, table, gid, 42)
    postmaster = own_pg.pid
    tree = _proc.process_tree(postmaster)
    assert postmaster in tree and len(tree) > 1  # postmaster and its auxiliary processes

    log_before = own_pg.log_path.read_text()
    own_pg.crash(how)

    # The crash happened: every server process is gone, connections are refused, and the log shows
    # an immediate shutdown (no shutdown checkpoint) or nothing at all (killed).
    assert not [p for p in tree if _proc.pid_alive(p)]
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(own_pg.dsn, connect_timeout=2)
    said = own_pg.log_path.read_text()[len(log_before) :]
    if how == "immediate":
        assert "immediate shutdown request" in said
    else:
        assert "shutting down" not in said and "shutdown request" not in said

    own_pg.start()
    log = own_pg.log_path.read_text()[len(log_before) :]
    assert "was interrupted" in log or "not properly shut down" in log  # crash recovery ran on start
    assert own_pg.pid != postmaster
    with psycopg.connect(own_pg.dsn, autocommit=True) as conn:
        assert gid in _prepared(conn)
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        conn.execute(f"COMMIT PREPARED '{gid}'")
        assert conn.execute(f"SELECT v FROM {table}").fetchall() == [(42,)]
        assert gid not in _prepared(conn)


def test_restart_keeps_data_and_settings(own_pg: EmbeddedPostgres) -> None:
    table = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(own_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} AS SELECT 7 AS v")
    port, before = own_pg.port, own_pg.pid
    own_pg.restart()
    assert own_pg.port == port and own_pg.pid != before
    with psycopg.connect(own_pg.dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT v FROM {table}").fetchall() == [(7,)]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'max_prepared_transactions', 'listen_addresses', 'max_connections')"
            ).fetchall()
        )
    assert settings == {
        "fsync": "on",
        "max_prepared_transactions": "64",
        "listen_addresses": "127.0.0.1",
        "max_connections": "200",
    }
