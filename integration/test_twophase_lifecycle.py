"""postgres-2pc under operator actions, step by step against a real Postgres (its invariants I1-I4,
sinks/postgres/twophase).

Each test drives writers and committers directly, as Spark would across the action: a restored
savepoint, a bad value then a fixed query, a schema change with a batch in flight, speculation,
a batch job that died after PREPARE, a release with a batch in flight. Each asserts the action
happened (the refusal, the taken-back decision, the rolled-back gid) and the exact rows after it.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eos_core.errors import FatalError
from integration import test_twophase_support as support
from integration.test_twophase_protocol import SCHEMA, _prepared, _rows, _task, plan, sink
from sinks.postgres.twophase import (
    DataRefused,
    LineageMismatch,
    Superseded,
    TwoPhaseBatchWriter,
    TwoPhaseStreamWriter,
)
from sinks.postgres.twophase.decisions import ProtocolTables
from sinks.postgres.twophase.plan import _prefix, task_table

twophase_pg = support.twophase_pg
__all__ = ["sink", "twophase_pg"]

pytestmark = pytest.mark.integration


def _decision(s: dict[str, Any], batch: int) -> Any:
    with psycopg.connect(s["dsn"], autocommit=True) as conn:
        return ProtocolTables().decision(conn, s["sink_id"], batch)


def _run_batch(s: dict[str, Any], opts: dict[str, Any], batch: int, ids: range, schema: StructType = SCHEMA) -> None:
    w = TwoPhaseStreamWriter(opts, schema)
    half = ids.start + len(ids) // 2
    msgs = [_task(s, w, 0, range(ids.start, half), batch=batch), _task(s, w, 1, range(half, ids.stop), batch=batch)]
    TwoPhaseStreamWriter(opts, schema).commit(msgs, batch)  # type: ignore[arg-type]


def test_l1_latest_savepoint_restore_continues_exactly_once(sink: dict[str, Any], tmp_path: Any) -> None:
    for b in range(3):
        _run_batch(sink, sink["opts"], b, range(b * 10, b * 10 + 10))
    restored = str(tmp_path / "restored")
    shutil.copytree(sink["checkpoint"], restored)  # the latest savepoint, restored elsewhere
    opts = dict(sink["opts"], checkpointLocation=restored)
    # the crash replay of the last batch under the restored checkpoint: same lineage, skipped
    replay = _task(sink, TwoPhaseStreamWriter(opts, SCHEMA), 0, range(20, 25), batch=2)
    assert replay.skipped
    _run_batch(sink, opts, 3, range(30, 40))
    assert _rows(sink) == list(range(40)) and _prepared(sink) == []
    assert _decision(sink, 3).checkpoint == restored


def test_l2_older_savepoint_restore_is_refused_before_anything_is_written(sink: dict[str, Any], tmp_path: Any) -> None:
    older = str(tmp_path / "savepoint-at-1")
    for b in range(4):
        _run_batch(sink, sink["opts"], b, range(b * 10, b * 10 + 10))
        if b == 1:
            shutil.copytree(sink["checkpoint"], older)
    # restored at batch 1, new records produced: batch 2 is planned anew with other offsets
    plan(older, 2, '{"t":{"0":777}}')
    w = TwoPhaseStreamWriter(dict(sink["opts"], checkpointLocation=older), SCHEMA)
    before = _rows(sink)
    with pytest.raises(LineageMismatch) as err:
        _task(sink, w, 0, range(20, 27), batch=2)
    text = str(err.value)
    assert "batch 2 planned as" in text and older in text and "new 'sink.id'" in text and "sinks release" in text
    assert _prepared(sink) == [] and _rows(sink) == before  # nothing written
    # the commit refuses too (a task that could not see the lineage cannot sneak past it)
    with pytest.raises(LineageMismatch):
        w.commit([], 2)
    # a batch the sink never decided, with later ones decided (retention, or a gap): refused as well
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute("DELETE FROM eos.sink_batches WHERE sink_id = %s AND batch_id = 1", (sink["sink_id"],))
    plan(older, 1, '{"t":{"0":200}}')
    with pytest.raises(LineageMismatch, match="holds no decision for batch 1"):
        _task(sink, TwoPhaseStreamWriter(dict(sink["opts"], checkpointLocation=older), SCHEMA), 0, range(3), batch=1)
    assert _rows(sink) == before and _prepared(sink) == []


VARCHAR = StructType([StructField("id", LongType(), False), StructField("code", StringType(), True)])


def _varchar_table(s: dict[str, Any]) -> dict[str, Any]:
    table = s["table"] + "_v"
    with psycopg.connect(s["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, code varchar(4) NOT NULL CHECK (code <> 'bad'))")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO {table} VALUES (1000, 'old')")  # type: ignore[arg-type]
    return dict(s["opts"], table=table, **{"sink.id": s["sink_id"] + "-v"})


def _write_codes(s: dict[str, Any], opts: dict[str, Any], batch: int, rows: list[tuple[int, str | None]]) -> Any:
    w = TwoPhaseStreamWriter(opts, VARCHAR)
    plan(opts["checkpointLocation"], batch)
    s["state"]["ctx"] = (0, 0, 0, batch, "q1", "run1")
    data = pa.RecordBatch.from_pydict(
        {"id": pa.array([r[0] for r in rows], pa.int64()), "code": pa.array([r[1] for r in rows], pa.string())}
    )
    return w, w.write(iter([data]))


@pytest.mark.parametrize(
    ("bad", "expect"),
    [
        ((7, "toolong"), ['column "code"', "character varying(4)", "'toolong'"]),
        ((7, None), ['column "code"', "23502"]),
        ((7, "bad"), ["constraint", "23514"]),
        ((1000, "dup"), ["Key (id)=(1000) already exists", "23505"]),
    ],
    ids=["length", "not-null", "check", "unique-against-existing"],
)
def test_l3_bad_value_is_refused_before_visible_then_the_fixed_query_gets_past(
    sink: dict[str, Any], bad: tuple[int, str | None], expect: list[str]
) -> None:
    opts = _varchar_table(sink)
    table = opts["table"]
    _, msg = _write_codes(sink, opts, 0, [(1, "ok"), bad, (3, "fine")])
    with pytest.raises(DataRefused) as err:
        TwoPhaseStreamWriter(opts, VARCHAR).commit([msg], 0)
    text = str(err.value)
    assert table in text and all(e in text for e in expect), text
    assert "taken back" in text
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert ProtocolTables().decision(conn, opts["sink.id"], 0) is None  # un-decided, no trace
        assert conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall() == [(1000,)]  # type: ignore[arg-type]
        assert not conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{opts['sink.id']}%",)
        ).fetchall()
    # the query, fixed to drop the bad row, restarted from the same checkpoint: batch 0 again
    _, fixed = _write_codes(sink, opts, 0, [(1, "ok"), (3, "fine")])
    TwoPhaseStreamWriter(opts, VARCHAR).commit([fixed], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(f"SELECT id, code FROM {table} ORDER BY id").fetchall() == [  # type: ignore[arg-type]
            (1, "ok"),
            (3, "fine"),
            (1000, "old"),
        ]


def test_l3_statement_timeout_in_publish_is_taken_back_too(sink: dict[str, Any]) -> None:
    opts = _varchar_table(sink)
    _, msg = _write_codes(sink, opts, 0, [(1, "ok")])
    with psycopg.connect(sink["dsn"], autocommit=True) as locker:
        locker.execute("BEGIN")
        locker.execute(f"LOCK TABLE {opts['table']} IN ACCESS EXCLUSIVE MODE")  # type: ignore[arg-type]
        with pytest.raises(DataRefused, match="57014"):
            TwoPhaseStreamWriter(dict(opts, statement_timeout="1s"), VARCHAR).commit([msg], 0)
        locker.execute("ROLLBACK")
    assert _decision(dict(sink, sink_id=opts["sink.id"]), 0) is None
    _, again = _write_codes(sink, opts, 0, [(1, "ok")])
    TwoPhaseStreamWriter(opts, VARCHAR).commit([again], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM {opts['table']}").fetchone() == (2,)  # type: ignore[arg-type]


def test_l4_schema_change_with_a_batch_in_flight_rewrites_it_with_the_new_columns(sink: dict[str, Any]) -> None:
    _run_batch(sink, sink["opts"], 0, range(0, 4))
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    msgs = [_task(sink, w, 0, range(4, 6), batch=1), _task(sink, w, 1, range(6, 8), batch=1)]
    crash = dict(sink["opts"], faults="sink.commit.after_k:batch=1:k=1:action=raise")
    with pytest.raises(Exception, match="fault injected"):
        TwoPhaseStreamWriter(crash, SCHEMA).commit(msgs, 1)  # type: ignore[arg-type]
    old = _decision(sink, 1)
    assert old is not None and not old.published  # decided, one gid committed into staging, unpublished
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {sink['table']} ADD COLUMN note text")  # type: ignore[arg-type]
    wider = StructType([*SCHEMA.fields, StructField("note", StringType(), True)])
    w2 = TwoPhaseStreamWriter(sink["opts"], wider)
    assert w2.plan.stage != TwoPhaseStreamWriter(sink["opts"], SCHEMA).plan.stage  # another staging table
    new = []
    for p, ids in ((0, range(4, 6)), (1, range(6, 8))):
        sink["state"]["ctx"] = (p, 0, p, 1, "q1", "run2")
        rb = pa.RecordBatch.from_pydict(
            {
                "id": pa.array(list(ids), pa.int64()),
                "name": pa.array([f"x{i}" for i in ids]),
                "note": pa.array(["v2"] * len(ids)),
            }
        )
        new.append(w2.write(iter([rb])))
    assert _decision(sink, 1) is None  # the replay took the unpublished decision back
    TwoPhaseStreamWriter(sink["opts"], wider).commit(new, 1)  # type: ignore[arg-type]
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, note FROM {sink['table']} ORDER BY id").fetchall()  # type: ignore[arg-type]
        left = [
            g
            for g in old.gids
            if conn.execute("SELECT to_regclass(%s)", (task_table(_prefix(old.stage), g).sql,)).fetchone() != (None,)
        ]
    assert rows == [(i, None) for i in range(4)] + [(i, "v2") for i in range(4, 8)]
    assert _prepared(sink) == []
    assert left == [], f"staging tables of the taken-back attempt stay: {left}"


def test_l5_speculative_twins_either_accepted_no_failure_no_duplicate(sink: dict[str, Any]) -> None:
    for accepted in (0, 1):
        batch = accepted
        w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
        base = batch * 100
        first = _task(sink, w, 0, range(base, base + 3), batch=batch, attempt=0, task=1)
        twin = _task(sink, w, 0, range(base, base + 3), batch=batch, attempt=1, task=2)  # speculative copy
        other = _task(sink, w, 1, range(base + 3, base + 6), batch=batch, task=3)
        assert {first.gid, twin.gid, other.gid} <= set(_prepared(sink))  # the twin did not kill its sibling
        # a zombie twin starting after the decision of its own attempt writes nothing
        chosen = [first, twin][accepted]
        TwoPhaseStreamWriter(sink["opts"], SCHEMA).commit([chosen, other], batch)
        late = _task(sink, w, 0, range(base, base + 3), batch=batch, attempt=2, task=4)
        assert late.skipped
        assert _prepared(sink) == []
    assert _rows(sink) == [*range(0, 6), *range(100, 106)]


def test_l6_batch_job_killed_after_prepare_is_rolled_back_by_the_next_job(sink: dict[str, Any]) -> None:
    base = {k: v for k, v in sink["opts"].items() if k != "checkpointLocation"}
    dead = TwoPhaseBatchWriter(dict(base, **{"batch.id": "1", "prepared.timeout": "1s"}), SCHEMA)
    orphan = _task(sink, dead, 0, range(0, 3), batch=-1, query="")  # the job dies here, never re-run
    assert _prepared(sink) == [orphan.gid]
    from sinks.postgres import status

    time.sleep(1.5)
    job = TwoPhaseBatchWriter(dict(base, **{"batch.id": "2", "prepared.timeout": "1s"}), SCHEMA)
    report = status.sink_status(sink["dsn"], sink["sink_id"])  # the operator sees it, its age and why
    assert any(p["gid"] == orphan.gid and p["age_seconds"] >= 1 and "undecided" in p["why"] for p in report["in_doubt"])
    m = _task(sink, job, 0, range(10, 13), batch=-1, query="")
    assert orphan.gid not in _prepared(sink)  # rolled back: it was undecided and past prepared.timeout
    job.commit([m])
    assert _rows(sink) == [10, 11, 12] and _prepared(sink) == []


def test_l7_release_refuses_while_a_decided_batch_is_unpublished(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    m = _task(sink, w, 0, range(0, 3), batch=0)
    with pytest.raises(Exception, match="fault injected"):
        TwoPhaseStreamWriter(
            dict(sink["opts"], faults="sink.commit.after_decision:batch=0:action=raise"), SCHEMA
        ).commit([m], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        with pytest.raises(FatalError, match="not published"):
            ProtocolTables().release(conn, sink["sink_id"])
        assert ProtocolTables().decision(conn, sink["sink_id"], 0) is not None  # nothing changed
    TwoPhaseStreamWriter(sink["opts"], SCHEMA).commit([m], 0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert ProtocolTables().release(conn, sink["sink_id"]) == 1
    assert _rows(sink) == [0, 1, 2]


def test_decisions_are_pruned_to_the_retention_and_the_newest_stays(sink: dict[str, Any]) -> None:
    opts = dict(sink["opts"], **{"decisions.retain": "2"})
    for b in range(5):
        _run_batch(sink, opts, b, range(b * 2, b * 2 + 2))
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        kept = [d.batch_id for d in ProtocolTables().recent(conn, sink["sink_id"], 10)]
    assert kept == [4, 3, 2]
    assert _rows(sink) == list(range(10))
    assert os.path.isdir(sink["checkpoint"])


def test_a_committer_whose_decision_was_taken_over_stands_down(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    m = _task(sink, w, 0, range(0, 3), batch=0)
    crash = dict(sink["opts"], faults="sink.commit.after_decision:batch=0:action=raise")
    with pytest.raises(Exception, match="fault injected"):
        TwoPhaseStreamWriter(crash, SCHEMA).commit([m], 0)
    stale = TwoPhaseStreamWriter(sink["opts"], SCHEMA)._committer()
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        with pytest.raises(Superseded, match="stands down"):
            stale._publish(conn, 0, ("eos:gid-of-another-attempt",), stale.plan.stage.sql)
    assert _rows(sink) == [] and not _decision(sink, 0).published  # nothing touched
    TwoPhaseStreamWriter(sink["opts"], SCHEMA).commit([m], 0)
    assert _rows(sink) == [0, 1, 2]


def test_a_publish_failing_for_another_reason_keeps_the_decision(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    m = _task(sink, w, 0, range(0, 3), batch=0)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {sink['table']} RENAME TO {sink['table']}_away")  # type: ignore[arg-type]
    with pytest.raises(FatalError) as err:
        TwoPhaseStreamWriter(sink["opts"], SCHEMA)._committer().commit([m], 0)
    assert not isinstance(err.value, DataRefused) and "stays decided" in str(err.value) and "42P01" in str(err.value)
    assert _decision(sink, 0) is not None and not _decision(sink, 0).published
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {sink['table']}_away RENAME TO {sink['table']}")  # type: ignore[arg-type]
    TwoPhaseStreamWriter(sink["opts"], SCHEMA).commit([m], 0)  # the next run rolls it forward
    assert _rows(sink) == [0, 1, 2] and _prepared(sink) == []


def test_a_twin_that_prepares_after_the_decision_rolls_itself_back(
    sink: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from eos_core import faults

    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    winner = _task(sink, w, 0, range(0, 3), batch=0, attempt=0, task=1)
    real_point = faults.point

    def decide_meanwhile(name: str, **kw: Any) -> None:
        if name == "sink.after_write" and kw.get("attempt") == 1:  # the twin, just before its PREPARE
            TwoPhaseStreamWriter(sink["opts"], SCHEMA).commit([winner], 0)
        real_point(name, **kw)

    monkeypatch.setattr(faults, "point", decide_meanwhile)
    twin = _task(sink, w, 0, range(0, 3), batch=0, attempt=1, task=2)
    assert twin.skipped and twin.gid is None
    assert _prepared(sink) == [] and _rows(sink) == [0, 1, 2]
