"""The ``spark-eos sinks`` operator commands against a real Postgres (issue 27, items 2, 5, 9, 10).

- ``status``, ``release`` and ``recover`` never create or drop anything; ``recover --apply`` pointed
  at a schema that does not know the sink (the default or a mistyped ``--eos-schema``) refuses and
  names the right one, instead of rolling back decided batches.
- ``resolve-lost`` gets past a decided batch whose staged rows are gone (take it back, or finish it).
- ``retire`` ends a sink id: rolls back its undecided prepared transactions, forgets its decisions.
- ``prune`` forgets old published decisions of batch jobs, never an unpublished one nor what a
  checkpoint may replay.
- ``replay-errors`` honours tombstones and the version column, and without a version column never
  overwrites a row of the target unless ``--force``.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from connectors.cli import main as cli
from eos_core.errors import FatalError
from integration import test_twophase_support as support
from integration.test_twophase_protocol import SCHEMA, plan
from sinks.postgres.twophase import TwoPhaseBatchWriter, TwoPhaseMessage, TwoPhaseStreamWriter
from sinks.postgres.twophase import writer as twophase_writer
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared
from sinks.postgres.twophase.plan import _prefix, task_table
from sinks.postgres.twophase.writer import TaskIdentity

twophase_pg = support.twophase_pg
__all__ = ["twophase_pg"]

pytestmark = pytest.mark.integration


class Sink:
    """One postgres-2pc sink in a protocol schema of its own, driven task by task."""

    def __init__(self, dsn: str, root: Path, state: dict[str, Any], **options: Any) -> None:
        self.dsn = dsn
        self.tag = uuid.uuid4().hex[:8]
        self.schema = "eos_op_" + self.tag
        self.sink_id = f"ops: {self.tag}"
        self.table = f"public.op_{self.tag}"
        self.state = state
        self.checkpoint = str(root / f"ckpt_{self.tag}")
        plan(self.checkpoint, 0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, name text)")  # type: ignore[arg-type]
        self.opts = {
            "dsn": dsn,
            "table": self.table,
            "sink.id": self.sink_id,
            "checkpointLocation": self.checkpoint,
            "eos.schema": self.schema,
            **options,
        }

    def writer(self, **options: Any) -> TwoPhaseStreamWriter:
        return TwoPhaseStreamWriter(dict(self.opts, **options), SCHEMA)

    def task(self, w: Any, partition: int, batch: int, ids: range) -> TwoPhaseMessage:
        self.state["ctx"] = (partition, 0, batch * 10 + partition, batch, "q-" + self.tag, "run1")
        plan(self.checkpoint, batch)
        data = pa.RecordBatch.from_pydict(
            {"id": pa.array(list(ids), pa.int64()), "name": pa.array([f"n{i}" for i in ids], pa.string())}
        )
        msg = w.write(iter([data]))
        assert isinstance(msg, TwoPhaseMessage)
        return msg

    def tasks(self, w: Any, batch: int) -> list[TwoPhaseMessage]:
        return [
            self.task(w, 0, batch, range(batch * 10, batch * 10 + 3)),
            self.task(w, 1, batch, range(batch * 10 + 3, batch * 10 + 6)),
        ]

    def rows(self) -> list[int]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return [r[0] for r in conn.execute(f"SELECT id FROM {self.table} ORDER BY id").fetchall()]  # type: ignore[arg-type]

    def prepared(self) -> list[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return sorted(str(p.gid) for p in list_prepared(conn, self.sink_id))

    def decisions(self) -> list[tuple[int, bool]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return [(d.batch_id, d.published) for d in reversed(ProtocolTables(self.schema).recent(conn, self.sink_id))]

    def decision(self, batch: int) -> Any:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return ProtocolTables(self.schema).decision(conn, self.sink_id, batch)

    def sinks(self, *args: str, schema: str | None = None) -> tuple[int, str, str]:
        """``spark-eos sinks <args> --dsn .. --sink-id .. --eos-schema ..``: exit code, stdout, stderr."""
        out, err = io.StringIO(), io.StringIO()
        argv = ["sinks", args[0], "--dsn", self.dsn, "--sink-id", self.sink_id, "--eos-schema", schema or self.schema]
        with redirect_stdout(out), redirect_stderr(err):
            rc = cli([*argv, *args[1:]])
        return rc, out.getvalue(), err.getvalue()


def _schema_exists(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return bool(row and row[0])


@pytest.fixture
def new_sink(twophase_pg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    state: dict[str, Any] = {"ctx": (0, 0, 0, None, "q", "run1")}
    monkeypatch.setattr(twophase_writer, "_task_context", lambda: TaskIdentity(*state["ctx"]))
    made: list[Sink] = []

    def make(**options: Any) -> Sink:
        made.append(Sink(twophase_pg.dsn, tmp_path, state, **options))
        return made[-1]

    yield make
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:  # leave no prepared transaction behind
        for s in made:
            for p in list_prepared(conn, s.sink_id):
                conn.execute(f"ROLLBACK PREPARED '{p.gid}'")  # type: ignore[arg-type]


def _decided_and_undecided(sink: Sink) -> tuple[TwoPhaseMessage, TwoPhaseMessage]:
    """Batch 0 decided with its transaction still prepared (the driver died after the decision), and
    an undecided transaction of batch 1 (a dead attempt)."""
    w = sink.writer()
    undecided = sink.task(w, 1, 1, range(10, 13))
    decided = sink.task(w, 0, 0, range(0, 3))
    with pytest.raises(Exception, match="fault injected"):
        sink.writer(faults="sink.commit.after_decision:batch=0:action=raise").commit([decided], 0)  # type: ignore[list-item]
    assert sink.prepared() == sorted([str(decided.gid), str(undecided.gid)])
    return decided, undecided


# ---------------------------------------------------------------------------------------------
# item 2: no DDL from operator commands; recover refuses a schema that does not know the sink


def test_status_release_and_recover_create_nothing_and_name_the_sinks_schema(new_sink: Any) -> None:
    sink = new_sink()
    decided, undecided = _decided_and_undecided(sink)
    missing = "eos_typo_" + sink.tag
    for args in (("status",), ("status", "--json"), ("recover",), ("recover", "--apply"), ("release", "--yes")):
        rc, out, err = sink.sinks(*args, schema=missing)
        assert rc == 2 and out == "", (args, out, err)
        assert err.count("\n") == 1 and f"schema {missing!r} (--eos-schema) has no spark-eos protocol tables" in err
        assert f"are in schema {sink.schema!r}: pass --eos-schema {sink.schema}" in err and "Nothing was changed" in err
        assert not _schema_exists(sink.dsn, missing), args  # no DDL from a read or a refused command
    assert sink.prepared() == sorted([str(decided.gid), str(undecided.gid)])  # nothing rolled back
    assert sink.decisions() == [(0, False)]


def test_recover_apply_refuses_a_schema_that_knows_other_sinks_only(new_sink: Any) -> None:
    sink, other = new_sink(), new_sink()
    other.writer().commit(other.tasks(other.writer(), 0), 0)  # type: ignore[arg-type]  # other's schema: tables, decisions
    decided, undecided = _decided_and_undecided(sink)
    for args in (("recover", "--apply"), ("recover",), ("recover", "--apply", "--never-decided")):
        rc, out, err = sink.sinks(*args, schema=other.schema)
        assert rc == 2 and out == "", (args, out, err)
        assert f"schema {other.schema!r} (--eos-schema) knows nothing of sink {sink.sink_id!r}" in err
        assert f"pass --eos-schema {sink.schema}" in err and "Nothing was changed" in err
    assert sink.prepared() == sorted([str(decided.gid), str(undecided.gid)])
    # status there shows it too, read-only, and says where the sink is
    rc, out, _ = sink.sinks("status", schema=other.schema)
    assert rc == 0 and f"knows nothing of this sink; the decisions of sink {sink.sink_id!r} are in schema" in out
    # the right schema: the decided gid is committed, the undecided one rolled back
    rc, out, err = sink.sinks("recover", "--apply")
    assert rc == 0, err
    assert f"commit {decided.gid}" in " ".join(out.split()) and f"rollback {undecided.gid}" in " ".join(out.split())
    assert sink.prepared() == []
    sink.writer().commit([decided], 0)  # type: ignore[list-item]  # the replay publishes it
    assert sink.rows() == [0, 1, 2]


def test_recover_of_a_sink_no_schema_knows_needs_never_decided(new_sink: Any) -> None:
    """A sink whose first batch crashed after PREPARE, before any decision: no schema can know it."""
    sink = new_sink()
    sink.writer().commit(sink.tasks(sink.writer(), 0), 0)  # type: ignore[arg-type]  # the schema exists
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        ProtocolTables(sink.schema).release(conn, sink.sink_id)  # as if the id had never run here
    first = sink.tasks(sink.writer(), 1)
    rc, _, err = sink.sinks("recover", "--apply")
    assert rc == 2 and "no schema of this database knows sink" in err and "--never-decided rolls them back" in err
    assert sink.prepared() == sorted(str(m.gid) for m in first)
    rc, out, err = sink.sinks("recover", "--apply", "--never-decided")
    assert rc == 0 and out.count("rollback") == 2, (out, err)
    assert sink.prepared() == []


# ---------------------------------------------------------------------------------------------
# item 9: a decided batch whose staged rows are gone


def _stuck(sink: Sink, batch: int = 0) -> list[TwoPhaseMessage]:
    """Batch ``batch`` decided and committed, stopped before its publish: rows wait in staging."""
    msgs = sink.tasks(sink.writer(), batch)
    with pytest.raises(Exception, match="fault injected"):
        sink.writer(faults=f"sink.commit.after_k:batch={batch}:k=2:action=raise").commit(msgs, batch)  # type: ignore[arg-type]
    assert sink.decision(batch) is not None and not sink.decision(batch).published and sink.prepared() == []
    return msgs


def _drop_staging(sink: Sink, msgs: list[TwoPhaseMessage]) -> None:
    token = sink.decision(msgs[0].batch_id).stage
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        for m in msgs:
            conn.execute(f"DROP TABLE {task_table(_prefix(token), str(m.gid)).sql}".encode())


def test_resolve_lost_takes_back_a_batch_whose_staging_is_gone_and_the_replay_writes_it(new_sink: Any) -> None:
    sink = new_sink()
    sink.writer().commit(sink.tasks(sink.writer(), 0), 0)  # type: ignore[arg-type]
    msgs = _stuck(sink, 1)
    # while its staged rows are there, nothing is lost: refused, nothing changed
    rc, _, err = sink.sinks("resolve-lost", "--batch", "1", "--take-back", "--yes")
    assert rc == 2 and "nothing of it is lost" in err and "Nothing was changed" in err
    assert sink.decisions() == [(0, True), (1, False)]
    _drop_staging(sink, msgs[:1])  # one task's staging table dropped by hand
    with pytest.raises(FatalError, match=r"staged rows of 1 of its 2 transactions are gone.*sinks resolve-lost"):
        sink.writer().commit(msgs, 1)  # type: ignore[arg-type]  # the replay cannot publish it, and says why
    rc, _, err = sink.sinks("release", "--yes")
    assert rc == 2 and "not published yet (1)" in err
    rc, _, err = sink.sinks("resolve-lost", "--batch", "1", "--finish", "--yes")
    assert rc == 2 and "1 of its transactions still have their staged rows" in err  # would leave them behind
    rc, _, err = sink.sinks("resolve-lost", "--batch", "1", "--take-back")
    assert rc == 2 and "1 of 2 transaction(s) of batch 1 lost (3 row(s))" in err and "Repeat with --yes" in err
    assert sink.decisions() == [(0, True), (1, False)]
    rc, out, err = sink.sinks("resolve-lost", "--batch", "1", "--take-back", "--yes")
    assert rc == 0 and "taken back" in out, err
    assert sink.decisions() == [(0, True)]
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'stage%%'", (sink.schema,)
        ).fetchone()
        markers = conn.execute(
            f"SELECT count(*) FROM {sink.schema}.sink_parts WHERE sink_id = %s AND batch_id = 1",  # type: ignore[arg-type]
            (sink.sink_id,),
        ).fetchone()
    assert left == (0,) and markers == (0,)  # the other task's staged rows and the markers went with it
    # the query's restart replays batch 1 (Spark never wrote commits/1): written anew, once
    again = sink.tasks(sink.writer(), 1)
    assert all(m.gid for m in again)
    sink.writer().commit(again, 1)  # type: ignore[arg-type]
    assert sink.rows() == [*range(6), *range(10, 16)] and sink.decisions() == [(0, True), (1, True)]


def test_resolve_lost_finishes_a_batch_whose_staging_is_gone_and_the_sink_moves_on(new_sink: Any) -> None:
    sink = new_sink()
    msgs = _stuck(sink, 0)
    _drop_staging(sink, msgs)
    rc, out, err = sink.sinks("resolve-lost", "--batch", "0", "--finish", "--yes")
    assert rc == 0 and "2 of 2 transaction(s) of batch 0 lost (6 row(s))" in out and "finished" in out, err
    assert sink.decisions() == [(0, True)]
    sink.writer().commit(msgs, 0)  # type: ignore[arg-type]  # the replay of batch 0: nothing left to do
    sink.writer().commit(sink.tasks(sink.writer(), 1), 1)  # type: ignore[arg-type]
    assert sink.rows() == list(range(10, 16))  # batch 0's rows are lost, as the operator accepted
    rc, _, err = sink.sinks("release", "--yes")
    assert rc == 0, err


def test_resolve_lost_of_a_partition_batch_with_a_transaction_rolled_back_by_hand(new_sink: Any) -> None:
    sink = new_sink(visibility="partition")
    msgs = sink.tasks(sink.writer(), 0)
    with pytest.raises(Exception, match="fault injected"):
        sink.writer(faults="sink.commit.after_k:batch=0:k=1:action=raise").commit(msgs, 0)  # type: ignore[arg-type]
    decided = sink.decision(0).gids
    committed, rolled = [g for g in decided if g not in sink.prepared()], [g for g in decided if g in sink.prepared()]
    assert len(committed) == 1 and len(rolled) == 1
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        conn.execute(f"ROLLBACK PREPARED '{rolled[0]}'")  # type: ignore[arg-type]  # by hand: its rows are lost
    with pytest.raises(FatalError, match="rolled back outside the protocol"):
        sink.writer().commit(msgs, 0)  # type: ignore[arg-type]
    rc, _, err = sink.sinks("resolve-lost", "--batch", "0", "--take-back", "--yes")
    assert rc == 2 and "their rows are in the table already; it cannot be taken back" in err
    rc, out, err = sink.sinks("resolve-lost", "--batch", "0", "--finish", "--yes")
    assert rc == 0 and "1 of 2 transaction(s) of batch 0 lost" in out, err
    sink.writer().commit(msgs, 0)  # type: ignore[arg-type]  # the replay passes now
    sink.writer().commit(sink.tasks(sink.writer(), 1), 1)  # type: ignore[arg-type]
    kept = next(m for m in msgs if m.gid in committed)
    assert sink.rows() == [*(range(0, 3) if kept.partition == 0 else range(3, 6)), *range(10, 16)]


# ---------------------------------------------------------------------------------------------
# item 10: retire a sink id; prune the decisions of batch jobs


def test_retire_rolls_back_undecided_forgets_the_sink_and_refuses_an_unpublished_batch(new_sink: Any) -> None:
    sink = new_sink()
    sink.writer().commit(sink.tasks(sink.writer(), 0), 0)  # type: ignore[arg-type]
    msgs = _stuck(sink, 1)
    dead = sink.tasks(sink.writer(), 2)  # a dead attempt of batch 2, never decided
    rc, _, err = sink.sinks("retire", "--yes")
    assert rc == 2 and "not published yet (1)" in err and "Nothing was changed" in err
    assert sink.prepared() == sorted(str(m.gid) for m in dead) and sink.decisions() == [(0, True), (1, False)]
    sink.writer().commit(msgs, 1)  # type: ignore[arg-type]  # published by the query's last run
    dead = sink.tasks(sink.writer(), 2)
    rc, _, _ = sink.sinks("retire")
    assert rc == 2 and sink.prepared()  # needs --yes
    rc, out, err = sink.sinks("retire", "--yes")
    assert rc == 0 and "2 prepared transaction(s) rolled back" in out, err
    assert sink.prepared() == [] and sink.decisions() == []
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        for table in ("sink_parts", "sink_owners"):
            row = conn.execute(
                f"SELECT count(*) FROM {sink.schema}.{table} WHERE sink_id = %s", (sink.sink_id,)
            ).fetchone()  # type: ignore[arg-type]
            assert row == (0,), table
        stages = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'stage%%'", (sink.schema,)
        ).fetchone()
    assert stages == (0,)
    assert sink.rows() == [*range(6), *range(10, 16)]  # the table is not touched
    rc, _, err = sink.sinks("retire", "--yes")
    assert rc == 2 and "nothing to retire" in err


def _job(sink: Sink, batch_id: int, ids: range, **options: str) -> tuple[TwoPhaseBatchWriter, TwoPhaseMessage]:
    """A batch job's write (``batch.id``, no checkpoint, no query): its one task."""
    opts = {k: v for k, v in sink.opts.items() if k != "checkpointLocation"}
    w = TwoPhaseBatchWriter(dict(opts, **{"batch.id": str(batch_id)}, **options), SCHEMA)
    sink.state["ctx"] = (0, 0, batch_id, None, None, None)
    data = pa.RecordBatch.from_pydict(
        {"id": pa.array(list(ids), pa.int64()), "name": pa.array([f"n{i}" for i in ids], pa.string())}
    )
    msg = w.write(iter([data]))
    assert isinstance(msg, TwoPhaseMessage)
    return w, msg


def test_prune_keeps_the_newest_unpublished_and_what_a_checkpoint_may_replay(new_sink: Any, tmp_path: Path) -> None:
    sink = new_sink()
    for b in range(6):  # batch jobs (batch.id): nothing prunes their decisions by itself
        w, msg = _job(sink, 100 + b, range(b * 10, b * 10 + 2))
        w.commit([msg])
    w, msg = _job(sink, 99, range(90, 92), faults="sink.commit.after_k:k=1:action=raise")
    with pytest.raises(Exception, match="fault injected"):
        w.commit([msg])  # decided, never published
    assert sink.decisions() == [(99, False), *((100 + b, True) for b in range(6))]
    rc, _, _ = sink.sinks("prune", "--keep", "2")
    assert rc == 2 and len(sink.decisions()) == 7  # needs --yes
    rc, out, err = sink.sinks("prune", "--keep", "2", "--yes")
    assert rc == 0 and "4 decision(s) and 4 marker(s) removed" in out, err
    assert sink.decisions() == [(99, False), (104, True), (105, True)]  # the unpublished one stays
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        markers = conn.execute(
            f"SELECT batch_id FROM {sink.schema}.sink_parts WHERE sink_id = %s ORDER BY 1",  # type: ignore[arg-type]
            (sink.sink_id,),
        ).fetchall()
    assert [m[0] for m in markers] == [99, 104, 105]
    w, again = _job(sink, 105, range(500, 502))  # a kept batch id run again is still a no-op
    assert again.skipped
    w.commit([again])
    assert 500 not in sink.rows()
    # with the query's checkpoint: nothing from its last commits/n on goes, whatever --keep says
    checkpoint = tmp_path / "query"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "104").write_text("v1\n{}\n")
    rc, out, err = sink.sinks("prune", "--keep", "1", "--checkpoint", str(checkpoint), "--yes")
    assert rc == 0 and "0 decision(s)" in out, err
    assert sink.decisions() == [(99, False), (104, True), (105, True)]
    rc, _, err = sink.sinks("prune", "--keep", "0", "--yes")
    assert rc == 64 and "--keep must be at least 1" in err  # a bad argument


# ---------------------------------------------------------------------------------------------
# item 5: replay-errors honours tombstones and the version column

VERSIONED = StructType(
    [
        StructField("id", LongType(), False),
        StructField("code", StringType(), True),
        StructField("ver", LongType(), False),
        StructField("gone", BooleanType(), False),
    ]
)


def _upsert_sink(new_sink: Any, version: bool) -> tuple[Sink, dict[str, Any]]:
    sink = new_sink()
    table = sink.table + "_u"
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, code varchar(4), ver bigint)")  # type: ignore[arg-type]
    opts = dict(
        sink.opts,
        table=table,
        mode="upsert",
        key="id",
        **{"delete.column": "gone", "errors.tolerance": "all", "errors.table": table + "_refused"},
    )
    if version:
        opts["version"] = "ver"
    return sink, opts


def _write(sink: Sink, opts: dict[str, Any], batch: int, rows: list[tuple[int, str, int, bool]]) -> None:
    w = TwoPhaseStreamWriter(opts, VERSIONED)
    data = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "code": pa.array([r[1] for r in rows], pa.string()),
            "ver": pa.array([r[2] for r in rows], pa.int64()),
            "gone": pa.array([r[3] for r in rows], pa.bool_()),
        }
    )
    sink.state["ctx"] = (0, 0, batch * 10, batch, "q-" + sink.tag, "run1")
    plan(sink.checkpoint, batch)
    msg = w.write(iter([data]))
    TwoPhaseStreamWriter(opts, VERSIONED).commit([msg], batch)


def _target(sink: Sink, opts: dict[str, Any]) -> list[tuple[Any, ...]]:
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT id, code, ver FROM {opts['table']} ORDER BY id").fetchall()  # type: ignore[arg-type]


def _letters(sink: Sink, opts: dict[str, Any]) -> list[tuple[Any, ...]]:
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        return conn.execute(
            f"SELECT (row->>'id')::int, replay_error FROM {opts['errors.table']} ORDER BY 1"  # type: ignore[arg-type]
        ).fetchall()


def _replay(sink: Sink, opts: dict[str, Any], *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    args = ["sinks", "replay-errors", "--dsn", sink.dsn, "--errors-table", opts["errors.table"]]
    with redirect_stdout(out):
        rc = cli([*args, "--target", opts["table"], *extra])
    return rc, out.getvalue()


def test_replay_errors_honours_tombstones_and_versions(new_sink: Any) -> None:
    sink, opts = _upsert_sink(new_sink, version=True)
    # batch 0: three rows refused (code too long for varchar(4)); batch 1: key 1 deleted at version 2,
    # key 2 rewritten at version 3; key 3 untouched since
    _write(sink, opts, 0, [(1, "long1", 1, False), (2, "long2", 1, False), (3, "long3", 1, False), (4, "ok", 1, False)])
    _write(sink, opts, 1, [(1, "x", 2, True), (2, "new", 3, False)])
    assert [r[0] for r in _letters(sink, opts)] == [1, 2, 3]
    assert _target(sink, opts) == [(2, "new", 3), (4, "ok", 1)]
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {opts['table']} ALTER code TYPE text")  # type: ignore[arg-type]  # the fix
    rc, out = _replay(sink, opts)
    # key 1 stays deleted (its tombstone is newer), key 2 keeps version 3, key 3 comes in
    assert _target(sink, opts) == [(2, "new", 3), (3, "long3", 1), (4, "ok", 1)]
    assert rc == 0 and "3 row(s) moved" in out and "2 of them superseded" in out, out
    assert _letters(sink, opts) == []


def test_replay_errors_without_a_version_never_overwrites_unless_forced(new_sink: Any) -> None:
    sink, opts = _upsert_sink(new_sink, version=False)
    _write(sink, opts, 0, [(1, "long1", 0, False), (2, "long2", 0, False), (5, "long5", 0, False)])
    _write(sink, opts, 1, [(1, "new", 0, False)])  # key 1 written again since (newer, or not: nothing says)
    with psycopg.connect(sink.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {opts['table']} ALTER code TYPE text")  # type: ignore[arg-type]
    rc, out = _replay(sink, opts, "--batch", "0")
    assert _target(sink, opts) == [(1, "new", 0), (2, "long2", 0), (5, "long5", 0)]
    assert rc == 1 and "2 row(s) moved" in out and "1 kept unwritten" in out, out
    [(key, why)] = _letters(sink, opts)
    assert key == 1 and "no version column" in why and "--force" in why
    rc, out = _replay(sink, opts, "--force")
    assert rc == 0 and "1 row(s) moved" in out, out
    assert _target(sink, opts) == [(1, "long1", 0), (2, "long2", 0), (5, "long5", 0)] and _letters(sink, opts) == []


def test_status_reports_the_exact_gid_prefix(new_sink: Any) -> None:
    sink = new_sink()
    sink.writer().commit(sink.tasks(sink.writer(), 0), 0)  # type: ignore[arg-type]
    rc, out, _ = sink.sinks("status", "--json")
    info = json.loads(out)
    assert rc == 0 and info["gid_prefix"] == f"eos:ops%3A%20{sink.tag}:" and info["known"] is True
