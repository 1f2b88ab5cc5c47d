"""postgres-upsert against a real Postgres: idempotent replays, version guard, deletes, bad input."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc


_DOTTED = {
    "table_create": "table.create",
    "delete_column": "delete.column",
    "delete_tombstones": "delete.tombstones",
    "retry_attempts": "retry.attempts",
}


def _write(df: DataFrame, dsn: str, table: str, **options: Any) -> None:
    w = df.write.format("postgres-upsert").option("dsn", dsn).option("table", table)
    for k, v in options.items():
        w = w.option(_DOTTED.get(k, k), str(v).lower() if isinstance(v, bool) else str(v))
    w.mode("append").save()


def _rows(conn: psycopg.Connection, table: str, order: str = "1") -> list[tuple[Any, ...]]:
    return conn.execute(f'SELECT * FROM "{table}" ORDER BY {order}').fetchall()  # type: ignore[arg-type]


def _xmins(conn: psycopg.Connection, table: str) -> list[Any]:
    return [r[0] for r in conn.execute(f'SELECT xmin::text FROM "{table}" ORDER BY 1').fetchall()]  # type: ignore[arg-type]


def _exists(conn: psycopg.Connection, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{table}"',)).fetchone()[0]  # type: ignore[index]


ALL_TYPES = (
    "id long, name string, price decimal(12,3), at timestamp, local timestamp_ntz, day date, blob binary, "
    "tags array<string>, nums array<int>, attrs struct<a:int,b:string>, props map<string,double>, flag boolean, "
    "ratio double, small short, ver long"
)


def _typed_rows() -> list[tuple[Any, ...]]:
    big = bytes(range(256)) * 8192  # 2 MiB
    return [
        (
            1,
            "plain",
            decimal.Decimal("1.500"),
            dt.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=UTC),
            dt.datetime(2024, 1, 2, 3, 4, 5),
            dt.date(2024, 1, 2),
            b"\x00\xff",
            ["a", None],
            [1, 2],
            {"a": 1, "b": "x"},
            {"k": 1.5},
            True,
            0.25,
            7,
            1,
        ),
        (2, "ünïcödé ✓ 日本語 😀", None, None, None, None, big, [], None, None, None, None, None, None, 1),
        (
            3,
            None,
            decimal.Decimal("-99999.999"),
            dt.datetime(1970, 1, 1, tzinfo=UTC),
            None,
            dt.date(1, 1, 1),
            b"",
            None,
            [None],
            {"a": None, "b": None},
            {},
            False,
            float("inf"),
            -32768,
            1,
        ),
    ]


def test_same_batch_twice_equals_once_with_all_types(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("up")
    df = spark.createDataFrame(_typed_rows(), ALL_TYPES)
    _write(df, postgres_service.dsn, table, key="id", version="ver", table_create=True)
    once = _rows(pg_conn, table)
    xmins = _xmins(pg_conn, table)
    _write(df, postgres_service.dsn, table, key="id", version="ver")
    assert _rows(pg_conn, table) == once
    assert _xmins(pg_conn, table) == xmins  # equal versions: not even rewritten

    by_id = {r[0]: r for r in once}
    assert len(once) == 3
    r1, r2, r3 = by_id[1], by_id[2], by_id[3]
    assert r1[1:7] == (
        "plain",
        decimal.Decimal("1.500"),
        dt.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=UTC),
        dt.datetime(2024, 1, 2, 3, 4, 5),
        dt.date(2024, 1, 2),
        b"\x00\xff",
    )
    assert r1[7:12] == (["a", None], [1, 2], {"a": 1, "b": "x"}, {"k": 1.5}, True)
    assert r2[1] == "ünïcödé ✓ 日本語 😀" and r2[6] == bytes(range(256)) * 8192
    assert r2[2:6] == (None, None, None, None) and r2[8:14] == (None,) * 6
    assert r3[1] is None and r3[5] == dt.date(1, 1, 1) and r3[6] == b"" and r3[8] == [None] and r3[12] == float("inf")
    types = dict(
        pg_conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
            (f'"{table}"',),
        ).fetchall()
    )
    assert types["price"] == "numeric(12,3)" and types["at"] == "timestamp with time zone"
    assert types["local"] == "timestamp without time zone" and types["blob"] == "bytea"
    assert (
        types["tags"] == "text[]"
        and types["nums"] == "integer[]"
        and types["attrs"] == "jsonb"
        and types["props"] == "jsonb"
    )
    pk = pg_conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (f'"{table}"',),
    ).fetchall()
    assert pk == [("id",)]


def test_replay_without_version_rewrites_to_the_same_content(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("up")
    df = spark.createDataFrame([(i, f"v{i}", None) for i in range(50)], "k int, v string, n double")
    _write(df, postgres_service.dsn, table, key="k", table_create=True)
    once = _rows(pg_conn, table)
    _write(df, postgres_service.dsn, table, key="k")
    assert _rows(pg_conn, table) == once and len(once) == 50


def test_out_of_order_and_equal_versions(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("ver")
    schema = "k string, v string, ver long"
    dsn = postgres_service.dsn

    def put(rows: list[tuple[Any, ...]], **kw: Any) -> None:
        _write(spark.createDataFrame(rows, schema).coalesce(1), dsn, table, key="k", version="ver", **kw)

    put([("a", "v2", 2), ("b", "v5", 5)], table_create=True)
    put([("a", "v1", 1), ("b", "v4", 4)])  # older: ignored
    assert _rows(pg_conn, table) == [("a", "v2", 2), ("b", "v5", 5)]
    put([("a", "other-v2", 2)])  # equal: a no-op, the first row of version 2 stays
    assert _rows(pg_conn, table) == [("a", "v2", 2), ("b", "v5", 5)]
    put([("a", "v3", 3), ("c", "v1", 1)])  # newer: replaces; new key: inserted
    assert _rows(pg_conn, table) == [("a", "v3", 3), ("b", "v5", 5), ("c", "v1", 1)]


def test_many_rows_per_key_in_one_batch(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    dsn = postgres_service.dsn
    rows = [(k, f"r{i}", (i * 7) % 5) for i in range(200) for k in (i % 10,)]
    df = spark.createDataFrame(rows, "k int, v string, ver int").coalesce(1)
    versioned, ordered = new_table("many"), new_table("many")
    _write(df, dsn, versioned, key="k", version="ver", table_create=True)
    _write(df, dsn, ordered, key="k", table_create=True)
    expected_versioned, expected_ordered = {}, {}
    for i, (k, v, ver) in enumerate(rows):
        if k not in expected_versioned or ver >= expected_versioned[k][1]:  # ties: the later row wins
            expected_versioned[k] = (v, ver)
        expected_ordered[k] = (v, ver, i)
    assert _rows(pg_conn, versioned) == [(k, v, ver) for k, (v, ver) in sorted(expected_versioned.items())]
    assert _rows(pg_conn, ordered) == [(k, v, ver) for k, (v, ver, _) in sorted(expected_ordered.items())]


def test_deletes_keep_tombstones_so_older_replays_stay_deleted(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("del")
    dsn = postgres_service.dsn
    schema = "k int, v string, ver long, gone boolean"

    def put(rows: list[tuple[Any, ...]], **kw: Any) -> None:
        df = spark.createDataFrame(rows, schema).coalesce(1)
        _write(df, dsn, table, key="k", version="ver", delete_column="gone", **kw)

    put([(1, "a", 1, False), (2, "b", 1, False), (3, "c", 1, False)], table_create=True)
    assert "gone" not in [c.name for c in pg_conn.execute(f'SELECT * FROM "{table}" LIMIT 0').description or []]
    put(
        [(1, None, 2, True), (4, None, 5, True), (3, None, 1, True)]
    )  # delete 1; tombstone for unseen 4; 3: equal, no-op
    assert _rows(pg_conn, table) == [(2, "b", 1), (3, "c", 1)]
    tomb = f"{table}__eos_tombstones"
    assert _rows(pg_conn, tomb) == [(1, 2), (4, 5)]
    put([(1, "a", 1, False), (4, "late", 4, False), (2, "b", 1, False)])  # replayed/older upserts
    assert _rows(pg_conn, table) == [(2, "b", 1), (3, "c", 1)]
    put([(1, "back", 3, False), (2, None, 0, True)])  # newer upsert resurrects; older delete ignored
    assert _rows(pg_conn, table) == [(1, "back", 3), (2, "b", 1), (3, "c", 1)]
    assert _rows(pg_conn, tomb) == [(4, 5)]
    # one batch: upsert then delete of one key at the same version, the later row wins
    put([(5, "x", 1, False), (5, None, 1, True)])
    assert _rows(pg_conn, table) == [(1, "back", 3), (2, "b", 1), (3, "c", 1)]
    assert _rows(pg_conn, tomb) == [(4, 5), (5, 1)]


def test_kafka_style_tombstones_without_version(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("tomb")
    dsn = postgres_service.dsn
    schema = "k string, v string, n int"
    df = spark.createDataFrame([("a", "1", 1), ("b", "2", 2), ("c", None, 3)], schema).coalesce(1)
    _write(df, dsn, table, key="k", delete_tombstones=True, table_create=True)
    batch = spark.createDataFrame(
        [("a", None, None), ("c", None, None), ("b", "3", None), ("z", None, None)], schema
    ).coalesce(1)
    _write(batch, dsn, table, key="k", delete_tombstones=True)
    _write(batch, dsn, table, key="k", delete_tombstones=True)  # replay
    assert _rows(pg_conn, table) == [("b", "3", None)]
    assert not _exists(pg_conn, f"{table}__eos_tombstones")  # no version: no guard, no tombstones


def test_schema_qualified_table_and_renamed_columns(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    schema_name, table = new_table("s"), "Orders"
    pg_conn.execute(f'CREATE SCHEMA "{schema_name}"')
    pg_conn.execute(
        f'CREATE TABLE "{schema_name}"."{table}" (order_id uuid PRIMARY KEY, total numeric(20,4), note varchar(50), '
        "created timestamptz DEFAULT now(), qty bigint, tags jsonb)"
    )
    oid = str(uuid.uuid4())
    df = spark.createDataFrame(
        [(oid, decimal.Decimal("12.50"), "hi", 3, ["x", "y"])],
        "orderId string, total decimal(10,2), note string, qty int, tags array<string>",
    )
    _write(
        df, postgres_service.dsn, f'{schema_name}."{table}"', key="orderId", columns=json.dumps({"orderId": "order_id"})
    )
    row = pg_conn.execute(f'SELECT order_id::text, total, note, qty, tags FROM "{schema_name}"."{table}"').fetchone()
    assert row == (oid, decimal.Decimal("12.5000"), "hi", 3, ["x", "y"])


def test_connection_killed_mid_task_converges(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("kill")
    dsn = postgres_service.dsn
    rows = [(i, f"v{i}") for i in range(300)]
    df = spark.createDataFrame(rows, "k int, v string").repartition(2)
    pg_conn.execute(f'CREATE TABLE "{table}" (k int PRIMARY KEY, v text)')
    pg_conn.execute(f'CREATE TABLE "{table}_log" (k int, v text)')  # no key: would show any duplicate write
    pg_conn.execute(
        f'CREATE FUNCTION "{table}_f"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
        f'INSERT INTO "{table}_log" VALUES (NEW.k, NEW.v); RETURN NEW; END $$'
    )
    pg_conn.execute(f'CREATE TRIGGER t AFTER INSERT OR UPDATE ON "{table}" FOR EACH ROW EXECUTE FUNCTION "{table}_f"()')
    # Each task stalls once with its transaction open (rows merged, not committed); a unique
    # seconds value gives this spec its own once-state across test runs.
    spec = f"sink.after_write:action=sleep:seconds=6.{uuid.uuid4().int % 10**6:06d}:times=2"
    killed: list[int] = []

    def killer() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and len(killed) < 2:
            with psycopg.connect(dsn, autocommit=True) as c:
                for (pid,) in c.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'spark-eos postgres-upsert' "
                    "AND state = 'idle in transaction'"
                ).fetchall():
                    if pid not in killed and c.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:  # type: ignore[index]
                        killed.append(pid)
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    _write(df, dsn, table, key="k", faults=spec)
    thread.join(timeout=70)
    assert len(killed) >= 1, "no writer connection was caught mid-transaction"
    assert _rows(pg_conn, table) == rows
    # the killed transactions left nothing behind: each key was written exactly once
    assert pg_conn.execute(f'SELECT count(*), count(DISTINCT k) FROM "{table}_log"').fetchone() == (300, 300)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing_key", "option 'key' names column 'nope', which the DataFrame does not have"),
        ("no_unique", "has no primary key or unique constraint on exactly (k)"),
        ("type_mismatch", "column 'n' has type integer, but DataFrame column 'n' is bigint"),
        ("unknown_option", "unknown option 'verison'; did you mean 'version'?"),
        ("no_table", "does not exist; create it (with a primary key on k) or set option table.create=true"),
        ("missing_column", "has no column for DataFrame column(s) 'extra' (string); add them (ALTER TABLE"),
        ("bad_delete_column", "it must be boolean"),
    ],
)
def test_bad_input_fails_before_any_row(
    case: str, needle: str, spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("bad")
    if case != "no_table":
        constraint = "" if case == "no_unique" else " PRIMARY KEY"
        pg_conn.execute(f'CREATE TABLE "{table}" (k bigint{constraint}, n integer)')
    schema = {"type_mismatch": "k long, n long", "missing_column": "k long, n int, extra string"}.get(
        case, "k long, n int"
    )
    df = spark.createDataFrame([(1, 2, "x")[: len(schema.split(","))]], schema)
    opts: dict[str, Any] = {"key": "k"}
    if case == "missing_key":
        opts["key"] = "nope"
    elif case == "unknown_option":
        opts["verison"] = "n"
    elif case == "bad_delete_column":
        opts["delete.column"] = "n"
    with pytest.raises(Exception) as err:
        w = df.write.format("postgres-upsert").option("dsn", postgres_service.dsn).option("table", table)
        w.options(**opts).mode("append").save()
    assert needle in str(err.value)
    if case == "no_table":
        assert not _exists(pg_conn, table)
    else:
        assert _rows(pg_conn, table) == []


def test_null_key_fails_the_task_and_writes_nothing(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("nullkey")
    df = spark.createDataFrame([(1, "a"), (None, "b"), (3, "c")], "k long, v string").coalesce(1)
    with pytest.raises(Exception) as err:
        _write(df, postgres_service.dsn, table, key="k", table_create=True)
    assert "1 row(s) have a null key column 'k'" in str(err.value)
    assert _rows(pg_conn, table) == []


def test_unreachable_database_is_a_clear_error(spark: SparkSession, new_table: Any) -> None:
    df = spark.createDataFrame([(1, "a")], "k long, v string")
    with pytest.raises(Exception) as err:
        _write(df, "postgresql://app:s3cret@127.0.0.1:1/nowhere", new_table("x"), key="k", connect_timeout="2s")
    text = str(err.value)
    assert "cannot connect to app@127.0.0.1:1/nowhere" in text and "s3cret" not in text


def test_fault_point_before_write(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    """sink.before_write with action=raise fails the write before anything is staged."""
    table = new_table("fault")
    df = spark.createDataFrame([(1, "a")], "k long, v string").coalesce(1)
    with pytest.raises(Exception) as err:
        _write(df, postgres_service.dsn, table, key="k", table_create=True, faults="sink.before_write:action=raise")
    assert "fault injected at sink.before_write" in str(err.value)
    assert _rows(pg_conn, table) == []


def test_postgres_error_fails_the_task_with_message_and_sqlstate(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("fatal")
    pg_conn.execute(f'CREATE TABLE "{table}" (k bigint PRIMARY KEY, code varchar(3))')
    df = spark.createDataFrame([(1, "ok"), (2, "too long")], "k long, code string").coalesce(1)
    with pytest.raises(Exception) as err:
        _write(df, postgres_service.dsn, table, key="k", retry_attempts=3)
    text = str(err.value)
    assert "value too long for type character varying(3)" in text and "sqlstate 22001" in text
    assert "gave up after" not in text  # fatal: not retried
    assert _rows(pg_conn, table) == []  # the task's transaction rolled back: not even row 1


def test_unique_constraint_and_case_insensitive_columns(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("uniq")
    pg_conn.execute(
        f'CREATE TABLE "{table}" (id bigserial PRIMARY KEY, tenant text NOT NULL, code int NOT NULL, label text, UNIQUE (tenant, code))'
    )
    df = spark.createDataFrame(
        [("acme", 1, "one"), ("acme", 2, "two"), ("zeta", 1, "z")], "Tenant string, Code int, Label string"
    )
    _write(df, postgres_service.dsn, table, key="Tenant,Code")
    _write(df.withColumn("Label", F.upper("Label")), postgres_service.dsn, table, key="Tenant,Code")
    assert pg_conn.execute(f'SELECT tenant, code, label FROM "{table}" ORDER BY 1, 2').fetchall() == [
        ("acme", 1, "ONE"),
        ("acme", 2, "TWO"),
        ("zeta", 1, "Z"),
    ]
