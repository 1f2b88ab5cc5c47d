"""The two-phase protocol step by step against a real Postgres, driving writer and committer directly.

Spark is not needed to exercise write/commit/abort: tasks are simulated by setting what
``TaskContext`` would report (partition, attempt, task attempt id, batch, query id).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from eos_core.errors import CommitUnknown, ConfigError, FatalError, RetriableError
from eos_core.privileges import PgGrant
from integration import test_twophase_support as support
from integration.test_twophase_support import start_cluster
from sinks.postgres.twophase import TwoPhaseBatchWriter, TwoPhaseMessage, TwoPhaseStreamWriter
from sinks.postgres.twophase import writer as twophase_writer
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared
from sinks.postgres.twophase.recovery import commit_prepared, resolve
from sinks.postgres.twophase.writer import TaskIdentity

twophase_pg = support.twophase_pg  # the shared fixture

pytestmark = pytest.mark.integration

SCHEMA = StructType([StructField("id", LongType(), False), StructField("name", StringType(), True)])


def _batch(ids: range, name: str = "x") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": pa.array(list(ids), pa.int64()), "name": pa.array([f"{name}{i}" for i in ids], pa.string())}
    )


def plan(checkpoint: str, batch: int, sources: str | None = None) -> None:
    """Write offsets/<batch> as Spark does before running the batch (unless it exists)."""
    path = os.path.join(checkpoint, "offsets", str(batch))
    if os.path.exists(path) and sources is None:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = sources if sources is not None else json.dumps({"t": {"0": (batch + 1) * 100}})
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": batch})
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"v1\n{meta}\n{body}\n")


def _planned_checkpoint() -> str:
    """A checkpoint where Spark has planned batch 0, for tests that only build writers."""
    path = tempfile.mkdtemp(prefix="eos-ckpt-")
    plan(path, 0)
    return path


@pytest.fixture
def sink(twophase_pg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[dict[str, Any]]:
    table = "tp_" + uuid.uuid4().hex[:10]
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text)")  # type: ignore[arg-type]
    state = {"ctx": (0, 0, 0, None, "q1", "run1")}
    monkeypatch.setattr(twophase_writer, "_task_context", lambda: TaskIdentity(*state["ctx"]))
    checkpoint = str(tmp_path / "checkpoint")
    plan(checkpoint, 0)  # Spark plans batch 0 before it builds the first writer
    opts = {"dsn": twophase_pg.dsn, "table": table, "sink.id": f"s-{table}", "checkpointLocation": checkpoint}
    yield {
        "dsn": twophase_pg.dsn,
        "table": table,
        "opts": opts,
        "state": state,
        "sink_id": f"s-{table}",
        "checkpoint": checkpoint,
    }


def _task(
    sink: dict[str, Any],
    writer: Any,
    partition: int,
    ids: range,
    *,
    batch: int,
    attempt: int = 0,
    task: int | None = None,
    query: str = "q1",
) -> TwoPhaseMessage:
    sink["state"]["ctx"] = (
        partition,
        attempt,
        task if task is not None else partition + 10 * attempt,
        batch,
        query,
        "run1",
    )
    if batch >= 0 and writer.opts.checkpoint:
        plan(writer.opts.checkpoint, batch)
    msg = writer.write(iter([_batch(ids)]))
    assert isinstance(msg, TwoPhaseMessage)
    return msg


def _rows(sink: dict[str, Any]) -> list[int]:
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        return [r[0] for r in conn.execute(f"SELECT id FROM {sink['table']} ORDER BY id").fetchall()]  # type: ignore[arg-type]


def _prepared(sink: dict[str, Any]) -> list[str]:
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        return sorted(str(p.gid) for p in list_prepared(conn, sink["sink_id"]))


def test_write_prepares_commit_publishes_and_second_commit_is_a_no_op(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    m0 = _task(sink, w, 0, range(0, 5), batch=0)
    m1 = _task(sink, w, 1, range(5, 8), batch=0)
    assert m0.gid and m1.gid and m0.rows == 5
    assert _prepared(sink) == sorted([m0.gid, m1.gid])
    assert _rows(sink) == []  # prepared: invisible
    committer = TwoPhaseStreamWriter(sink["opts"], SCHEMA)  # a fresh writer, as in Spark's commit process
    assert committer.nonce != w.nonce
    committer.commit([m0, m1], 0)
    assert _rows(sink) == list(range(8))
    assert _prepared(sink) == []
    committer.commit([m0, m1], 0)  # Spark never does, recovery may: idempotent
    assert _rows(sink) == list(range(8))
    # the replay of a decided batch writes nothing
    again = _task(sink, TwoPhaseStreamWriter(sink["opts"], SCHEMA), 0, range(0, 5), batch=0)
    assert again.skipped and again.gid is None
    assert pickle.loads(pickle.dumps(m0)) == m0


def test_stale_gids_of_dead_attempts_are_rolled_back_before_writing_siblings_kept(sink: dict[str, Any]) -> None:
    dead = TwoPhaseStreamWriter(sink["opts"], SCHEMA)  # a run that crashed after PREPARE
    d0 = _task(sink, dead, 0, range(0, 5), batch=3)
    d1 = _task(sink, dead, 1, range(5, 10), batch=3)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        # What a stale prepared transaction can do to a replay: it holds its locks until resolved.
        # Here it holds the marker/staging rows; show that a lock on the target row would block a
        # writer (lock_timeout turns the endless wait into an error).
        conn.execute(
            f"BEGIN; INSERT INTO {sink['table']} VALUES (99, 'lock'); PREPARE TRANSACTION 'eos-test-{sink['table']}'"
        )  # type: ignore[arg-type]
        with psycopg.connect(sink["dsn"], autocommit=True) as other:
            other.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(f"INSERT INTO {sink['table']} VALUES (99, 'blocked')")  # type: ignore[arg-type]
        conn.execute(f"ROLLBACK PREPARED 'eos-test-{sink['table']}'")  # type: ignore[arg-type]
    live = TwoPhaseStreamWriter(sink["opts"], SCHEMA)  # the replay after restart
    r0 = _task(sink, live, 0, range(0, 5), batch=3)
    prepared = _prepared(sink)
    assert d0.gid not in prepared and d1.gid not in prepared, "the dead attempt's gids must be rolled back first"
    assert r0.gid in prepared
    # a task retry of partition 1 in the live attempt: its predecessor (same nonce) stays prepared
    # (with speculation Spark may still accept it); the commit rolls back the attempt it did not accept
    first = _task(sink, live, 1, range(5, 10), batch=3, attempt=0, task=21)
    retry = _task(sink, live, 1, range(5, 10), batch=3, attempt=1, task=22)
    prepared = _prepared(sink)
    assert first.gid in prepared and retry.gid in prepared and r0.gid in prepared
    TwoPhaseStreamWriter(sink["opts"], SCHEMA).commit([r0, retry], 3)
    assert _rows(sink) == list(range(10)) and _prepared(sink) == []


def test_gid_gone_is_resolved_through_its_marker_and_never_guessed(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    m0 = _task(sink, w, 0, range(0, 3), batch=1)
    m1 = _task(sink, w, 1, range(3, 6), batch=1)
    tables = ProtocolTables()
    failing = TwoPhaseStreamWriter(dict(sink["opts"], faults="sink.commit.after_decision:batch=1:action=raise"), SCHEMA)
    with pytest.raises(Exception, match="fault injected"):
        failing.commit([m0, m1], 1)  # decided, nothing committed yet
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert not tables.marker_exists(conn, m0.gid)  # type: ignore[arg-type]
        conn.execute(f"COMMIT PREPARED '{m0.gid}'")  # type: ignore[arg-type]  # as if our reply was lost
        assert tables.marker_exists(conn, m0.gid)  # type: ignore[arg-type]
    w.commit([m0, m1], 1)  # m0 is 42704 now: proven committed by its marker
    assert _rows(sink) == list(range(6))

    def unreachable() -> psycopg.Connection:
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(CommitUnknown) as err:
        commit_prepared(unreachable, tables, m1.gid, attempts=2, backoff=0.01)  # type: ignore[arg-type]
    assert "nothing was guessed" in str(err.value)

    # a decided gid rolled back by hand is provably lost: a loud FatalError, not a silent success
    m2 = _task(sink, w, 0, range(10, 12), batch=2)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        with conn.transaction():
            tables.insert_decision(conn, sink["sink_id"], 2, [m2.gid], 2, "query:q1", stage=w.plan.stage_token)  # type: ignore[list-item]
        conn.execute(f"ROLLBACK PREPARED '{m2.gid}'")  # type: ignore[arg-type]
    with pytest.raises(FatalError, match="rolled back outside the protocol"):
        w.commit([m2], 2)


def test_commit_refuses_to_decide_a_vanished_gid_and_abort_respects_decisions(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    m0 = _task(sink, w, 0, range(0, 3), batch=4)
    m1 = _task(sink, w, 1, range(3, 6), batch=4)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"ROLLBACK PREPARED '{m1.gid}'")  # type: ignore[arg-type]
    with pytest.raises(RetriableError, match="vanished before the decision"):
        w.commit([m0, m1], 4)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        assert ProtocolTables().decision(conn, sink["sink_id"], 4) is None
    w.abort([m0, None], 4)  # a failed task's message is None: abort rolls back by batch
    assert _prepared(sink) == [] and _rows(sink) == []

    # abort after a decision (Spark aborts when commit() failed late) must keep the decided gids
    m2 = _task(sink, w, 0, range(6, 9), batch=5)
    faults_opts = dict(sink["opts"], faults="sink.commit.after_decision:batch=5:action=raise")
    failing = TwoPhaseStreamWriter(faults_opts, SCHEMA)
    with pytest.raises(Exception, match="fault injected"):
        failing.commit([m2], 5)
    failing.abort([m2], 5)
    assert _prepared(sink) == [m2.gid]
    w.commit([m2], 5)  # the replay's commit rolls the decision forward
    assert _rows(sink) == [6, 7, 8] and _prepared(sink) == []


def test_two_queries_cannot_share_a_sink_id(sink: dict[str, Any]) -> None:
    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    w.commit([_task(sink, w, 0, range(0, 2), batch=0, query="query-A")], 0)
    other = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    with pytest.raises(FatalError, match="belongs to query:query-A") as err:
        _task(sink, other, 0, range(2, 4), batch=0, query="query-B")
    assert "sink.id" in str(err.value)
    assert _rows(sink) == [0, 1]


def test_batch_write_with_batch_id_is_a_no_op_when_repeated(sink: dict[str, Any]) -> None:
    opts = {k: v for k, v in sink["opts"].items() if k != "checkpointLocation"}  # a batch job: no checkpoint
    opts["batch.id"] = "7"
    for _ in range(2):
        w = TwoPhaseBatchWriter(opts, SCHEMA)
        msgs = [_task(sink, w, p, range(p * 4, p * 4 + 4), batch=-1, query="") for p in (0, 1)]
        w.commit(msgs)
    assert _rows(sink) == list(range(8))
    with pytest.raises(ConfigError, match=r"batch\.id"):
        TwoPhaseBatchWriter({k: v for k, v in opts.items() if k != "batch.id"}, SCHEMA)


def test_old_prepared_transactions_are_logged(sink: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    w = TwoPhaseStreamWriter(dict(sink["opts"], **{"prepared.warn.age": "0s"}), SCHEMA)
    straggler = _task(sink, w, 0, range(0, 2), batch=9)  # a sibling that stays prepared past the commit
    m = _task(sink, w, 1, range(2, 4), batch=8)
    with caplog.at_level(logging.WARNING, logger="sinks.postgres.twophase.recovery"):
        w.commit([m], 8)
    assert any(straggler.gid in r.getMessage() and "block VACUUM" in r.getMessage() for r in caplog.records)
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        actions = resolve(conn, ProtocolTables(), sink["sink_id"], dry_run=True)
        assert [(a.gid, a.action) for a in actions] == [(straggler.gid, "rollback")]


def test_refuses_to_start_without_prepared_transactions_or_with_too_few(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    pg = start_cluster(max_prepared_transactions="0")
    try:
        checkpoint = str(tmp_path / "checkpoint")
        plan(checkpoint, 0)
        opts = {"dsn": pg.dsn, "table": "t", "table.create": "true", "sink.id": "s", "checkpointLocation": checkpoint}
        with pytest.raises(ConfigError) as err:
            TwoPhaseStreamWriter(opts, SCHEMA)
        text = str(err.value)
        assert "max_prepared_transactions = 0" in text and "max_prepared_transactions=64" in text
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            assert list(conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't'").fetchone()) == [0]  # type: ignore[arg-type]
        # one slot, two concurrent writer tasks: the second PREPARE is refused with the fix
        pg.crash()
        pg.settings["max_prepared_transactions"] = "1"
        pg.start()
        with pytest.raises(ConfigError, match="2 writer tasks would prepare concurrently"):
            from sinks.postgres.twophase.decisions import check_max_prepared

            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                check_max_prepared(conn, writers=2)  # what twopc_batch checks with the DataFrame's partitions
        ctx = {"v": (0, 0, 0, 0, "q", "r")}
        monkeypatch.setattr(twophase_writer, "_task_context", lambda: TaskIdentity(*ctx["v"]))
        w = TwoPhaseStreamWriter(opts, SCHEMA)
        w.write(iter([_batch(range(0, 2))]))
        ctx["v"] = (1, 0, 1, 0, "q", "r")
        with pytest.raises(ConfigError) as err:
            w.write(iter([_batch(range(2, 4))]))
        assert "max_prepared_transactions" in str(err.value) and "fewer partitions" in str(err.value)
    finally:
        pg.stop()
        shutil.rmtree(os.path.dirname(pg.data), ignore_errors=True)


def test_missing_sink_id_is_refused(sink: dict[str, Any]) -> None:
    opts = {k: v for k, v in sink["opts"].items() if k != "sink.id"}
    with pytest.raises(ConfigError, match=r"'sink\.id' is required"):
        TwoPhaseStreamWriter(opts, SCHEMA)


def test_protocol_schema_on_the_roles_search_path_is_refused_for_unqualified_tables(
    sink: dict[str, Any], twophase_pg: Any
) -> None:
    """A role named like ``eos.schema`` has that schema first on its search path ("$user"): its own
    unqualified DDL would land there and the sink would resolve the table there, away from the rows
    it wrote before (the demo lost a batch this way on 2026-11-23 with the role ``eos``)."""
    role = "r_" + uuid.uuid4().hex[:8]
    # a role that may make its protocol schema (CREATE on the database) and write the app's table, nothing more
    made = twophase_pg.add_role(
        role,
        [PgGrant("database", None, op) for op in ("CONNECT", "CREATE", "TEMPORARY")]
        + [PgGrant("schema", "public", "USAGE")],
    )
    with psycopg.connect(sink["dsn"], autocommit=True) as conn:
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {sink['table']} TO {role}")  # type: ignore[arg-type]
    dsn = made.dsn
    opts = {**sink["opts"], "dsn": dsn, "eos.schema": role}
    with pytest.raises(ConfigError) as err:
        TwoPhaseStreamWriter(opts, SCHEMA)
    msg = str(err.value)
    assert err.value.option == "eos.schema"
    assert f"protocol schema '{role}'" in msg and f"role '{role}'" in msg and f"public.{sink['table']}" in msg
    # qualified, the table cannot be shadowed: the sink writes and commits as usual
    w = TwoPhaseStreamWriter({**opts, "table": f"public.{sink['table']}"}, SCHEMA)
    m = _task(sink, w, 0, range(0, 3), batch=0)
    TwoPhaseStreamWriter({**opts, "table": f"public.{sink['table']}"}, SCHEMA).commit([m], 0)
    assert _rows(sink) == [0, 1, 2]


def test_append_table_missing_is_refused_or_created_without_a_key(twophase_pg: Any) -> None:
    """Append mode has no key: a missing table is refused with the fix (no key to ask for), and
    ``table.create`` makes it (schema too) without a primary key."""
    suffix = uuid.uuid4().hex[:8]
    table = f"app_{suffix}.log_{suffix}"
    opts = {
        "dsn": twophase_pg.dsn,
        "table": table,
        "sink.id": f"s-{suffix}",
        "checkpointLocation": _planned_checkpoint(),
    }
    with pytest.raises(ConfigError) as err:
        TwoPhaseStreamWriter(opts, SCHEMA)
    assert f"table {table} does not exist; create it or set option table.create=true" in str(err.value)
    TwoPhaseStreamWriter({**opts, "table.create": "true"}, SCHEMA)
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        cols = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (f"app_{suffix}", f"log_{suffix}"),
        ).fetchall()
        keys = conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass", (table,)).fetchone()
    assert [c[0] for c in cols] == [f.name for f in SCHEMA.fields] and all(c[2] == "YES" for c in cols)
    assert keys == (0,)


def test_setups_starting_at_once_create_every_table_without_racing(twophase_pg: Any) -> None:
    """Queries (or replicas of one job) starting together all create the protocol, target,
    staging and tombstone tables. CREATE ... IF NOT EXISTS is not safe against itself in Postgres:
    unserialised, all but one session fail with a unique violation on pg_type (the crash
    matrix's F16 twins hit this in CI on 2026-11-23)."""
    suffix = uuid.uuid4().hex[:8]
    table, eos_schema = f"race_{suffix}", f"eos_{suffix}"
    schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("ver", LongType(), False),
            StructField("gone", BooleanType(), True),
        ]
    )
    upsert = {"mode": "upsert", "key": "id", "version": "ver", "delete.column": "gone"}
    base = {
        "dsn": twophase_pg.dsn,
        "table": table,
        "table.create": "true",
        "eos.schema": eos_schema,
        "checkpointLocation": _planned_checkpoint(),
        **upsert,
    }
    n = 6
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def setup(i: int) -> None:
        barrier.wait(30)
        try:  # two sink ids, so threads race on a shared staging table as well as on the target's
            TwoPhaseStreamWriter({**base, "sink.id": f"s{i % 2}-{suffix}"}, schema)
        except BaseException as exc:  # collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=setup, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        made = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname = %s OR tablename LIKE %s",
            (eos_schema, f"{table}%"),
        ).fetchall()
    names = sorted(t for _, t in made)
    assert table in names and {"sink_batches", "sink_parts", "sink_owners"} <= set(names)
    assert not any(n.startswith("stage_") for n in names), names  # tasks stage in tables of their own
    assert len(names) == 5, names  # target, three protocol tables, the tombstone table


def test_status_and_recover_commands(sink: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.commands import sinks as sinks_command
    from sinks.postgres import status

    w = TwoPhaseStreamWriter(sink["opts"], SCHEMA)
    undecided = _task(sink, w, 1, range(3, 6), batch=1)  # (a later task would roll a decided gid forward)
    decided = _task(sink, w, 0, range(0, 3), batch=0)
    failing = TwoPhaseStreamWriter(dict(sink["opts"], faults="sink.commit.after_decision:batch=0:action=raise"), SCHEMA)
    with pytest.raises(Exception, match="fault injected"):
        failing.commit([decided], 0)
    base = ["--dsn", sink["dsn"], "--sink-id", sink["sink_id"]]
    assert sinks_command.main(["status", *base]) == 0
    out = capsys.readouterr().out
    assert "last decided batch 0" in out and "owner query:q1" in out
    assert f"commit  {decided.gid}" in out and f"rollback  {undecided.gid}" in out
    assert sinks_command.main(["recover", *base]) == 0  # dry run
    assert "would do" in capsys.readouterr().out and len(_prepared(sink)) == 2
    assert sinks_command.main(["recover", *base, "--apply"]) == 0
    assert _prepared(sink) == []
    info = status.sink_status(sink["dsn"], sink["sink_id"])
    assert info["in_doubt"] == [] and info["decisions"][0]["published"] is False  # the replay publishes it
    w.commit([decided], 0)  # Spark's replay of batch 0 after the restart
    assert _rows(sink) == [0, 1, 2]
    assert sinks_command.main(["release", *base]) == 2  # needs --yes
    assert sinks_command.main(["release", *base, "--yes"]) == 0
    # released: nothing of the sink is left (owner, decisions, markers), so its id is unknown, as a misspelled one
    with pytest.raises(ConfigError, match=f"no sink '{sink['sink_id']}' in this database"):
        status.sink_status(sink["dsn"], sink["sink_id"])
    assert sinks_command.main(["status", *base]) == 64
