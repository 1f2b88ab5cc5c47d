"""Sink identity is exact: sink ids that are prefixes of each other, or full of ``: % _ ' "`` and
non-ASCII, written concurrently into one database and one protocol schema.

Each sink's commit cleans up staging tables and prepared transactions of its own sink id only; the
checker, ``inspect``, ``sinks recover`` and the SQL recipe of docs/postgres-2pc.md count exactly the
prepared transactions of the sink they are given (issue 27, items 1 and 6).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from connectors import inspect as eos_inspect
from connectors.commands import sinks as sinks_command
from connectors.toolkit import checker
from integration import test_twophase_support as support
from integration.test_twophase_protocol import SCHEMA, plan
from sinks.postgres import status
from sinks.postgres.twophase import TwoPhaseMessage, TwoPhaseStreamWriter
from sinks.postgres.twophase import writer as twophase_writer
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared
from sinks.postgres.twophase.writer import TaskIdentity

twophase_pg = support.twophase_pg
__all__ = ["twophase_pg"]

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[1] / "docs" / "postgres-2pc.md"

# Prefixes of each other ("orders" / "orders: eu" / ...); LIKE wildcards ("ord_rs" matches
# "orders"); an escape's own text ("50%" is "50%25" in a gid, the id "50%25" is "50%2525");
# quotes and non-ASCII.
IDS = ["orders", "orders: eu", "orders: eu: 50%_'\"ü日本", "ord_rs", "50%", "50%25"]
BATCHES = 4  # 0 is decided and left unpublished while the others run; 1..3 run concurrently
ROWS = 6  # per batch, over two tasks


class Sinks:
    """Every sink of IDS with its own table and checkpoint, in one protocol schema."""

    def __init__(self, dsn: str, root: Path) -> None:
        self.dsn = dsn
        self.schema = "eos_id_" + uuid.uuid4().hex[:8]
        self.local = threading.local()
        self.opts: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, str] = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i, sink_id in enumerate(IDS):
                table = f"public.ident_{self.schema[7:]}_{i}"
                conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text)")  # type: ignore[arg-type]
                checkpoint = str(root / f"ckpt{i}")
                plan(checkpoint, 0)
                self.tables[sink_id] = table
                self.opts[sink_id] = {
                    "dsn": dsn,
                    "table": table,
                    "sink.id": sink_id,
                    "checkpointLocation": checkpoint,
                    "eos.schema": self.schema,
                }

    def ids(self, sink_id: str, batch: int) -> range:
        base = (IDS.index(sink_id) * 100 + batch) * ROWS
        return range(base, base + ROWS)

    def task(self, writer: Any, sink_id: str, partition: int, batch: int, ids: range) -> TwoPhaseMessage:
        query = f"q{IDS.index(sink_id)}"
        self.local.ctx = (partition, 0, batch * 10 + partition, batch, query, "run1")
        plan(self.opts[sink_id]["checkpointLocation"], batch)
        data = pa.RecordBatch.from_pydict(
            {"id": pa.array(list(ids), pa.int64()), "name": pa.array([f"{sink_id}#{i}" for i in ids], pa.string())}
        )
        msg = writer.write(iter([data]))
        assert isinstance(msg, TwoPhaseMessage)
        return msg

    def tasks(self, sink_id: str, batch: int, writer: Any = None) -> list[TwoPhaseMessage]:
        w = writer or TwoPhaseStreamWriter(self.opts[sink_id], SCHEMA)
        ids = self.ids(sink_id, batch)
        half = ids.start + ROWS // 2
        return [
            self.task(w, sink_id, 0, batch, range(ids.start, half)),
            self.task(w, sink_id, 1, batch, range(half, ids.stop)),
        ]

    def rows(self, sink_id: str) -> list[tuple[int, str]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(f"SELECT id, name FROM {self.tables[sink_id]} ORDER BY id").fetchall()  # type: ignore[arg-type]

    def prepared(self, sink_id: str) -> list[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return sorted(str(p.gid) for p in list_prepared(conn, sink_id))


@pytest.fixture
def sinks(twophase_pg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Sinks]:
    s = Sinks(twophase_pg.dsn, tmp_path)
    # each thread is a task of its own sink: the task context Spark would give it, per thread
    monkeypatch.setattr(twophase_writer, "_task_context", lambda: TaskIdentity(*s.local.ctx))
    yield s
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:  # leave no prepared transaction behind
        for sink_id in IDS:
            for p in list_prepared(conn, sink_id):
                conn.execute(f"ROLLBACK PREPARED '{p.gid}'")  # type: ignore[arg-type]


def _docs_recipe() -> str:
    """The SQL of docs/postgres-2pc.md that lists a sink's prepared transactions."""
    m = re.search(r"<!-- sql: prepared-of-sink -->\n```sql\n(.*?)```", DOCS.read_text(), re.S)
    assert m, "docs/postgres-2pc.md lost its recipe for a sink's prepared transactions"
    return m.group(1)


def _run_recipe(conn: psycopg.Connection, recipe: str, sink_id: str) -> list[str]:
    text = recipe.replace(":'sink_id'", sql.Literal(sink_id).as_string(conn))
    return sorted(r[0] for r in conn.execute(text.encode()).fetchall())  # type: ignore[arg-type]


def test_sink_ids_that_are_prefixes_of_each_other_run_concurrently_and_exactly(sinks: Sinks) -> None:
    # 1. every sink decides batch 0 and commits its prepared transactions, but is stopped before the
    #    publish: its rows wait in committed staging tables, named only by its decision
    for sink_id in IDS:
        msgs = sinks.tasks(sink_id, 0)
        assert all(m.gid for m in msgs)
        stopped = dict(sinks.opts[sink_id], faults="sink.commit.after_k:batch=0:k=2:action=raise")
        with pytest.raises(Exception, match="fault injected"):
            TwoPhaseStreamWriter(stopped, SCHEMA).commit(msgs, 0)  # type: ignore[arg-type]
        with psycopg.connect(sinks.dsn, autocommit=True) as conn:
            decision = ProtocolTables(sinks.schema).decision(conn, sink_id, 0)
        assert decision is not None and not decision.published and sinks.prepared(sink_id) == []
    with psycopg.connect(sinks.dsn, autocommit=True) as conn:
        staged = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'stage%%'", (sinks.schema,)
        ).fetchone()
    assert staged is not None and staged[0] == 2 * len(IDS)

    # 2. every sink runs batches 1..3 at once, each in its own thread: each commit cleans up its sink's
    #    strays and empty staging tables, under its own sink lock
    errors: list[BaseException] = []
    start = threading.Barrier(len(IDS))

    def run(sink_id: str) -> None:
        try:
            start.wait(timeout=60)
            for batch in range(1, BATCHES):
                msgs = sinks.tasks(sink_id, batch)
                TwoPhaseStreamWriter(sinks.opts[sink_id], SCHEMA).commit(msgs, batch)  # type: ignore[arg-type]
        except BaseException as exc:  # reported below, with the sink it hit
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,), name=s) for s in IDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    # 3. each sink's replay of batch 0 publishes its staged rows: no other sink dropped them
    for sink_id in IDS:
        msgs = sinks.tasks(sink_id, 0)  # the replay's tasks see the decision and write nothing
        assert all(m.skipped for m in msgs)
        TwoPhaseStreamWriter(sinks.opts[sink_id], SCHEMA).commit(msgs, 0)  # type: ignore[arg-type]
    for sink_id in IDS:
        expected = [i for b in range(BATCHES) for i in sinks.ids(sink_id, b)]
        assert sinks.rows(sink_id) == [(i, f"{sink_id}#{i}") for i in expected], sink_id

    # 4. each sink leaves a different number of prepared transactions (batch 4, never committed):
    #    the checker, inspect, the operator's status and the docs' SQL count exactly those of the sink
    left: dict[str, list[str]] = {}
    for n, sink_id in enumerate(IDS):
        w = TwoPhaseStreamWriter(sinks.opts[sink_id], SCHEMA)
        ids = sinks.ids(sink_id, BATCHES)
        left[sink_id] = sorted(str(sinks.task(w, sink_id, p, BATCHES, ids[p : p + 1]).gid) for p in range(n + 1))
    recipe = _docs_recipe()
    with psycopg.connect(sinks.dsn, autocommit=True) as conn:
        for sink_id in IDS:
            assert checker.prepared_gids(conn, sink_id) == left[sink_id], sink_id
            [end] = checker.check_end_state(conn, sink_id=sink_id, checkpoint=None, decisions=False)
            assert end.name == "end.prepared" and not end.ok and end.counts == {"prepared": len(left[sink_id])}
            assert _run_recipe(conn, recipe, sink_id) == left[sink_id], sink_id
            found = eos_inspect._sink(sinks.dsn, sink_id, sinks.schema)
            assert sorted(g["gid"] for g in found["in_doubt"]) == left[sink_id], sink_id
            assert {d["sink_id"] for d in found["decisions"]} == {sink_id}
            info = status.sink_status(sinks.dsn, sink_id, schema=sinks.schema)
            assert sorted(g["gid"] for g in info["in_doubt"]) == left[sink_id], sink_id
            assert info["last_batch"] == BATCHES - 1

    # 5. the operator's recover of one sink rolls back that sink's transactions, nobody else's
    for n, sink_id in enumerate(IDS):
        assert (
            sinks_command.main(
                ["recover", "--dsn", sinks.dsn, "--sink-id", sink_id, "--eos-schema", sinks.schema, "--apply"]
            )
            == 0
        )
        assert sinks.prepared(sink_id) == []
        for other in IDS[n + 1 :]:
            assert sinks.prepared(other) == left[other], (sink_id, other)
    with psycopg.connect(sinks.dsn, autocommit=True) as conn:
        for sink_id in IDS:
            [end] = checker.check_end_state(conn, sink_id=sink_id, checkpoint=None, decisions=False)
            assert end.ok and end.counts == {"prepared": 0}


def test_staging_cleanup_of_one_sink_keeps_a_prefixed_sinks_decided_batch(sinks: Sinks) -> None:
    """The reviewer's case, interleaved by hand: sink "orders: eu" has a decided, unpublished batch;
    a commit of sink "orders" runs its cleanup; the batch of "orders: eu" is still published whole."""
    victim, other = "orders: eu", "orders"
    msgs = sinks.tasks(victim, 0)
    stopped = dict(sinks.opts[victim], faults="sink.commit.after_k:batch=0:k=2:action=raise")
    with pytest.raises(Exception, match="fault injected"):
        TwoPhaseStreamWriter(stopped, SCHEMA).commit(msgs, 0)  # type: ignore[arg-type]
    TwoPhaseStreamWriter(sinks.opts[other], SCHEMA).commit(sinks.tasks(other, 0), 0)  # type: ignore[arg-type]
    TwoPhaseStreamWriter(sinks.opts[victim], SCHEMA).commit(msgs, 0)  # type: ignore[arg-type]  # the replay
    assert [r[0] for r in sinks.rows(victim)] == list(sinks.ids(victim, 0))
    assert [r[0] for r in sinks.rows(other)] == list(sinks.ids(other, 0))
