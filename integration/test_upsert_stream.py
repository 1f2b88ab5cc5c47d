"""postgres-upsert in streaming queries: a replay after a crash before commits/n, update and complete modes."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.utils import StreamingQueryException

import connectors

pytestmark = pytest.mark.integration

SCHEMA = "k string, v long"


def _put(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(directory / name)  # atomic: the file source never sees half a file


def _rows(conn: psycopg.Connection, table: str) -> list[tuple[Any, ...]]:
    return conn.execute(f'SELECT * FROM "{table}" ORDER BY 1').fetchall()  # type: ignore[arg-type]


def test_replay_after_crash_between_write_and_commit_log(
    spark: SparkSession,
    postgres_service: Any,
    pg_conn: psycopg.Connection,
    new_table: Any,
    tmp_checkpoint: str,
    tmp_path: Path,
) -> None:
    table = new_table("replay")
    source = tmp_path / "in"
    rows = [{"k": f"k{i % 40}", "v": i} for i in range(100)]
    _put(source, "0.json", rows)
    # Fires once, in the driver's commit(), after every task committed and before Spark writes
    # commits/0: the exact window the sink's idempotence must cover. The code= value only makes
    # this rule's once-state unique to the run.
    faults = f"sink.after_commit:batch=0:action=raise:code={uuid.uuid4().int % 10**8}:once"

    def run(**extra: str) -> None:
        q = (
            spark.readStream.schema(SCHEMA)
            .json(str(source))
            .coalesce(1)
            .writeStream.format("postgres-upsert")
            .option("dsn", postgres_service.dsn)
            .option("table", table)
            .option("key", "k")
            .option("table.create", "true")
            .options(**extra)
            .option("checkpointLocation", tmp_checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    with pytest.raises(StreamingQueryException) as err:
        run(faults=faults)
    assert "fault injected at sink.after_commit" in str(err.value)
    ckpt = Path(tmp_checkpoint)
    assert (ckpt / "offsets" / "0").exists() and not (ckpt / "commits" / "0").exists()
    expected = sorted({r["k"]: (r["k"], r["v"]) for r in rows}.values())  # last row per key, input order
    assert _rows(pg_conn, table) == expected  # written before the crash
    xmins = pg_conn.execute(f'SELECT xmin::text FROM "{table}"').fetchall()  # type: ignore[arg-type]

    run(faults=faults)  # restart from the checkpoint: batch 0 runs again (the fault is spent)
    assert (ckpt / "commits" / "0").exists() and not (ckpt / "offsets" / "1").exists()
    assert _rows(pg_conn, table) == expected  # identical to a single write
    assert pg_conn.execute(f'SELECT xmin::text FROM "{table}"').fetchall() != xmins  # it really was rewritten  # type: ignore[arg-type]


def test_update_mode_aggregation_through_foreach_batch(
    spark: SparkSession,
    postgres_service: Any,
    pg_conn: psycopg.Connection,
    new_table: Any,
    tmp_checkpoint: str,
    tmp_path: Path,
) -> None:
    table = new_table("agg")
    source = tmp_path / "in"
    _put(source, "0.json", [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}])
    counts = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    )
    q = (
        counts.writeStream.outputMode("update")
        .foreachBatch(connectors.upsert_batch(dsn=postgres_service.dsn, table=table, key="k", **{"table.create": True}))
        .option("checkpointLocation", tmp_checkpoint)
        .start()
    )
    try:
        q.processAllAvailable()
        assert _rows(pg_conn, table) == [("a", 2, 4), ("b", 1, 2)]
        _put(source, "1.json", [{"k": "b", "v": 10}, {"k": "c", "v": 5}])
        q.processAllAvailable()
        assert _rows(pg_conn, table) == [("a", 2, 4), ("b", 2, 12), ("c", 1, 5)]
    finally:
        q.stop()
    assert q.exception() is None


def test_complete_mode_into_the_data_source(
    spark: SparkSession,
    postgres_service: Any,
    pg_conn: psycopg.Connection,
    new_table: Any,
    tmp_checkpoint: str,
    tmp_path: Path,
) -> None:
    table = new_table("complete")
    source = tmp_path / "in"
    _put(source, "0.json", [{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 5}])
    q = (
        spark.readStream.schema(SCHEMA)
        .json(str(source))
        .groupBy("k")
        .agg(F.max("v").alias("top"))
        .writeStream.outputMode("complete")
        .format("postgres-upsert")
        .option("dsn", postgres_service.dsn)
        .option("table", table)
        .option("key", "k")
        .option("table.create", "true")
        .option("checkpointLocation", tmp_checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert _rows(pg_conn, table) == [("a", 2), ("b", 5)]
    assert os.path.exists(os.path.join(tmp_checkpoint, "commits", "0"))
