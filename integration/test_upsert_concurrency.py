"""The merge core under concurrency: a delete and an upsert of one key in two open transactions."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from sinks.postgres.copy import copy_arrow, create_staging
from sinks.postgres.merge import DELETE_FLAG, ORDINAL, MergeCounts, MergePlan, ensure_tombstones, merge_staged
from sinks.postgres.options import TableName
from sinks.postgres.types import Column

pytestmark = pytest.mark.integration


def _plan(table: str) -> MergePlan:
    cols = (
        Column("k", "k", "integer", "int", False, "integer"),
        Column("v", "v", "text", "string", True, "text"),
        Column("ver", "ver", "bigint", "bigint", True, "bigint"),
    )
    return MergePlan(TableName(None, table), cols, ("k",), "ver", deletes=True)


def _stage_and_merge(
    conn: psycopg.Connection, plan: MergePlan, rows: list[tuple[int, str | None, int, bool]]
) -> MergeCounts:
    batch = pa.record_batch(
        {
            "k": pa.array([r[0] for r in rows], pa.int32()),
            "v": pa.array([r[1] for r in rows], pa.string()),
            "ver": pa.array([r[2] for r in rows], pa.int64()),
            ORDINAL: pa.array(range(len(rows)), pa.int64()),
            DELETE_FLAG: pa.array([r[3] for r in rows], pa.bool_()),
        }
    )
    with conn.cursor() as cur:
        staging = create_staging(cur, plan.target, plan.staging_columns())
        staged = copy_arrow(cur, staging, plan.staging_columns(), [batch])
        return merge_staged(cur, staging, plan, staged)


def _wait_until_blocked(observer: psycopg.Connection, pid: int) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        row = observer.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.05)
    raise AssertionError(f"backend {pid} never waited on a lock")


def _race(dsn: str, plan: MergePlan, first: list[Any], second: list[Any], observer: psycopg.Connection) -> None:
    """``first`` merges and holds its transaction open; ``second`` must wait for it, then merge."""
    a = psycopg.connect(dsn)
    b = psycopg.connect(dsn)
    errors: list[BaseException] = []
    try:
        _stage_and_merge(a, plan, first)

        def run_second() -> None:
            try:
                _stage_and_merge(b, plan, second)
                b.commit()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        thread = threading.Thread(target=run_second)
        thread.start()
        _wait_until_blocked(observer, b.info.backend_pid)  # it really overlapped with the first
        a.commit()
        thread.join(timeout=30)
        assert not thread.is_alive() and not errors, errors
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("delete_first", [True, False], ids=["delete-holds", "upsert-holds"])
def test_concurrent_delete_and_older_upsert_of_one_key(
    delete_first: bool, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("race")
    pg_conn.execute(f'CREATE TABLE "{table}" (k integer PRIMARY KEY, v text, ver bigint)')
    plan = _plan(table)
    ensure_tombstones(pg_conn, plan)
    pg_conn.execute(f"INSERT INTO \"{table}\" VALUES (2, 'keep', 1)")
    delete = [(1, None, 5, True)]
    older_upsert = [(1, "old", 3, False), (2, "newer", 2, False)]
    first, second = (delete, older_upsert) if delete_first else (older_upsert, delete)
    _race(postgres_service.dsn, plan, first, second, pg_conn)
    # Whichever committed first, the delete (version 5) wins over the upsert (version 3).
    assert pg_conn.execute(f'SELECT * FROM "{table}" ORDER BY k').fetchall() == [(2, "newer", 2)]
    assert pg_conn.execute(f'SELECT * FROM "{table}__eos_tombstones" ORDER BY k').fetchall() == [(1, 5)]


def test_concurrent_upserts_keep_the_highest_version(
    postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("race")
    pg_conn.execute(f'CREATE TABLE "{table}" (k integer PRIMARY KEY, v text, ver bigint)')
    plan = _plan(table)
    ensure_tombstones(pg_conn, plan)
    _race(postgres_service.dsn, plan, [(1, "seven", 7, False)], [(1, "three", 3, False)], pg_conn)
    assert pg_conn.execute(f'SELECT * FROM "{table}"').fetchall() == [(1, "seven", 7)]
    assert pg_conn.execute(f'SELECT count(*) FROM "{table}__eos_tombstones"').fetchone() == (0,)
