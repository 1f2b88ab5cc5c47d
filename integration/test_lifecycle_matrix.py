"""The operator lifecycle matrix through real streaming queries (Spark in-process; postgres-2pc's invariants
I1-I3, sinks/postgres/twophase).

Each test runs JSON-file streaming queries (``maxFilesPerTrigger=1``: batch n reads file n) into
``postgres-2pc`` and/or ``postgres-upsert``, performs one operator action between runs (restore a
savepoint, fix a query after a refused value, change the table's schema with a batch in flight,
restart with another trigger and parallelism), proves the action happened (the refusal text, the
savepoint's manifest, the unpublished decision, the gids' nonces) and then checks the exact rows:
every input id exactly once and nothing else, no prepared transaction of the sink left, and, when
the query ran to its end, the sink's last decided batch equal to Spark's last ``commits/<n>``.

The protocol-level versions of these scenarios are in test_twophase_lifecycle.py; two queries on
one sink id (L7) is covered by test_twophase_spark.test_streaming_bad_input.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import functions as F

from connectors import savepoint
from integration import test_twophase_support as support
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared
from sinks.postgres.twophase.gid import parse_gid
from sinks.postgres.twophase.plan import _prefix, task_table

twophase_pg = support.twophase_pg
twophase_spark = support.twophase_spark

pytestmark = pytest.mark.integration

Rows = list[dict[str, Any]]
Transform = Callable[[Any], Any]

# ---------------------------------------------------------------------------------------------
# helpers


class Feed:
    """A directory of JSON files the file source reads in order: file i gets modification time base + i."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True)
        self.base = time.time() - 10_000
        self.count = 0

    def add(self, *files: Rows) -> None:
        for rows in files:
            name = f"part-{self.count:04d}.json"
            tmp = self.dir / f".{name}.tmp"  # hidden from the file source until renamed
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.utime(tmp, (self.base + self.count, self.base + self.count))
            tmp.rename(self.dir / name)
            self.count += 1

    @property
    def path(self) -> str:
        return str(self.dir)


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s.encode())


def _select(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


def _stream(spark: Any, feed: Feed, schema: str) -> Any:
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(feed.path)


def _start(
    df: Any, fmt: str, checkpoint: Path, options: dict[str, str], *, trigger: dict[str, Any] | None = None
) -> Any:
    w = df.writeStream.format(fmt).option("checkpointLocation", str(checkpoint))
    for k, v in options.items():
        w = w.option(k, v)
    return w.trigger(**(trigger or {"availableNow": True})).start()


def _run(df: Any, fmt: str, checkpoint: Path, options: dict[str, str]) -> str | None:
    """Run an availableNow query to its end; returns the failure's text, None when it succeeded."""
    q = _start(df, fmt, checkpoint, options)
    try:
        q.awaitTermination()
    except Exception as exc:
        return str(exc)
    finally:
        q.stop()
    return None


def _numbered(directory: Path) -> list[int]:
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if directory.exists() else []


def _last_commit(checkpoint: Path) -> int | None:
    done = _numbered(checkpoint / "commits")
    return done[-1] if done else None


def _ids(dsn: str, table: str) -> list[int]:
    return sorted(int(r[0]) for r in _select(dsn, f"SELECT id FROM {table}"))


def _decision(dsn: str, sink_id: str, batch: int) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return ProtocolTables().decision(conn, sink_id, batch)


def _prepared(dsn: str, sink_id: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [str(p.gid) for p in list_prepared(conn, sink_id)]


def _check_exactly_once(
    dsn: str, table: str, expected: list[int], *, sink_id: str | None, checkpoint: Path | None
) -> None:
    """Every expected id exactly once and nothing else; for postgres-2pc (``sink_id``) no prepared
    gid left and, with ``checkpoint``, the last decided batch == Spark's last commits/<n>."""
    assert _ids(dsn, table) == sorted(expected), f"{table}: ids are not exactly {sorted(expected)}"
    if sink_id is None:
        return
    assert _prepared(dsn, sink_id) == [], "prepared transactions of the sink remain"
    if checkpoint is not None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            last = ProtocolTables().last_batch(conn, sink_id)
        assert last is not None and last == _last_commit(checkpoint), (
            f"sink decided up to {last}, Spark committed up to {_last_commit(checkpoint)}"
        )


def _file(batch: int, n: int = 3) -> Rows:
    return [{"id": batch * 10 + i, "batch": batch} for i in range(n)]


def _expected(*batches: int, n: int = 3) -> list[int]:
    return [r["id"] for b in batches for r in _file(b, n)]


# ---------------------------------------------------------------------------------------------
# L1: the latest savepoint, restored into a new checkpoint directory, continues exactly once

SINKS = {
    "2pc-append": ("postgres-2pc", "append", "(id bigint, batch bigint)"),
    "2pc-partition": ("postgres-2pc", "append", "(id bigint, batch bigint)"),  # visibility=partition
    "2pc-upsert": ("postgres-2pc", "upsert", "(id bigint PRIMARY KEY, batch bigint)"),
    "upsert": ("postgres-upsert", None, "(id bigint PRIMARY KEY, batch bigint)"),
}


def _sink_options(kind: str, dsn: str, table: str, sink_id: str) -> dict[str, str]:
    fmt, mode, _ = SINKS[kind]
    opts = {"dsn": dsn, "table": table}
    if fmt == "postgres-2pc":
        opts["sink.id"] = sink_id
        opts["mode"] = str(mode)
        if kind == "2pc-partition":
            opts["visibility"] = "partition"
        if mode == "upsert":
            opts.update(key="id", version="batch")
    else:
        opts["key"] = "id"
    return opts


@pytest.mark.parametrize("kind", list(SINKS))
def test_L1_latest_savepoint_restore_continues_exactly_once(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path, kind: str
) -> None:
    fmt, _, columns = SINKS[kind]
    dsn, table = twophase_pg.dsn, _name("lc1")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} {columns}")
    opts = _sink_options(kind, dsn, table, sink_id)
    feed = Feed(tmp_path / "in")
    feed.add(_file(0), _file(1))
    first, restored = tmp_path / "ckpt", tmp_path / "restored"
    assert _run(_stream(twophase_spark, feed, "id long, batch long"), fmt, first, opts) is None
    assert _last_commit(first) == 1

    manifest = savepoint.create(str(first), str(tmp_path / "sp"))
    savepoint.restore(str(tmp_path / "sp"), str(restored))
    assert manifest["last_commit"] == 1 and _numbered(restored / "commits") == [0, 1]
    feed.add(_file(2), _file(3))
    assert _run(_stream(twophase_spark, feed, "id long, batch long"), fmt, restored, opts) is None

    # the restored checkpoint ran batches 2 and 3; the original one never saw them
    assert _numbered(restored / "commits") == [0, 1, 2, 3] and _last_commit(first) == 1
    _check_exactly_once(
        dsn, table, _expected(0, 1, 2, 3), sink_id=sink_id if fmt == "postgres-2pc" else None, checkpoint=restored
    )
    if fmt == "postgres-2pc":
        assert _decision(dsn, sink_id, 3).checkpoint == str(restored)
        assert _decision(dsn, sink_id, 1).checkpoint == str(first)


# ---------------------------------------------------------------------------------------------
# L2: an OLDER savepoint restored after new records were produced


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_L2_older_savepoint_restore_is_refused_by_2pc_then_a_fresh_sink_takes_that_lineage(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path, visibility: str
) -> None:
    """The query reads two feeds; the second one gets its first file only after the restore, so the
    restored query plans batch 2 with other offsets than the batch 2 the sink decided."""
    dsn, table = twophase_pg.dsn, _name("lc2")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint, batch bigint)")
    main, side = Feed(tmp_path / "main"), Feed(tmp_path / "side")

    def query() -> Any:
        schema = "id long, batch long"
        return _stream(twophase_spark, main, schema).unionByName(_stream(twophase_spark, side, schema))

    opts = {"dsn": dsn, "table": table, "sink.id": sink_id, "visibility": visibility}
    first, restored = tmp_path / "ckpt", tmp_path / "restored"
    main.add(_file(0), _file(1))
    assert _run(query(), "postgres-2pc", first, opts) is None
    savepoint.create(str(first), str(tmp_path / "sp-at-1"))
    main.add(_file(2), _file(3))
    assert _run(query(), "postgres-2pc", first, opts) is None
    _check_exactly_once(dsn, table, _expected(0, 1, 2, 3), sink_id=sink_id, checkpoint=first)
    before = sorted(_select(dsn, f"SELECT id, batch FROM {table}"))
    decided_2 = _decision(dsn, sink_id, 2)

    savepoint.restore(str(tmp_path / "sp-at-1"), str(restored))
    side.add(_file(7))  # new records produced
    main.add(_file(4))
    failure = _run(query(), "postgres-2pc", restored, opts)
    assert failure is not None, "the restored older savepoint was not refused"
    assert "LineageMismatch" in failure and "batch 2 planned as" in failure, failure
    assert f"checkpoint {str(restored)!r}" in failure and "new 'sink.id'" in failure, failure
    # nothing was written: same rows, no prepared gid, the decision of batch 2 untouched
    assert sorted(_select(dsn, f"SELECT id, batch FROM {table}")) == before
    assert _prepared(dsn, sink_id) == []
    assert _decision(dsn, sink_id, 2) == decided_2
    assert _decision(dsn, sink_id, 4) is None and _last_commit(restored) == 1

    # the operator's option (2): keep the restored checkpoint, give the query a new sink.id and table
    table2 = _name("lc2b")
    _sql(dsn, f"CREATE TABLE {table2} (id bigint, batch bigint)")
    opts2 = {"dsn": dsn, "table": table2, "sink.id": f"s-{table2}", "visibility": visibility}
    assert _run(query(), "postgres-2pc", restored, opts2) is None
    # that lineage, from the savepoint on: main files 2, 3, 4 and side file 7 (batches 2..4)
    _check_exactly_once(dsn, table2, _expected(2, 3, 4, 7), sink_id=f"s-{table2}", checkpoint=restored)
    assert _last_commit(restored) == 4
    assert sorted(_select(dsn, f"SELECT id, batch FROM {table}")) == before  # the old sink stays as it was


def test_L2_older_savepoint_of_a_file_source_replanned_with_other_files_is_refused(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path
) -> None:
    """One file feed: offsets/n holds only {"logOffset": n}, the same in every lineage; what the
    batch read is the file list of the source's own log (sources/0/n), and that is what differs when
    the restored query plans batch 2 with two files per trigger. Found by the matrix: before the
    lineage took the file list in, this run skipped batches 2 and 3 as decided and lost 6 rows."""
    dsn, table = twophase_pg.dsn, _name("lc2f")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint, batch bigint)")
    feed = Feed(tmp_path / "in")
    opts = {"dsn": dsn, "table": table, "sink.id": sink_id}

    def query(per_trigger: int) -> Any:
        return (
            twophase_spark.readStream.schema("id long, batch long")
            .option("maxFilesPerTrigger", per_trigger)
            .json(feed.path)
        )

    first, restored = tmp_path / "ckpt", tmp_path / "restored"
    feed.add(_file(0), _file(1))
    assert _run(query(1), "postgres-2pc", first, opts) is None
    savepoint.create(str(first), str(tmp_path / "sp-at-1"))
    feed.add(_file(2), _file(3))
    assert _run(query(1), "postgres-2pc", first, opts) is None
    before = _ids(dsn, table)
    assert before == _expected(0, 1, 2, 3)
    savepoint.restore(str(tmp_path / "sp-at-1"), str(restored))
    feed.add(_file(4), _file(5))
    failure = _run(query(2), "postgres-2pc", restored, opts)
    assert failure is not None and "LineageMismatch" in failure and "batch 2 planned as" in failure, failure
    assert _ids(dsn, table) == before and _prepared(dsn, sink_id) == []
    assert _last_commit(restored) == 1


def test_L2_older_savepoint_restore_into_upsert_ends_with_each_latest_version(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path
) -> None:
    dsn, table = twophase_pg.dsn, _name("lc2u")
    _sql(dsn, f"CREATE TABLE {table} (id bigint PRIMARY KEY, version bigint, batch bigint)")
    feed = Feed(tmp_path / "in")

    def file(b: int, extra: Rows = ()) -> Rows:  # type: ignore[assignment]
        own = [{"id": b * 10 + i, "version": b, "batch": b} for i in range(3)]
        update = [{"id": 0, "version": b, "batch": b}] if b else []  # id 0 gets a new version in every file
        return own + update + list(extra)

    def run(checkpoint: Path) -> str | None:
        df = _stream(twophase_spark, feed, "id long, version long, batch long")
        return _run(df, "postgres-upsert", checkpoint, {"dsn": dsn, "table": table, "key": "id", "version": "version"})

    first, restored = tmp_path / "ckpt", tmp_path / "restored"
    feed.add(file(0), file(1))
    assert run(first) is None
    savepoint.create(str(first), str(tmp_path / "sp-at-1"))
    feed.add(file(2), file(3))
    assert run(first) is None
    savepoint.restore(str(tmp_path / "sp-at-1"), str(restored))
    # new records: file 4 also carries a stale version of id 30 (version 1 < 3, which the table holds)
    feed.add(file(4, [{"id": 30, "version": 1, "batch": 4}]), file(5))
    assert run(restored) is None

    # the restored query replayed batches 2 and 3 and then ran 4 and 5
    assert _numbered(restored / "commits") == list(range(6))
    got = sorted(_select(dsn, f"SELECT id, version FROM {table}"))
    want = sorted([(0, 5)] + [(b * 10 + i, b) for b in range(6) for i in range(3) if (b, i) != (0, 0)])
    assert got == want


# ---------------------------------------------------------------------------------------------
# L3 / L4: the target refuses a value (or a key) of a batch; a fixed query gets past it

CODES = [
    [{"id": 1, "code": "ok"}, {"id": 2, "code": "fine"}],
    [{"id": 3, "code": "a"}, {"id": 4, "code": "toolong"}, {"id": 5, "code": "b"}],
    [{"id": 6, "code": "c"}, {"id": 7, "code": "dd"}],
]


@pytest.mark.parametrize("fmt", ["postgres-2pc", "postgres-2pc-partition", "postgres-upsert"])
def test_L3_bad_value_is_refused_then_the_fixed_query_writes_every_good_row_once(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path, fmt: str
) -> None:
    direct = fmt == "postgres-2pc-partition"  # visibility=partition: the task itself meets the refusal
    fmt = fmt.removesuffix("-partition")
    dsn, table = twophase_pg.dsn, _name("lc3")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint PRIMARY KEY, code varchar(4) NOT NULL)")
    feed = Feed(tmp_path / "in")
    feed.add(*CODES)
    opts = {"dsn": dsn, "table": table}
    opts.update({"sink.id": sink_id} if fmt == "postgres-2pc" else {"key": "id"})
    if direct:
        opts["visibility"] = "partition"
    ckpt = tmp_path / "ckpt"

    failure = _run(_stream(twophase_spark, feed, "id long, code string"), fmt, ckpt, opts)
    assert failure is not None, "the value too long for varchar(4) was not refused"
    if direct:
        assert "DataRefused" in failure and table in failure and "'toolong'" in failure, failure
        assert "Nothing of the batch was written" in failure, failure
        assert _decision(dsn, sink_id, 1) is None and _prepared(dsn, sink_id) == []
    elif fmt == "postgres-2pc":
        assert "DataRefused" in failure and "batch 1" in failure and table in failure, failure
        assert 'column "code"' in failure and "'toolong'" in failure and "taken back" in failure, failure
        assert _decision(dsn, sink_id, 1) is None and _prepared(dsn, sink_id) == []
    else:
        assert "value too long for type character varying(4)" in failure, failure
    assert _ids(dsn, table) == [1, 2] and _last_commit(ckpt) == 0  # batch 0 only, nothing of batch 1

    fixed = _stream(twophase_spark, feed, "id long, code string").filter("length(code) <= 4")
    assert _run(fixed, fmt, ckpt, opts) is None
    _check_exactly_once(
        dsn, table, [1, 2, 3, 5, 6, 7], sink_id=sink_id if fmt == "postgres-2pc" else None, checkpoint=ckpt
    )
    assert _last_commit(ckpt) == 2
    assert sorted(_select(dsn, f"SELECT id, code FROM {table}")) == [
        (1, "ok"),
        (2, "fine"),
        (3, "a"),
        (5, "b"),
        (6, "c"),
        (7, "dd"),
    ]


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_L4_unique_violation_against_an_existing_row_is_refused_then_the_fixed_query_gets_past(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path, visibility: str
) -> None:
    dsn, table = twophase_pg.dsn, _name("lc4")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint PRIMARY KEY, batch bigint)", f"INSERT INTO {table} VALUES (5, -1)")
    feed = Feed(tmp_path / "in")
    feed.add([{"id": i, "batch": 0} for i in range(3)], [{"id": i, "batch": 1} for i in range(3, 8)], _file(2))
    opts = {"dsn": dsn, "table": table, "sink.id": sink_id, "visibility": visibility}
    ckpt = tmp_path / "ckpt"

    failure = _run(_stream(twophase_spark, feed, "id long, batch long").repartition(2), "postgres-2pc", ckpt, opts)
    assert failure is not None, "the duplicate key was not refused"
    assert "DataRefused" in failure and "Key (id)=(5) already exists" in failure and "23505" in failure, failure
    assert f"{table}_pkey" in failure, failure
    if visibility == "partition":  # the task met the refusal inside its own transaction: nothing prepared
        assert "Nothing of the batch was written" in failure, failure
    else:
        assert "batch 1" in failure, failure
    assert _ids(dsn, table) == [0, 1, 2, 5] and _decision(dsn, sink_id, 1) is None
    assert _prepared(dsn, sink_id) == []

    fixed = _stream(twophase_spark, feed, "id long, batch long").filter("id != 5").repartition(2)
    assert _run(fixed, "postgres-2pc", ckpt, opts) is None
    _check_exactly_once(dsn, table, [0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22], sink_id=sink_id, checkpoint=ckpt)
    assert _last_commit(ckpt) == 2
    assert _select(dsn, f"SELECT batch FROM {table} WHERE id = 5") == [(-1,)]  # the existing row, untouched


# ---------------------------------------------------------------------------------------------
# L5: the table's schema changes while a decided batch is unpublished


def test_L5_schema_change_with_a_batch_in_flight_rewrites_it_with_the_new_columns(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path
) -> None:
    dsn, table = twophase_pg.dsn, _name("lc5")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint, batch bigint)")
    feed = Feed(tmp_path / "in")
    feed.add(_file(0, 4), _file(1, 4), _file(2, 4))
    ckpt = tmp_path / "ckpt"
    opts = {"dsn": dsn, "table": table, "sink.id": sink_id}
    crash = dict(opts, faults="sink.commit.after_k:batch=1:k=1:action=raise")

    failure = _run(_stream(twophase_spark, feed, "id long, batch long").repartition(2), "postgres-2pc", ckpt, crash)
    assert failure is not None and "fault injected at sink.commit.after_k" in failure, failure
    old = _decision(dsn, sink_id, 1)
    assert old is not None and old.published_at is None and len(old.gids) == 2  # decided, unpublished
    published = _select(dsn, f"SELECT published_at IS NULL FROM eos.sink_batches WHERE sink_id = '{sink_id}'")
    assert sorted(published) == [(False,), (True,)]  # batch 0 published, batch 1 not
    left = _prepared(dsn, sink_id)
    assert len(left) == 1 and left[0] in old.gids  # one gid committed (into staging), one still prepared
    committed = [g for g in old.gids if g not in left]
    staged = _select(dsn, f"SELECT count(*) FROM {task_table(_prefix(old.stage), committed[0]).sql}")[0][0]
    assert 0 < staged < 4  # that task's rows wait in its own staging table
    assert _ids(dsn, table) == _expected(0, n=4)

    _sql(dsn, f"ALTER TABLE {table} ADD COLUMN note text")
    wider = _stream(twophase_spark, feed, "id long, batch long").withColumn("note", F.lit("v2")).repartition(2)
    assert _run(wider, "postgres-2pc", ckpt, opts) is None

    _check_exactly_once(dsn, table, _expected(0, 1, 2, n=4), sink_id=sink_id, checkpoint=ckpt)
    rows = sorted(_select(dsn, f"SELECT id, batch, note FROM {table}"))
    assert rows == sorted(
        [(r["id"], 0, None) for r in _file(0, 4)] + [(r["id"], b, "v2") for b in (1, 2) for r in _file(b, 4)]
    )
    new = _decision(dsn, sink_id, 1)
    assert new.published and new.stage != old.stage and not set(new.gids) & set(old.gids)
    for g in old.gids:  # the taken-back attempt's staging tables are gone (the committed one dropped)
        assert _select(dsn, f"SELECT to_regclass('{task_table(_prefix(old.stage), g).sql}')") == [(None,)], g


def test_L5_schema_change_with_a_direct_batch_in_flight_rolls_it_forward_with_its_columns(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path
) -> None:
    """visibility=partition: the decided batch's rows are already in the table inside its prepared
    transactions, which hold the table until they commit: an operator's ALTER TABLE would wait for
    them. With schema.evolution=add-columns the restarted query rolls the decided batch forward
    first, adds the column, and writes the later batches with it; batch 1 is committed as decided
    (never rewritten)."""
    dsn, table = twophase_pg.dsn, _name("lc5p")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint, batch bigint)")
    feed = Feed(tmp_path / "in")
    feed.add(_file(0, 4), _file(1, 4), _file(2, 4))
    ckpt = tmp_path / "ckpt"
    opts = {"dsn": dsn, "table": table, "sink.id": sink_id, "visibility": "partition"}
    crash = dict(opts, faults="sink.commit.after_k:batch=1:k=1:action=raise")

    failure = _run(_stream(twophase_spark, feed, "id long, batch long").repartition(2), "postgres-2pc", ckpt, crash)
    assert failure is not None and "fault injected at sink.commit.after_k" in failure, failure
    old = _decision(dsn, sink_id, 1)
    assert old is not None and len(old.gids) == 2
    left = _prepared(dsn, sink_id)
    assert len(left) == 1 and left[0] in old.gids  # one task's rows visible, the other's still prepared
    visible = set(_ids(dsn, table)) - {r["id"] for r in _file(0, 4)}
    assert 0 < len(visible) < 4

    # a lock with no backend (pid NULL) is a prepared transaction's: it holds the table, so an ALTER
    # TABLE now would wait for it
    held = _select(dsn, f"SELECT count(*) FROM pg_locks WHERE relation = '{table}'::regclass AND pid IS NULL")
    assert held[0][0] >= 1

    wider = _stream(twophase_spark, feed, "id long, batch long").withColumn("note", F.lit("v2")).repartition(2)
    assert _run(wider, "postgres-2pc", ckpt, dict(opts, **{"schema.evolution": "add-columns"})) is None

    _check_exactly_once(dsn, table, _expected(0, 1, 2, n=4), sink_id=sink_id, checkpoint=ckpt)
    rows = sorted(_select(dsn, f"SELECT id, batch, note FROM {table}"))
    assert rows == sorted(  # batch 1 rolled forward as decided (no note), batch 2 with the new column
        [(r["id"], b, None) for b in (0, 1) for r in _file(b, 4)] + [(r["id"], 2, "v2") for r in _file(2, 4)]
    )
    assert _decision(dsn, sink_id, 1).gids == old.gids and _prepared(dsn, sink_id) == []


# ---------------------------------------------------------------------------------------------
# L6: restart with another trigger and parallelism after a failure past the decision


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_L6_restart_with_processing_time_trigger_and_more_partitions_rolls_the_decision_forward(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path, visibility: str
) -> None:
    dsn, table = twophase_pg.dsn, _name("lc6")
    sink_id = f"s-{table}"
    _sql(dsn, f"CREATE TABLE {table} (id bigint, batch bigint)")
    feed = Feed(tmp_path / "in")
    feed.add(*(_file(b, 5) for b in range(4)))
    ckpt = tmp_path / "ckpt"
    opts = {"dsn": dsn, "table": table, "sink.id": sink_id, "visibility": visibility}
    crash = dict(opts, faults="sink.commit.after_decision:batch=1:action=raise")

    failure = _run(_stream(twophase_spark, feed, "id long, batch long").repartition(2), "postgres-2pc", ckpt, crash)
    assert failure is not None and "fault injected at sink.commit.after_decision" in failure, failure
    decided = _decision(dsn, sink_id, 1)
    assert decided is not None and not decided.published and len(decided.gids) == 2
    assert sorted(_prepared(dsn, sink_id)) == sorted(decided.gids)  # decided, nothing committed yet
    first_nonces = {parse_gid(g).nonce for g in decided.gids}  # type: ignore[union-attr]
    assert len(first_nonces) == 1 and _last_commit(ckpt) == 0

    df = _stream(twophase_spark, feed, "id long, batch long").repartition(3)
    q = _start(df, "postgres-2pc", ckpt, opts, trigger={"processingTime": "1 second"})
    try:
        deadline = time.monotonic() + 240  # a bound against a hang, not a timing assertion
        while _last_commit(ckpt) != 3 and q.isActive and time.monotonic() < deadline:
            time.sleep(0.5)
        assert q.exception() is None, q.exception()
        assert _last_commit(ckpt) == 3, "the restarted query did not commit every file"
    finally:
        q.stop()

    _check_exactly_once(dsn, table, _expected(0, 1, 2, 3, n=5), sink_id=sink_id, checkpoint=ckpt)
    after = _decision(dsn, sink_id, 1)
    assert after.published and after.gids == decided.gids  # rolled forward: the first run's gids
    assert {parse_gid(g).nonce for g in after.gids} == first_nonces  # type: ignore[union-attr]
    later = _decision(dsn, sink_id, 2)
    assert {parse_gid(g).partition for g in later.gids} == {0, 1, 2}  # type: ignore[union-attr]
    assert not {parse_gid(g).nonce for g in later.gids} & first_nonces  # type: ignore[union-attr]
