"""postgres-2pc and the kafka-eos sink with spark.speculation=true on a standalone cluster whose two
workers are two hosts.

Spark never runs a speculative copy on the host of the original attempt, and every executor of
``local-cluster`` shares one host; so the test runs on ``standalone_cluster``
(integration/fixtures/cluster.py): a standalone master and two one-core workers on 127.0.0.2 and
127.0.0.3 (loopback addresses, each its own "host" to Spark), from the pip-installed Spark.
Attempt 0 of partition 0 sleeps right after its PREPARE in every batch; Spark launches a
speculative attempt on the other worker, both hold a prepared transaction of the same partition,
Spark accepts one. No batch may fail, and every row must be
there exactly once with no prepared transaction left.

The kafka-eos sink (crash matrix row F30): with ``visibility=partition`` attempt 0 of partition 0
sleeps with its rows sent in its transaction; the speculative twin has the same transactional id
(the slot's), fences it, writes and commits; with ``visibility=batch`` both attempts stage, tagged
with their attempt, and the publish reads only the records of the attempt Spark accepted. The
topic, read ``read_committed``, holds every row once and no transaction is left open.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eos_core.faults import fired
from integration import test_twophase_support as support
from integration.fixtures.cluster import StandaloneCluster
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared

twophase_pg = support.twophase_pg

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _driver(
    master: str,
    dsn: str,
    table: str,
    sink_id: str,
    work: str,
    visibility: str,
    sink: str = "postgres-2pc",
    kafka_config: str = "",
) -> None:
    """The query, run in a process of its own (``python -m integration.test_speculation_cluster``).

    In the test process ``getOrCreate`` would hand back the suite's shared local session (its master
    cannot change) and ``stop`` would end it for every later test: the cluster gets its own driver.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    import connectors

    spark = (
        SparkSession.builder.master(master)
        .appName("speculation")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "768m")
        .config("spark.speculation", "true")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.minTaskRuntime", "500ms")
        .config("spark.speculation.interval", "200ms")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.EOS_FAULTS_LOG", str(Path(work, "faults.jsonl")))
        .getOrCreate()
    )
    try:
        connectors.register(spark)
        where = str(Path(work, "attempts"))

        def note(i):  # type: ignore[no-untyped-def]  # each task attempt leaves a mark: speculation ran
            from pyspark import TaskContext

            ctx = TaskContext.get()
            Path(where, f"stage{ctx.stageId()}-p{ctx.partitionId()}-a{ctx.attemptNumber()}").touch()
            return i

        rows = (
            spark.readStream.schema("id long")
            .option("maxFilesPerTrigger", 1)
            .json(str(Path(work, "in")))
            .repartition(2)
            .select(F.udf(note, LongType())("id").alias("id"))
        )
        if sink == "kafka-eos":  # dsn is the bootstrap, table the topic
            writer = (
                rows.selectExpr("CAST(id AS STRING) AS key", "to_json(struct(id)) AS value")
                .writeStream.format("kafka-eos")
                .options(**connectors.kafka_options(dsn, kafka_config or None))
                .option("topic", table)
                # attempt 0 of partition 0 is slow with its rows sent (partition) or staged (batch)
                .option("faults", "sink.after_write:partition=0:attempt=0:action=sleep:seconds=15")
            )
        else:
            writer = (
                rows.writeStream.format("postgres-2pc")
                .option("dsn", dsn)
                .option("table", table)
                # attempt 0 of partition 0 is slow right after its PREPARE: its twin prepares too
                .option("faults", "sink.after_prepare:partition=0:attempt=0:action=sleep:seconds=15")
            )
        q = (
            writer.option("sink.id", sink_id)
            .option("visibility", visibility)
            .option("checkpointLocation", str(Path(work, "checkpoint")))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()  # raises if any batch failed
    finally:
        spark.stop()


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_speculative_attempts_on_another_host_end_exactly_once(
    visibility: str, standalone_cluster: StandaloneCluster, twophase_pg: Any, tmp_path: Path
) -> None:
    """Both visibility modes: with partition, both attempts of partition 0 write the table inside their
    prepared transactions; only the accepted one's commit makes its rows visible."""
    marks = tmp_path / "attempts"
    marks.mkdir()
    src = tmp_path / "in"
    src.mkdir()
    for b in range(2):
        part = src / f"part-{b}.json"
        part.write_text("".join(json.dumps({"id": b * 10 + i}) + "\n" for i in range(10)))
        os.utime(part, (time.time() - 100 + b, time.time() - 100 + b))
    table, sink_id = f"spec_{visibility}_{os.getpid()}", f"spec-{visibility}-{os.getpid()}"
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {table} (id bigint)")  # type: ignore[arg-type]

    args = [standalone_cluster.url, twophase_pg.dsn, table, sink_id, str(tmp_path), visibility]
    driver = subprocess.run(
        [sys.executable, "-m", "integration.test_speculation_cluster", *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert driver.returncode == 0, f"a batch failed under speculation:\n{driver.stderr[-4000:]}"
    speculative = sorted(m.name for m in marks.iterdir() if m.name.endswith("-p0-a1"))
    assert len(speculative) == 2, f"no speculative attempt of partition 0 in each batch: {sorted(os.listdir(marks))}"
    slept = [e for e in fired(str(tmp_path / "faults.jsonl")) if e["point"] == "sink.after_prepare"]
    assert len(slept) == 2, f"attempt 0 of partition 0 did not PREPARE and sleep in each batch: {slept}"
    with psycopg.connect(twophase_pg.dsn, autocommit=True) as conn:
        ids = sorted(r[0] for r in conn.execute(f"SELECT id FROM {table}"))  # type: ignore[arg-type]
        assert ids == list(range(20)), f"not exactly once: {ids}"
        assert list_prepared(conn, sink_id) == []
        assert ProtocolTables().last_batch(conn, sink_id) == 1


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_f30_the_kafka_sink_under_speculation_on_another_host_ends_exactly_once(
    visibility: str, standalone_cluster: StandaloneCluster, kafka_service: Any, tmp_path: Path
) -> None:
    from connectors.toolkit.chaos import create_topic
    from connectors.toolkit.checker import read_topic
    from connectors.toolkit.topic_checker import marker_batches, open_transactions

    marks = tmp_path / "attempts"
    marks.mkdir()
    src = tmp_path / "in"
    src.mkdir()
    for b in range(2):
        part = src / f"part-{b}.json"
        part.write_text("".join(json.dumps({"id": b * 10 + i}) + "\n" for i in range(10)))
        os.utime(part, (time.time() - 100 + b, time.time() - 100 + b))
    topic, sink_id = f"spec-{visibility}-{os.getpid()}-{time.time_ns()}", f"spec-k-{visibility}-{time.time_ns()}"
    create_topic(kafka_service.bootstrap, topic, 2)
    kafka_service.grant_topic(topic)  # the query runs as the suite's app principal
    args = [standalone_cluster.url, kafka_service.bootstrap, topic, sink_id, str(tmp_path), visibility, "kafka-eos"]
    args.append(getattr(kafka_service, "app_config", None) or "")
    driver = subprocess.run(
        [sys.executable, "-m", "integration.test_speculation_cluster", *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert driver.returncode == 0, f"a batch failed under speculation:\n{driver.stderr[-4000:]}"
    speculative = sorted(m.name for m in marks.iterdir() if m.name.endswith("-p0-a1"))
    # on a loaded machine the first batch's slow start can hide its straggler from speculation: one batch suffices
    assert speculative, f"no speculative attempt of partition 0: {sorted(os.listdir(marks))}"
    slept = [e for e in fired(str(tmp_path / "faults.jsonl")) if e["point"] == "sink.after_write"]
    assert len(slept) == 2, f"attempt 0 of partition 0 did not write and sleep in each batch: {slept}"
    ids = sorted(r["id"] for r in read_topic(kafka_service.bootstrap, topic))
    assert ids == list(range(20)), f"not exactly once: {ids}"
    assert open_transactions(kafka_service.bootstrap, [topic]) == {}
    assert max(m.batch for m in marker_batches(kafka_service.bootstrap, sink_id, topic).values()) == 1


if __name__ == "__main__":
    _driver(*sys.argv[1:9])
