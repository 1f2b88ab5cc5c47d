"""Every fault point a connector declares (``FAULT_POINTS``) is reached in a real query: one availableNow query
per sink (and its visibility), each with a rule for every point it declares that fires once and only logs
(``action=sleep:seconds=0:once``). A ``once`` rule leaves a marker in the spec's state directory in whatever
process it fired (a task's worker, the driver's planner or committer), so the markers prove each firing.
What the code fires and the declarations name the same points: tests/test_fault_points.py."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import connectors
import sinks.kafka
import sinks.postgres.twophase
import sinks.postgres.upsert
import sources.kafka
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from eos_core import faults

pytestmark = [pytest.mark.integration]

RECORDS = 150  # one batch of them: sink.publish.mid fires every 100 records the publish sends


def _spec(points: Iterable[str], tag: str) -> str:
    """A rule per point that fires once and does nothing but log; ``tag`` (unused by any point) makes the
    spec, and so its state directory, this test's own. The directory starts empty."""
    spec = ";".join(f"{p}:action=sleep:seconds=0:once" for p in dict.fromkeys(points)) + f";pipeline.batch:tag={tag}"
    shutil.rmtree(faults._state_dir(spec), ignore_errors=True)
    return spec


def _fired(spec: str) -> set[str]:
    state = Path(faults._state_dir(spec))
    return {rule.point for rule in faults.parse_spec(spec) if (state / f"{rule.key}.0").exists()}


def _source(spark: Any, kafka: Any, spec: str | None = None) -> Any:
    """kafka-eos on a new topic of RECORDS records, as (k, v) strings (v, the record's JSON, is unique), read as
    the suite's app principal."""
    topic = f"fp-{uuid.uuid4().hex[:10]}"
    create_topic(kafka.bootstrap, topic, 2)
    kafka.grant_topic(topic)
    produce_records(kafka.bootstrap, topic, make_records(RECORDS, seed=5, prefix=f"{topic}-"), partitions=2)
    reader = (
        spark.readStream.format("kafka-eos")
        .options(**kafka.app_options)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if spec:
        reader = reader.option("faults", spec)
    return reader.load().select(F.col("key").cast("string").alias("k"), F.col("value").cast("string").alias("v"))


def _drain(writer: Any, checkpoint: str) -> None:
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def test_the_source_and_the_2pc_sink_reach_every_point_they_declare(
    spark: Any, kafka_service: Any, postgres_service: Any, tmp_checkpoint: str
) -> None:
    declared = (*sources.kafka.FAULT_POINTS.fired, *sinks.postgres.twophase.FAULT_POINTS.fired)
    spec = _spec(declared, uuid.uuid4().hex)
    table = f"fp_{uuid.uuid4().hex[:10]}"
    writer = (
        _source(spark, kafka_service, spec)
        .writeStream.format("postgres-2pc")
        .options(**connectors.postgres_options(postgres_service.dsn))
        .option("table", table)
        .option("table.create", "true")
        .option("sink.id", table)
        .option("faults", spec)
    )
    _drain(writer, tmp_checkpoint)
    assert _fired(spec) >= set(declared)


def test_the_upsert_sink_reaches_every_point_it_declares(
    spark: Any, kafka_service: Any, postgres_service: Any, tmp_checkpoint: str
) -> None:
    declared = sinks.postgres.upsert.FAULT_POINTS.fired
    spec = _spec(declared, uuid.uuid4().hex)
    table = f"fp_{uuid.uuid4().hex[:10]}"
    writer = (
        _source(spark, kafka_service)
        .writeStream.format("postgres-upsert")
        .options(**connectors.postgres_options(postgres_service.dsn))
        .option("table", table)
        .option("table.create", "true")
        .option("key", "v")
        .option("faults", spec)
    )
    _drain(writer, tmp_checkpoint)
    assert _fired(spec) >= set(declared)


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_the_kafka_sink_reaches_every_point_it_declares(
    spark: Any, kafka_service: Any, tmp_checkpoint: str, visibility: str
) -> None:
    points = sinks.kafka.FAULT_POINTS[visibility]
    spec = _spec(points.kills, uuid.uuid4().hex)  # partition: the publish's points only replay a partial batch
    out = f"fp-out-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_service.bootstrap, out, 2)
    kafka_service.grant_topic(out)
    writer = (
        _source(spark, kafka_service)
        .select(F.col("k").alias("key"), F.col("v").alias("value"))
        .writeStream.format("kafka-eos")
        .options(**kafka_service.app_options)
        .option("topic", out)
        .option("sink.id", out)
        .option("visibility", visibility)
        .option("faults", spec)
    )
    _drain(writer, tmp_checkpoint)
    assert _fired(spec) >= set(points.kills)


def test_a_foreach_batch_function_is_run_between_the_points_around_batch_declares(
    spark: Any, kafka_service: Any, tmp_checkpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(faults.FOREACH_BATCH.fired, uuid.uuid4().hex)
    monkeypatch.setenv(faults.ENV_SPEC, spec)  # foreachBatch runs in this process (the query's driver)
    seen: list[int] = []
    writer = _source(spark, kafka_service).writeStream.foreachBatch(
        faults.around_batch(lambda df, batch_id: seen.append(df.count()))
    )
    _drain(writer, tmp_checkpoint)
    assert sum(seen) == RECORDS and _fired(spec) >= set(faults.FOREACH_BATCH.fired)
