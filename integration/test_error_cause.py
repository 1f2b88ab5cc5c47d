"""Issue 32 item 9: errors raised inside Spark arrive as our one line. ``connectors.error_cause`` takes a
``StreamingQueryException`` (a sink refusing the query at its first commit) or an option error at
``start()`` and returns ``"<OurError>: <our message>"`` instead of hundreds of lines of stack."""

from __future__ import annotations

import uuid

import psycopg
import pytest

import connectors
from sinks.postgres.twophase.decisions import ProtocolTables


def test_a_failed_query_gives_our_error_as_its_cause(
    spark,
    kafka_service,
    postgres_service,
    new_topic,
    produce,
    new_table,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    from pyspark.errors import StreamingQueryException

    topic = new_topic()
    produce(topic, [{"key": "k", "value": "v1"}, {"key": "k", "value": "v2"}])
    sink_id = f"owned-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:  # another query owns the sink id
        ProtocolTables().ensure(conn)
        with conn.transaction():
            ProtocolTables().check_owner(conn, sink_id, "another-query", claim=True, run_id="r0")
    df = (
        spark.readStream.format("kafka-eos")
        .options(**kafka_service.app_options)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS body", "offset")
    )
    query = (
        df.writeStream.format("postgres-2pc")
        .options(**connectors.postgres_options(postgres_service.dsn))
        .option("table", new_table())
        .option("table.create", "true")
        .option("sink.id", sink_id)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(180)
    text = str(info.value)
    cause = connectors.error_cause(info.value)
    assert cause.startswith(f"FatalError: postgres-2pc: sink id {sink_id!r} belongs to another-query"), cause
    assert "\n" not in cause and len(text.splitlines()) > 5  # what it was buried in
    assert connectors.query_error is connectors.error_cause


def test_an_option_error_gives_our_error(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A missing sink.id: Spark reports it wrapped ([PYTHON_DATA_SOURCE_ERROR] or a query failure)."""
    df = spark.readStream.format("rate").load()
    with pytest.raises(Exception) as info:
        query = (
            df.writeStream.format("postgres-2pc")
            .option("dsn", "postgresql://u@127.0.0.1:1/d")
            .option("table", "t")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
    cause = connectors.error_cause(info.value)
    assert cause.startswith("ConfigError: ") and "sink.id" in cause, (cause, str(info.value)[:2000])
    assert "\n" not in cause and len(str(info.value).splitlines()) > 5
