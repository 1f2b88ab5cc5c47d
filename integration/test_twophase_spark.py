"""postgres-2pc through Spark in-process: complete mode, the foreachBatch adapter, bad input."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import connectors
from integration import test_twophase_support as support
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared

twophase_pg = support.twophase_pg
twophase_spark = support.twophase_spark

pytestmark = pytest.mark.integration


def _files(directory: Path, batches: list[list[dict[str, Any]]]) -> str:
    directory.mkdir(parents=True)
    now = time.time() - 1000
    for i, rows in enumerate(batches):
        path = directory / f"part-{i:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (now + i, now + i))
    return str(directory)


def _table() -> str:
    return "tp_" + uuid.uuid4().hex[:10]


def test_complete_mode_replaces_the_table_atomically_each_batch(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path
) -> None:
    src = _files(tmp_path / "in", [[{"k": "a"}, {"k": "b"}, {"k": "a"}], [{"k": "a"}, {"k": "c"}]])
    table = _table()
    q = (
        twophase_spark.readStream.schema("k string")
        .option("maxFilesPerTrigger", 1)
        .json(src)
        .groupBy("k")
        .count()
        .writeStream.outputMode("complete")
        .format("postgres-2pc")
        .option("dsn", twophase_pg.dsn)
        .option("table", table)
        .option("table.create", "true")
        .option("sink.id", f"s-{table}")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        rows = sorted(conn.execute(f"SELECT k, count FROM {table}").fetchall())  # type: ignore[arg-type]
        assert rows == [("a", 3), ("b", 1), ("c", 1)]
        assert ProtocolTables().last_batch(conn, f"s-{table}") == 1
        assert list_prepared(conn, f"s-{table}") == []


def test_foreach_batch_adapter_is_exactly_once_across_a_failed_commit(
    twophase_spark: Any, twophase_pg: Any, tmp_path: Path
) -> None:
    src = _files(tmp_path / "in", [[{"id": i} for i in range(b * 5, b * 5 + 5)] for b in range(3)])
    table = _table()
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint)")  # type: ignore[arg-type]

    def run(faults: str | None) -> Exception | None:
        opts: dict[str, Any] = {
            "dsn": twophase_pg.dsn,
            "table": table,
            "sink.id": f"s-{table}",
            "checkpointLocation": str(tmp_path / "ckpt"),
        }
        if faults:
            opts["faults"] = faults
        q = (
            twophase_spark.readStream.schema("id long")
            .option("maxFilesPerTrigger", 1)
            .json(src)
            .repartition(2)
            .writeStream.foreachBatch(connectors.twopc_batch(**opts))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination()
        except Exception as exc:
            return exc
        return None

    # every gid committed, then commit() fails before Spark's commit log: the batch is replayed.
    # 'once' keeps its state in a directory keyed by the spec: the never-matching second rule
    # makes this spec (and so its state) unique to this test run.
    spec = f"sink.after_commit:batch=1:action=raise:once;pipeline.batch:run={uuid.uuid4().hex}"
    failed = run(spec)
    assert failed is not None and "fault injected at sink.after_commit" in str(failed)
    assert run(spec) is None
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]  # type: ignore[arg-type]
        assert ids == list(range(15))
        assert ProtocolTables().last_batch(conn, f"s-{table}") == 2
        assert list_prepared(conn, f"s-{table}") == []


def test_streaming_bad_input(twophase_spark: Any, twophase_pg: Any, tmp_path: Path) -> None:
    src = _files(tmp_path / "in", [[{"id": 1}], [{"id": 2}]])
    table = _table()
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint)")  # type: ignore[arg-type]

    def start(name: str, **options: str) -> Any:
        w = (
            twophase_spark.readStream.schema("id long")
            .option("maxFilesPerTrigger", 1)
            .json(src)
            .writeStream.format("postgres-2pc")
            .option("dsn", twophase_pg.dsn)
            .option("table", table)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
        )
        for k, v in options.items():
            w = w.option(k, v)
        return w.start()

    q = start("c0")
    with pytest.raises(Exception, match=r"option 'sink\.id' is required"):
        q.awaitTermination()
    start("c1", **{"sink.id": "shared-" + table}).awaitTermination()
    q = start("c2", **{"sink.id": "shared-" + table})  # a second query (new checkpoint), same sink id
    with pytest.raises(Exception, match="belongs to query:"):
        q.awaitTermination()
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        assert sorted(r[0] for r in conn.execute(f"SELECT id FROM {table}").fetchall()) == [1, 2]  # type: ignore[arg-type]
