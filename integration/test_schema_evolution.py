"""schema.evolution in both sinks (issue 18, item 2): a stream whose schema grows across a restart.

``none`` (the default) refuses DataFrame columns the table lacks before anything is written, naming
them all with the ALTER TABLE statements; ``add-columns`` adds them as nullable columns under the
DDL lock, also when two writers start at once; a type change is refused either way. Each write is a
batch job (``df.write``), as a restarted query's first batch would be.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration

FORMATS = ["postgres-upsert", "postgres-2pc", "postgres-2pc-upsert"]


def _save(df: DataFrame, fmt: str, dsn: str, table: str, batch: int, **options: str) -> None:
    w = df.write.format(fmt.removesuffix("-upsert") if fmt != "postgres-upsert" else fmt)
    w = w.option("dsn", dsn).option("table", table)
    if fmt.startswith("postgres-2pc"):
        w = w.option("sink.id", f"evo-{table}").option("batch.id", str(batch))
    if fmt.endswith("upsert"):
        w = w.option("key", "k")
    if fmt == "postgres-2pc-upsert":
        w = w.option("mode", "upsert")
    w.options(**options).mode("append").save()


def _table(conn: psycopg.Connection, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum",
            (f'"{table}"',),
        )
    ]
    return cols, conn.execute(f'SELECT * FROM "{table}" ORDER BY k').fetchall()  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
def test_new_columns_are_refused_with_the_sql_then_added_by_add_columns(
    fmt: str, spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table, dsn = new_table("evo"), postgres_service.dsn
    pg_conn.execute(f'CREATE TABLE "{table}" (k bigint PRIMARY KEY, n integer, legacy text)')  # type: ignore[arg-type]
    _save(spark.createDataFrame([(1, 10)], "k long, n int"), fmt, dsn, table, 1)
    grown = spark.createDataFrame([(2, 20, "x", 2.5)], "k long, n int, note string, score double")

    with pytest.raises(Exception) as err:  # the default: refused, with every new column and its statement
        _save(grown, fmt, dsn, table, 2)
    msg = str(err.value)
    assert "has no column for DataFrame column(s) 'note' (string), 'score' (double)" in msg, msg
    assert 'ADD COLUMN "note" text' in msg and 'ADD COLUMN "score" double precision' in msg, msg
    assert "table columns the DataFrame does not write: legacy" in msg and "schema.evolution=add-columns" in msg
    assert _table(pg_conn, table) == (["k", "n", "legacy"], [(1, 10, None)])  # nothing written, nothing altered

    _save(grown, fmt, dsn, table, 2, **{"schema.evolution": "add-columns"})
    cols, rows = _table(pg_conn, table)
    assert cols == ["k", "n", "legacy", "note", "score"]
    assert rows == [(1, 10, None, None, None), (2, 20, None, "x", 2.5)]
    nullable = pg_conn.execute(
        "SELECT bool_and(NOT attnotnull) FROM pg_attribute WHERE attrelid = %s::regclass AND attname IN ('note', 'score')",
        (f'"{table}"',),
    ).fetchone()
    assert nullable == (True,)

    # the old schema still writes into the grown table (a writer not yet redeployed)
    _save(spark.createDataFrame([(3, 30)], "k long, n int"), fmt, dsn, table, 3, **{"schema.evolution": "add-columns"})
    # a type change is never made, add-columns or not: refused with the statement to run
    with pytest.raises(Exception) as err:
        _save(
            spark.createDataFrame([(4, "x")], "k long, n string"),
            fmt,
            dsn,
            table,
            4,
            **{"schema.evolution": "add-columns"},
        )
    assert "column 'n' has type integer" in str(err.value) and "never changes a type" in str(err.value)
    assert [r[0] for r in _table(pg_conn, table)[1]] == [1, 2, 3]


def test_two_writers_adding_the_same_column_at_once_both_succeed(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    from sinks.postgres.options import parse_table_name
    from sinks.postgres.types import check_table

    table = new_table("evo2")
    pg_conn.execute(f'CREATE TABLE "{table}" (k bigint PRIMARY KEY)')  # type: ignore[arg-type]
    schema = spark.createDataFrame([(1, "a")], "k long, extra string").schema
    go, errors, planned = threading.Barrier(4), [], []

    def writer() -> None:
        try:
            with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:
                go.wait()
                planned.append(check_table(conn, parse_table_name(table), schema, ("k",), evolution="add-columns"))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(planned) == 4
    assert _table(pg_conn, table)[0] == ["k", "extra"]  # added once


def test_add_columns_waits_for_a_held_table_only_so_long_and_says_why(
    spark: SparkSession,
    postgres_service: Any,
    pg_conn: psycopg.Connection,
    new_table: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from eos_core.errors import RetriableError
    from sinks.postgres import types
    from sinks.postgres.options import parse_table_name

    table = new_table("evo3")
    pg_conn.execute(f'CREATE TABLE "{table}" (k bigint PRIMARY KEY)')  # type: ignore[arg-type]
    schema = spark.createDataFrame([(1, "a")], "k long, extra string").schema
    monkeypatch.setattr(types, "ALTER_LOCK_TIMEOUT", 1.0)
    with psycopg.connect(postgres_service.dsn) as holder:  # a writer's open transaction on the table
        holder.execute(f'INSERT INTO "{table}" VALUES (1)')  # type: ignore[arg-type]
        with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:
            with pytest.raises(RetriableError, match=r"could not add 'extra' \(string\).*held the table for 1s"):
                types.check_table(conn, parse_table_name(table), schema, ("k",), evolution="add-columns")
        holder.rollback()
    assert _table(pg_conn, table) == (["k"], [])  # nothing altered
