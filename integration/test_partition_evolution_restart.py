"""postgres-2pc visibility=partition with schema.evolution=add-columns restarts after a crash between
PREPARE and the decision, with the query's columns grown: the undecided prepared transactions of the
dead attempt (which hold the table) are rolled back before the ALTER TABLE, instead of the ALTER
waiting on them until it gives up on every restart; the replayed batch is then written exactly once.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from integration.test_twophase_protocol import SCHEMA, _batch, _prepared, plan, sink
from integration.test_twophase_support import twophase_pg
from sinks.postgres import types
from sinks.postgres.twophase import TwoPhaseStreamWriter

__all__ = ["sink", "twophase_pg"]

pytestmark = pytest.mark.integration

WIDER = StructType([*SCHEMA.fields, StructField("note", StringType(), True)])


def _wide(ids: range) -> pa.RecordBatch:
    base = _batch(ids)
    return pa.RecordBatch.from_arrays([*base.columns, pa.array([f"n{i}" for i in ids])], names=["id", "name", "note"])


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_restart_with_new_columns_rolls_back_the_dead_attempt_before_altering(
    sink: dict[str, Any], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(types, "ALTER_LOCK_TIMEOUT", 5.0)  # what the restart would wait for, here
    opts = dict(sink["opts"], visibility="partition", **{"schema.evolution": "add-columns"})
    if mode == "upsert":
        opts.update(mode="upsert", key="id")
    plan(sink["checkpoint"], 0)
    crashed = TwoPhaseStreamWriter(opts, SCHEMA)
    for p, ids in enumerate((range(0, 3), range(3, 6))):
        sink["state"]["ctx"] = (p, 0, p, 0, "q1", "run1")
        assert crashed.write(iter([_batch(ids)])).gid is not None
    assert len(_prepared(sink)) == 2  # the driver died here: no decision, the rows held in the table
    # the restart replays batch 0, with a column the query gained meanwhile
    started = time.monotonic()
    writer = TwoPhaseStreamWriter(opts, WIDER)
    assert time.monotonic() - started < 4.0, "the writer waited on the ALTER TABLE"
    assert _prepared(sink) == []  # the dead attempt's transactions are gone (nothing of them was visible)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
                "ORDER BY attnum",
                (sink["table"],),
            ).fetchall()
        ]
    assert columns == ["id", "name", "note"]
    msgs = []
    for p, ids in enumerate((range(0, 3), range(3, 6))):
        sink["state"]["ctx"] = (p, 0, 10 + p, 0, "q1", "run2")
        msgs.append(writer.write(iter([_wide(ids)])))
    TwoPhaseStreamWriter(opts, WIDER).commit(msgs, 0)  # the commit process builds the plan too: no ALTER, no rollback
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, note FROM {sink['table']} ORDER BY id").fetchall()  # type: ignore[arg-type]
    assert rows == [(i, f"n{i}") for i in range(6)]
    assert _prepared(sink) == []


def test_a_commit_process_with_the_same_columns_rolls_back_nothing(sink: dict[str, Any]) -> None:
    """The plan is built in the commit process too: with the columns in place it must never touch the
    batch's prepared transactions (they are about to be decided)."""
    opts = dict(sink["opts"], visibility="partition", **{"schema.evolution": "add-columns"})
    plan(sink["checkpoint"], 0)
    writer = TwoPhaseStreamWriter(opts, SCHEMA)
    sink["state"]["ctx"] = (0, 0, 0, 0, "q1", "run1")
    msg = writer.write(iter([_batch(range(3))]))
    from sinks.postgres.twophase import plan as twophase_plan

    twophase_plan._SETUP_CACHE.clear()  # a fresh process
    committer = TwoPhaseStreamWriter(opts, SCHEMA)
    assert _prepared(sink) == [msg.gid]
    committer.commit([msg], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM {sink['table']}").fetchone() == (3,)  # type: ignore[arg-type]
