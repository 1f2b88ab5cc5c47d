"""postgres-upsert's direct COPY of new keys (issue 29): one write per row when the task's keys are
new, and the staged merge, unchanged, whenever they are not (a key present, a key twice in the task,
a refused value), in the same transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from connectors.services.base import PostgresService
from sinks.postgres import upsert as upsert_mod
from sinks.postgres.merge import KeyTracker
from sinks.postgres.options import UpsertOptions
from sinks.postgres.staging import Replayable, UpsertPlanner, prepared_rows

SCHEMA = StructType(
    [StructField("id", LongType(), False), StructField("name", StringType(), True), StructField("ver", DoubleType())]
)


def _batch(ids: list[int], ver: float, name: str = "n") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"{name}{i}" for i in ids]),
            "ver": pa.array([ver] * len(ids), pa.float64()),
        }
    )


@pytest.fixture
def staged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The staging tables the writes created (none when the rows went straight into the table)."""
    made: list[str] = []
    real = upsert_mod.create_staging

    def spy(*args: Any, **kwargs: Any) -> str:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(upsert_mod, "create_staging", spy)
    yield made


def _write(dsn: str, table: str, batches: list[pa.RecordBatch], **options: str) -> Any:
    opts = UpsertOptions.from_options({"dsn": dsn, "table": table, "key": "id", "version": "ver", **options})
    plan = UpsertPlanner(opts, SCHEMA).plan()
    keys = KeyTracker(plan.key)
    prepared = list(prepared_rows(iter(batches), plan, opts, keys))
    return upsert_mod.write_transaction(opts, plan, Replayable(iter(prepared)), keys=keys, probe=prepared[0])


def _rows(conn: psycopg.Connection, table: str) -> list[tuple[Any, ...]]:
    return conn.execute(f"SELECT id, name, ver FROM {table} ORDER BY id").fetchall()  # type: ignore[arg-type]


def test_new_keys_go_straight_into_the_table(
    postgres_service: PostgresService, pg_conn: psycopg.Connection, new_table: Callable[..., str], staged: list[str]
) -> None:
    table = new_table("ud")
    pg_conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, ver double precision)")  # type: ignore[arg-type]
    counts = _write(postgres_service.dsn, table, [_batch([1, 2], 1.0), _batch([3], 1.0)])
    assert staged == []  # no staging table: one write per row
    assert (counts.staged, counts.upserted) == (3, 3)
    assert _rows(pg_conn, table) == [(1, "n1", 1.0), (2, "n2", 1.0), (3, "n3", 1.0)]


@pytest.mark.parametrize(
    "case",
    ["a later batch meets a stored key", "a key twice in the task", "the first keys are stored"],
)
def test_keys_not_new_take_the_merge_with_its_guard(
    postgres_service: PostgresService,
    pg_conn: psycopg.Connection,
    new_table: Callable[..., str],
    staged: list[str],
    case: str,
) -> None:
    table = new_table("ud")
    pg_conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, ver double precision)")  # type: ignore[arg-type]
    pg_conn.execute(f"INSERT INTO {table} VALUES (9, 'stored', 5.0), (8, 'old', 1.0)")  # type: ignore[arg-type]
    if case == "a later batch meets a stored key":
        batches = [_batch([1, 2], 2.0), _batch([8, 9], 2.0)]  # 8 is older (taken), 9 newer (kept)
        want = [(1, "n1", 2.0), (2, "n2", 2.0), (8, "n8", 2.0), (9, "stored", 5.0)]
    elif case == "a key twice in the task":
        batches = [_batch([1, 2], 2.0, "a"), _batch([2], 3.0, "b"), _batch([1], 1.0, "c")]
        want = [(1, "a1", 2.0), (2, "b2", 3.0), (8, "old", 1.0), (9, "stored", 5.0)]
    else:
        batches = [_batch([9, 1], 2.0)]
        want = [(1, "n1", 2.0), (8, "old", 1.0), (9, "stored", 5.0)]
    _write(postgres_service.dsn, table, batches)
    assert len(staged) == 1  # the merge ran, from staging
    assert _rows(pg_conn, table) == want


def test_a_refused_value_is_diverted_as_before(
    postgres_service: PostgresService, pg_conn: psycopg.Connection, new_table: Callable[..., str], staged: list[str]
) -> None:
    table, letters = new_table("ud"), new_table("dl")
    pg_conn.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text CHECK (name <> 'n2'), ver double precision)"  # type: ignore[arg-type]
    )
    counts = _write(
        postgres_service.dsn, table, [_batch([1, 2, 3], 1.0)], **{"errors.tolerance": "all", "errors.table": letters}
    )
    assert len(staged) == 1 and counts.refused == 1
    assert _rows(pg_conn, table) == [(1, "n1", 1.0), (3, "n3", 1.0)]
    assert pg_conn.execute(f"SELECT count(*) FROM {letters}").fetchone() == (1,)  # type: ignore[arg-type]


def test_a_table_with_a_rule_is_never_copied_around_it(
    postgres_service: PostgresService, pg_conn: psycopg.Connection, new_table: Callable[..., str], staged: list[str]
) -> None:
    """COPY skips rules, and the merge's ON CONFLICT refuses a table with rules: the write still fails
    as it did, writing nothing, instead of COPYing new keys past the rule."""
    table = new_table("ud")
    pg_conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, ver double precision)")  # type: ignore[arg-type]
    pg_conn.execute(f"CREATE TABLE {table}_log (id bigint)")  # type: ignore[arg-type]
    pg_conn.execute(f"CREATE RULE r AS ON INSERT TO {table} DO ALSO INSERT INTO {table}_log VALUES (NEW.id)")  # type: ignore[arg-type]
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="rules"):
        _write(postgres_service.dsn, table, [_batch([1, 2], 1.0)])
    assert len(staged) == 1
    assert _rows(pg_conn, table) == []
    assert pg_conn.execute(f"SELECT count(*) FROM {table}_log").fetchone() == (0,)  # type: ignore[arg-type]
