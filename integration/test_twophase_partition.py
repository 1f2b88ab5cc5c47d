"""postgres-2pc with visibility=partition: tasks write straight into the table inside their prepared
transactions; the driver's COMMIT PREPAREDs make each task's rows visible (Flink's XA sink)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from eos_core.errors import ConfigError, FatalError
from integration import test_twophase_support as support
from integration.test_twophase_protocol import SCHEMA, _prepared, _rows, _task, plan, sink
from sinks.postgres.twophase import DIRECT, DataRefused, TwoPhaseStreamWriter
from sinks.postgres.twophase.decisions import ProtocolTables

twophase_pg = support.twophase_pg
__all__ = ["sink", "twophase_pg"]

pytestmark = pytest.mark.integration


def _opts(s: dict[str, Any], **extra: str) -> dict[str, Any]:
    return dict(s["opts"], visibility="partition", **extra)


def _staging_tables(dsn: str, sink_id: str) -> list[str]:
    """The sink's shared staging tables, and any per-task staging table left behind."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_description d ON d.objoid = c.oid AND d.objsubid = 0 "
            "WHERE c.relkind = 'r' AND (d.description = %s OR c.relname LIKE 'eos\\_stage\\_%%')",
            (f"spark-eos staging of sink {sink_id}",),
        ).fetchall()
    return [r[0] for r in rows]


def test_rows_appear_task_by_task_with_commit_prepared_and_a_crash_rolls_forward(sink: dict[str, Any]) -> None:
    opts = _opts(sink)
    w = TwoPhaseStreamWriter(opts, SCHEMA)
    assert w.plan.direct and w.plan.copy_direct
    m0, m1 = _task(sink, w, 0, range(0, 3), batch=0), _task(sink, w, 1, range(3, 6), batch=0)
    assert _rows(sink) == []  # prepared: invisible
    crash = dict(opts, faults="sink.commit.after_k:batch=0:k=1:action=raise")
    with pytest.raises(Exception, match="fault injected"):
        TwoPhaseStreamWriter(crash, SCHEMA).commit([m0, m1], 0)
    first = _rows(sink)
    assert len(first) == 3 and first in ([0, 1, 2], [3, 4, 5])  # one task's rows visible: its COMMIT PREPARED ran
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        decision = ProtocolTables().decision(conn, sink["sink_id"], 0)
    assert decision is not None and decision.stage == DIRECT and not decision.published
    # the replay, even with other columns, rolls forward: rows of a direct decision may be visible
    replay = _task(sink, TwoPhaseStreamWriter(opts, SCHEMA), 0, range(0, 3), batch=0)
    assert replay.skipped
    TwoPhaseStreamWriter(opts, SCHEMA).commit([replay], 0)
    assert _rows(sink) == list(range(6)) and _prepared(sink) == []
    assert _staging_tables(sink["dsn"], sink["sink_id"]) == []  # nothing staged outside the tasks' transactions


def test_a_refused_value_fails_the_task_before_prepare(sink: dict[str, Any]) -> None:
    table = sink["table"] + "_v"
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name varchar(4))")  # type: ignore[arg-type]
    opts = _opts(sink, table=table)
    w = TwoPhaseStreamWriter(opts, SCHEMA)
    plan(opts["checkpointLocation"], 0)
    sink["state"]["ctx"] = (0, 0, 0, 0, "q1", "run1")
    bad = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["ok", "toolong"])})
    with pytest.raises(DataRefused) as err:
        w.write(iter([bad]))
    text = str(err.value)
    assert table in text and "character varying(4)" in text and "toolong" in text and "name" in text, text
    assert _prepared(sink) == []
    good = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64()), "name": pa.array(["ok"])})
    m = TwoPhaseStreamWriter(opts, SCHEMA).write(iter([good]))
    TwoPhaseStreamWriter(opts, SCHEMA).commit([m], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(f"SELECT id, name FROM {table}").fetchall() == [(1, "ok")]  # type: ignore[arg-type]


WIDE = StructType([StructField("id", LongType(), False), StructField("n", LongType(), True)])


def test_widening_and_upsert_go_through_a_staging_table_of_the_task_transaction(sink: dict[str, Any]) -> None:
    table = sink["table"] + "_w"
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, n numeric(20,0))")  # type: ignore[arg-type]
    for mode in ("append", "upsert"):
        extra = {"mode": "upsert", "key": "id", "version": "n"} if mode == "upsert" else {}
        opts = _opts(sink, table=table, **{"sink.id": f"{sink['sink_id']}-{mode}"}, **extra)
        w = TwoPhaseStreamWriter(opts, WIDE)
        assert w.plan.direct and not w.plan.copy_direct
        batch = 0 if mode == "append" else 1
        plan(opts["checkpointLocation"], batch)
        sink["state"]["ctx"] = (0, 0, 0, batch, "q1", "run1")
        rows = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64()), "n": pa.array([10, 20], pa.int64())})
        if mode == "upsert":
            rows = pa.RecordBatch.from_pydict({"id": pa.array([2, 2], pa.int64()), "n": pa.array([25, 21], pa.int64())})
        m = w.write(iter([rows]))
        TwoPhaseStreamWriter(opts, WIDE).commit([m], batch)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        got = conn.execute(f"SELECT id, n FROM {table} ORDER BY id").fetchall()  # type: ignore[arg-type]
    assert [(i, int(n)) for i, n in got] == [(1, 10), (2, 25)]
    for mode in ("append", "upsert"):
        assert _staging_tables(sink["dsn"], f"{sink['sink_id']}-{mode}") == []


def test_the_same_key_in_two_partitions_fails_clearly_after_lock_timeout(sink: dict[str, Any]) -> None:
    opts = _opts(sink, mode="upsert", key="id", **{"lock.timeout": "300ms"})
    w = TwoPhaseStreamWriter(opts, SCHEMA)
    _task(sink, w, 0, range(0, 3), batch=0)
    with pytest.raises(FatalError, match=r"repartition") as err:
        _task(sink, w, 1, range(2, 4), batch=0)  # key 2 again, in another task of the same batch
    assert "lock.timeout" in str(err.value)


def test_a_unique_value_in_two_partitions_is_not_diverted_and_fails_saying_so(sink: dict[str, Any]) -> None:
    """errors.tolerance=all cannot divert a row whose unique value a sibling task holds in its prepared
    transaction: the lock wait ends at lock.timeout with an error naming both ways out, nothing diverted."""
    refused = sink["table"] + "_refused"
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {sink['table']} ADD UNIQUE (name)")  # type: ignore[arg-type]
    opts = _opts(sink, **{"lock.timeout": "300ms", "errors.tolerance": "all", "errors.table": refused})
    w = TwoPhaseStreamWriter(opts, SCHEMA)
    _task(sink, w, 0, range(0, 3), batch=0)  # names x0, x1, x2, prepared
    sink["state"]["ctx"] = (1, 0, 1, 0, "q1", "run1")
    twin = pa.RecordBatch.from_pydict({"id": pa.array([7], pa.int64()), "name": pa.array(["x1"], pa.string())})
    with pytest.raises(FatalError, match=r"errors.tolerance cannot divert such a row") as err:
        w.write(iter([twin]))
    assert "visibility=batch" in str(err.value) and "repartition" in str(err.value)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM {refused}").fetchone() == (0,)  # type: ignore[arg-type]


def test_speculative_twins_in_partition_mode_end_exactly_once(sink: dict[str, Any]) -> None:
    table = sink["table"] + "_nokey"
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, name text)")  # type: ignore[arg-type]
    opts = _opts(sink, table=table)
    w = TwoPhaseStreamWriter(opts, SCHEMA)
    first = _task(sink, w, 0, range(0, 3), batch=0, attempt=0, task=1)
    twin = _task(sink, w, 0, range(0, 3), batch=0, attempt=1, task=2)
    assert {first.gid, twin.gid} <= set(_prepared(sink))
    TwoPhaseStreamWriter(opts, SCHEMA).commit([twin], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert sorted(r[0] for r in conn.execute(f"SELECT id FROM {table}")) == [0, 1, 2]  # type: ignore[arg-type]
    assert _prepared(sink) == []


def test_complete_mode_is_refused_with_partition_visibility(sink: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="complete output mode") as err:
        TwoPhaseStreamWriter(
            dict(_opts(sink), **{"table.create": "true", "table": "t_" + uuid.uuid4().hex[:8]}), SCHEMA, True
        )
    assert err.value.option == "visibility"
