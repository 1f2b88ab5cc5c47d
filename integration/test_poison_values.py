"""Values Postgres cannot take as sent, or would change, never wedge a batch and never change silently.

Writers driven directly (as Spark's tasks and committer would), through both sinks and every mode
(postgres-upsert; postgres-2pc append with visibility=batch and partition, upsert mode):

- a NUL character in text, NaN inside a struct column (jsonb), a NUL inside a map's key: with
  errors.tolerance=all each such row goes to the dead-letter table (naming the column, the value
  escaped) and the others are written; without it the batch is refused before anything is visible,
  naming column, value and row;
- deferred constraints (DEFERRABLE INITIALLY DEFERRED) are checked inside the search: diverted;
- text into ``name`` longer than 63 bytes, microseconds into ``timestamp(0)``, a double rounded into
  ``numeric(10,2)``, a NaN version: refused naming column and value, or diverted.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from integration.test_twophase_protocol import plan, sink
from integration.test_twophase_support import twophase_pg
from sinks.postgres.merge import KeyTracker
from sinks.postgres.options import UpsertOptions
from sinks.postgres.refusal import DataRefused
from sinks.postgres.staging import UpsertPlanner, prepared_rows
from sinks.postgres.twophase import TwoPhaseStreamWriter
from sinks.postgres.upsert import write_transaction

__all__ = ["sink", "twophase_pg"]

pytestmark = pytest.mark.integration

NESTED = StructType([StructField("x", DoubleType()), StructField("tag", StringType())])
SCHEMA = StructType([StructField("id", LongType(), False), StructField("s", StringType()), StructField("j", NESTED)])


def _batch() -> pa.RecordBatch:
    """Rows 1-4 good; 5 NUL in text; 6 NaN in the struct; 7 Infinity in the struct; 8 NUL in the struct."""
    ids = list(range(1, 9))
    s = ["a", "b", "c", "d", "x\x00y", "f", "g", "h"]
    j = [{"x": float(i), "tag": "t"} for i in ids]
    j[5]["x"] = math.nan
    j[6]["x"] = -math.inf
    j[7]["tag"] = "bad\x00tag"
    nested = pa.struct([("x", pa.float64()), ("tag", pa.string())])
    return pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "s": pa.array(s), "j": pa.array(j, nested)})


BAD = {5: "s", 6: "j", 7: "j", 8: "j"}


def _create(dsn: str, table: str, extra: str = "") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, s text, j jsonb{extra})")  # type: ignore[arg-type]


def _ids(dsn: str, table: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]  # type: ignore[arg-type]


def _letters(dsn: str, table: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT (row->>'id')::bigint, column_name, sqlstate, message, detail, row FROM {table}_refused"  # type: ignore[arg-type]
        ).fetchall()
    out: dict[int, tuple[Any, ...]] = {}
    for r in rows:
        assert r[0] not in out, f"row {r[0]} is in the dead-letter table twice"
        out[r[0]] = r[1:]
    return out


def _check_letters(dsn: str, table: str) -> None:
    letters = _letters(dsn, table)
    assert sorted(letters) == sorted(BAD), letters
    for row_id, column in BAD.items():
        col, state, message, detail, row = letters[row_id]
        assert col == column and state.startswith("22"), letters[row_id]
        assert re.match(r"row \d+ of the task; ", detail), detail
        assert f'column "{column}"' in message, message
        assert set(row) == {"id", "s", "j"}, row
    assert letters[5][4]["s"] == "x\\x00y"  # the value, escaped: jsonb cannot hold a NUL
    assert letters[6][4]["j"] == {"x": "NaN", "tag": "t"} and "NaN" in letters[6][2]
    assert letters[7][4]["j"]["x"] == "-Infinity"
    assert letters[8][4]["j"]["tag"] == "bad\\x00tag"


# ---- postgres-upsert ----------------------------------------------------------------------------


def _upsert(dsn: str, table: str, schema: StructType, batch: pa.RecordBatch, **options: str) -> Any:
    opts = UpsertOptions.from_options({"dsn": dsn, "table": table, "key": "id", **options})
    merge = UpsertPlanner(opts, schema).plan()
    keys = KeyTracker(merge.key)
    rows = list(prepared_rows(iter([batch]), merge, opts, keys))
    return write_transaction(opts, merge, rows, keys=keys, batch_id=3)


def test_upsert_diverts_values_postgres_cannot_hold_and_writes_the_rest(twophase_pg: Any, new_table: Any) -> None:
    table = new_table("pv")
    _create(twophase_pg.dsn, table)
    counts = _upsert(
        twophase_pg.dsn, table, SCHEMA, _batch(), **{"errors.tolerance": "all", "errors.table": f"{table}_refused"}
    )
    assert counts.refused == 4 and counts.upserted == 4
    assert _ids(twophase_pg.dsn, table) == [1, 2, 3, 4]
    _check_letters(twophase_pg.dsn, table)
    # a replay of the batch (a crash before Spark's commit log): nothing new anywhere
    again = _upsert(
        twophase_pg.dsn, table, SCHEMA, _batch(), **{"errors.tolerance": "all", "errors.table": f"{table}_refused"}
    )
    assert again.refused == 4  # diverted again: the dead-letter table keeps one row each (below)
    assert _ids(twophase_pg.dsn, table) == [1, 2, 3, 4] and len(_letters(twophase_pg.dsn, table)) == 4


def test_upsert_without_tolerance_refuses_naming_column_value_and_row(twophase_pg: Any, new_table: Any) -> None:
    table = new_table("pv")
    _create(twophase_pg.dsn, table)
    with pytest.raises(DataRefused) as err:
        _upsert(twophase_pg.dsn, table, SCHEMA, _batch())
    text = str(err.value)
    assert 'column "s" (text)' in text and "'x\\x00y'" in text and "row 5 of the task" in text, text
    assert "NUL" in text and "errors.tolerance=all" in text
    assert _ids(twophase_pg.dsn, table) == []


def test_upsert_checks_deferred_constraints_inside_the_search(twophase_pg: Any, new_table: Any) -> None:
    table = new_table("pv")
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_p (id bigint PRIMARY KEY)")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO {table}_p VALUES (1), (2), (3), (4)")  # type: ignore[arg-type]
    _create(
        twophase_pg.dsn,
        table,
        f", parent bigint REFERENCES {table}_p (id) DEFERRABLE INITIALLY DEFERRED",
    )
    schema = StructType([StructField("id", LongType(), False), StructField("parent", LongType())])
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 2, 3], pa.int64()), "parent": pa.array([1, 99, 3], pa.int64())}
    )
    counts = _upsert(
        twophase_pg.dsn, table, schema, batch, **{"errors.tolerance": "all", "errors.table": f"{table}_refused"}
    )
    assert counts.refused == 1
    assert _ids(twophase_pg.dsn, table) == [1, 3]
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT (row->>'id')::int, sqlstate FROM {table}_refused").fetchall() == [(2, "23503")]  # type: ignore[arg-type]


# ---- postgres-2pc ---------------------------------------------------------------------------------


def _twopc(
    s: dict[str, Any], table: str, schema: StructType, batches: list[pa.RecordBatch], batch: int = 0, **options: str
) -> Any:
    """Two tasks (one batch each) of batch ``batch`` and the commit, as Spark runs them."""
    opts = dict(s["opts"], table=table, **{"sink.id": f"{s['sink_id']}-{table[-6:]}"}, **options)
    plan(s["checkpoint"], batch)
    writer = TwoPhaseStreamWriter(opts, schema)
    msgs = []
    for p, data in enumerate(batches):
        s["state"]["ctx"] = (p, 0, p, batch, "q1", "run1")
        msgs.append(writer.write(iter([data])))
    TwoPhaseStreamWriter(opts, schema).commit(msgs, batch)
    return msgs


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"visibility": "partition"},
        {"mode": "upsert", "key": "id"},
        {"mode": "upsert", "key": "id", "visibility": "partition"},
    ],
    ids=["batch", "partition", "upsert-batch", "upsert-partition"],
)
def test_2pc_diverts_values_postgres_cannot_hold(sink: dict[str, Any], options: dict[str, str]) -> None:
    table = sink["table"] + "_pv"
    _create(sink["dsn"], table)
    data = _batch()
    _twopc(
        sink,
        table,
        SCHEMA,
        [data.slice(0, 5), data.slice(5)],
        **options,
        **{"errors.tolerance": "all", "errors.table": f"{table}_refused"},
    )
    assert _ids(sink["dsn"], table) == [1, 2, 3, 4]
    _check_letters(sink["dsn"], table)


@pytest.mark.parametrize("options", [{}, {"visibility": "partition"}], ids=["batch", "partition"])
def test_2pc_without_tolerance_refuses_before_anything_is_visible(
    sink: dict[str, Any], options: dict[str, str]
) -> None:
    table = sink["table"] + "_pv"
    _create(sink["dsn"], table)
    with pytest.raises(DataRefused) as err:
        _twopc(sink, table, SCHEMA, [_batch().slice(4, 2)], **options)
    text = str(err.value)
    assert 'column "s" (text)' in text and "'x\\x00y'" in text and "row 1 of the task" in text, text
    assert _ids(sink["dsn"], table) == []
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eos:{sink['sink_id']}%",)
        ).fetchone() == (0,)


@pytest.mark.parametrize("options", [{}, {"visibility": "partition"}], ids=["batch", "partition"])
def test_2pc_checks_deferred_constraints_inside_the_search(sink: dict[str, Any], options: dict[str, str]) -> None:
    table = sink["table"] + "_dc"
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_p (id bigint PRIMARY KEY)")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO {table}_p VALUES (1), (3)")  # type: ignore[arg-type]
        conn.execute(
            f"CREATE TABLE {table} (id bigint, parent bigint REFERENCES {table}_p (id) DEFERRABLE INITIALLY DEFERRED)"  # type: ignore[arg-type]
        )
    schema = StructType([StructField("id", LongType(), False), StructField("parent", LongType())])
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 2, 3], pa.int64()), "parent": pa.array([1, 99, 3], pa.int64())}
    )
    _twopc(sink, table, schema, [batch], **options, **{"errors.tolerance": "all", "errors.table": f"{table}_refused"})
    assert _ids(sink["dsn"], table) == [1, 3]
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(f"SELECT (row->>'id')::int, sqlstate FROM {table}_refused").fetchall() == [(2, "23503")]  # type: ignore[arg-type]


# ---- values Postgres would change without a word -------------------------------------------------

CHANGED = [
    ("n name", StringType(), "é" * 40, 'column "n" (name)', "63 bytes"),  # 80 bytes: Postgres would cut it
    (
        "n timestamp(0) with time zone",
        TimestampType(),
        dt.datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=dt.timezone.utc),
        'column "n" (timestamp(0) with time zone)',
        "round",
    ),
    ("n numeric(10,2)", DoubleType(), 0.125, 'column "n" (numeric(10,2))', "0.13"),
    ("n numeric", DoubleType(), 0.1 + 0.2, 'column "n" (numeric)', "0.3"),
]


@pytest.mark.parametrize(
    ("column", "spark_type", "value", "names", "why"),
    CHANGED,
    ids=["name", "timestamp0", "numeric-scale", "numeric-digits"],
)
def test_values_postgres_would_change_are_refused_or_diverted(
    twophase_pg: Any, new_table: Any, column: str, spark_type: Any, value: Any, names: str, why: str
) -> None:
    table = new_table("pc")
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, {column})")  # type: ignore[arg-type]
    schema = StructType([StructField("id", LongType(), False), StructField("n", spark_type)])
    arrow = {StringType: pa.string(), TimestampType: pa.timestamp("us", tz="UTC"), DoubleType: pa.float64()}[
        type(spark_type)
    ]
    ok = {StringType: "ok", TimestampType: dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), DoubleType: 0.5}[
        type(spark_type)
    ]
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64()), "n": pa.array([ok, value], arrow)})
    with pytest.raises(DataRefused) as err:
        _upsert(twophase_pg.dsn, table, schema, batch)
    assert names in str(err.value) and why in str(err.value) and "row 2 of the task" in str(err.value), str(err.value)
    assert _ids(twophase_pg.dsn, table) == []
    counts = _upsert(
        twophase_pg.dsn, table, schema, batch, **{"errors.tolerance": "all", "errors.table": f"{table}_refused"}
    )
    assert counts.refused == 1 and _ids(twophase_pg.dsn, table) == [1]
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        (row,) = conn.execute(f"SELECT message FROM {table}_refused").fetchone()  # type: ignore[arg-type,misc]
        assert names in row and why in row, row


def test_a_nan_version_is_refused_not_frozen_into_the_key(twophase_pg: Any, new_table: Any) -> None:
    table = new_table("pc")
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v double precision, s text)")  # type: ignore[arg-type]
    schema = StructType(
        [StructField("id", LongType(), False), StructField("v", DoubleType()), StructField("s", StringType())]
    )
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 2], pa.int64()), "v": pa.array([1.0, math.nan]), "s": pa.array(["a", "b"])}
    )
    with pytest.raises(DataRefused) as err:
        _upsert(twophase_pg.dsn, table, schema, batch, version="v")
    assert 'column "v"' in str(err.value) and "NaN" in str(err.value), str(err.value)
    counts = _upsert(
        twophase_pg.dsn,
        table,
        schema,
        batch,
        version="v",
        **{"errors.tolerance": "all", "errors.table": f"{table}_refused"},
    )
    assert counts.refused == 1 and _ids(twophase_pg.dsn, table) == [1]
    newer = pa.RecordBatch.from_pydict({"id": pa.array([2], pa.int64()), "v": pa.array([5.0]), "s": pa.array(["c"])})
    _upsert(twophase_pg.dsn, table, schema, newer, version="v")
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:  # the key takes its newer rows
        assert conn.execute(f"SELECT id, v, s FROM {table} ORDER BY id").fetchall() == [(1, 1.0, "a"), (2, 5.0, "c")]  # type: ignore[arg-type]


def test_replay_keeps_a_dead_letter_whose_value_is_escaped_until_it_is_repaired(
    twophase_pg: Any, new_table: Any
) -> None:
    # replayed as stored, the escaped text ("x\\x00y", "NaN") would be written as data: the row stays,
    # saying why, until an operator repairs the value and removes the note from its detail
    from sinks.postgres.deadletter import replay
    from sinks.postgres.options import parse_table_name
    from sinks.postgres.refusal import ESCAPED_NOTE

    table = new_table("pvr")
    _create(twophase_pg.dsn, table)
    errors = {"errors.tolerance": "all", "errors.table": f"{table}_refused"}
    _upsert(twophase_pg.dsn, table, SCHEMA, _batch(), **errors)
    dead, target = parse_table_name(f"{table}_refused"), parse_table_name(table)
    with psycopg.connect(twophase_pg.dsn) as conn:
        result = replay(conn, dead, target)
        assert (result.moved, result.kept) == (0, 4), result
        notes = conn.execute(f"SELECT replay_error FROM {table}_refused").fetchall()  # type: ignore[arg-type]
        assert len(notes) == 4 and all("escaped" in n[0] and "repair" in n[0] for n in notes), notes
        # the operator repairs row 5 (the NUL) and says so by removing the note
        conn.execute(
            f"UPDATE {table}_refused SET row = jsonb_set(row, '{{s}}', '\"xy\"'), "  # type: ignore[arg-type]
            "detail = replace(detail, %s, 'repaired') WHERE (row->>'id')::bigint = 5",
            ("; " + ESCAPED_NOTE,),
        )
        result = replay(conn, dead, target)
        assert (result.moved, result.kept) == (1, 3), result
    assert _ids(twophase_pg.dsn, table) == [1, 2, 3, 4, 5]
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT s FROM {table} WHERE id = 5").fetchone() == ("xy",)  # type: ignore[arg-type]
