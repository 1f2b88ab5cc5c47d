"""Issue 32 item 5: a real query exports its per-batch metrics through the one-line listener
(``connectors.metrics.install``): source records and lag per partition, sink rows from the decision
log, publish time, prepared transactions, as JSON lines and a Prometheus text file."""

from __future__ import annotations

import io
import json
import time
import uuid

import connectors
from connectors import metrics


def test_a_query_exports_source_and_sink_metrics(
    spark,
    kafka_service,
    postgres_service,
    new_topic,
    produce,
    new_table,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    topic = new_topic(partitions=2)
    produce(topic, [{"key": f"k{i}", "value": f"v{i}"} for i in range(60)], partition=0)
    produce(topic, [{"key": f"k{i}", "value": f"v{i}"} for i in range(40)], partition=1)
    sink_id = f"metrics-{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    prom = tmp_path / "spark_eos.prom"
    exporter = metrics.install(spark, dsn=postgres_service.dsn, sink_id=sink_id, textfile=str(prom), json_stream=out)
    query = (
        spark.readStream.format("kafka-eos")
        .options(**kafka_service.app_options)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 40)
        .load()
        .selectExpr("CAST(value AS STRING) AS body", "partition", "offset")
        .writeStream.format("postgres-2pc")
        .queryName(f"q_{sink_id.replace('-', '_')}")
        .options(**connectors.postgres_options(postgres_service.dsn))
        .option("table", new_table())
        .option("table.create", "true")
        .option("sink.id", sink_id)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
        deadline = time.monotonic() + 60  # the listener bus is asynchronous
        while exporter.totals.get(str(query.id), 0) < 100 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(exporter.listener)  # the session is shared with other tests
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    ours = [x for x in lines if x["query_id"] == str(query.id) and x["source_records"] > 0]
    assert sum(x["sink_rows"] for x in ours) == 100 and len(ours) >= 3, lines  # 40 per batch at most
    assert all(x["source_records"] == x["sink_rows"] <= 40 for x in ours), ours
    assert ours[0]["source_lag"][topic] and sum(ours[0]["source_lag"][topic].values()) == 60, ours[0]
    last = ours[-1]
    assert last["source_lag"] == {topic: {"0": 0, "1": 0}}, last
    assert last["prepared_transactions"] == 0 and last["sink_publish_ms"] is not None, last
    assert last["sink_write_ms"] > 0 and last["sink_id"] == sink_id
    text = prom.read_text()
    assert f'spark_eos_sink_rows_total{{query="{query.name}",query_id="{query.id}",sink_id="{sink_id}"}} 100' in text
    assert (
        f'spark_eos_source_lag_offsets{{query="{query.name}",query_id="{query.id}",topic="{topic}",partition="1"}} 0'
        in text
    )
    assert "spark_eos_sink_prepared_oldest_age_seconds{" in text
