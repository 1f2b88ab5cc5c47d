"""Benchmark: the kafka-eos sink encoding Confluent wire-format Avro (``value.format=avro``) against the same rows
written as JSON (``to_json``, encoded by Spark's JVM), and against the peer a Python user writes: a plain
confluent-kafka producer loop with confluent-kafka's own ``AvroSerializer``.

Run: ``.venv/bin/python -m bench.avro_encode [--quick] [--records N] [--fields F ...] [--repeat R]``.

A throwaway embedded Apache Kafka (plaintext) and Apicurio Registry; per record schema width (``--fields``, default
10 and 50: strings, longs, doubles, ints, booleans in turn, as ``bench.avro_decode``), ``--records`` rows (default
200,000; ``--quick`` 20,000) cached in Spark, in 2 partitions. Each writer writes them ``--repeat`` times (3) after
one untimed write (a new sink id each time: a batch job), and the median is printed in records/s:

- ``kafka-eos json``: ``df.select(to_json(value))`` through the sink, ``visibility=partition``: the sink alone;
- ``kafka-eos avro``: the struct through the sink with ``value.format=avro`` (``visibility=partition``, and the
  default ``visibility=batch``, which stages every record and publishes it again);
- ``kafka-eos json-schema``: the struct through the sink with ``value.format=json-schema`` (``visibility=partition``,
  the derived JSON Schema registered): the sink's own JSON encoder against Spark's ``to_json``;
- ``plain loop + AvroSerializer``: this process alone, one ``Producer`` (no transactions) and ``AvroSerializer``
  over the same rows, collected first (one core: no Spark, no Arrow).

In the peer environment (PySpark 4.2, where Maven Central serves Spark's Kafka connector and ``spark-avro``:
``PYSPARK_PYTHON=.venv-peer/bin/python .venv-peer/bin/python -m bench.avro_encode``), the JVM's limit too:

- ``Spark kafka + to_avro``: Spark's own ``format("kafka")`` sink (at-least-once, no transactions), each value the
  5-byte header of the registered schema's id and ``to_avro`` of the struct with that schema: Confluent's wire
  format made by the JVM, what a Spark user without a registry-aware library writes.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.avro_decode import jvm_peer, measure, parse_args, record, schema_of

__all__ = ["main"]


def rows(spark: Any, fields: int, records: int) -> Any:
    """A cached DataFrame of ``records`` rows: ``key`` (string) and ``value`` (the struct ``schema_of`` has)."""
    from pyspark.sql import functions as F

    exprs = []
    for k, field in enumerate(schema_of(fields)["fields"]):
        i = F.col("id")
        value = {
            "string": F.concat(F.lit("value-"), i.cast("string")),
            "long": i * 7,
            "double": i * 0.5,
            "int": (i % 1000).cast("int"),
            "boolean": i % 2 == 0,
        }[field["type"]]
        exprs.append(value.alias(f"f{k}"))
    df = spark.range(records, numPartitions=2).select(
        F.col("id").cast("string").alias("key"), F.struct(*exprs).alias("value")
    )
    return df.cache()


def spark_write(df: Any, options: dict[str, str]) -> float:
    began = time.perf_counter()
    (
        df.write.format("kafka-eos")
        .options(**options)
        .option("sink.id", f"bench-{uuid.uuid4().hex[:8]}")
        .option("batch.id", "1")
        .mode("append")
        .save()
    )
    return time.perf_counter() - began


def plain_loop(bootstrap: str, registry: str, topic: str, fields: int, records: int) -> float:
    """Seconds for one producer to serialize and write every row (delivered)."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    values = [record(i, fields) for i in range(records)]  # the rows, as a Python user has them
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    with confluent_client(registry) as client:
        ser = AvroSerializer(client, json.dumps(schema_of(fields)))
        ctx = SerializationContext(topic, MessageField.VALUE)
        began = time.perf_counter()
        for i, value in enumerate(values):
            while True:
                try:
                    producer.produce(topic, ser(value, ctx), key=str(i).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(120) == 0
        return time.perf_counter() - began


def spark_to_avro(df: Any, bootstrap: str, topic: str, schema: str, schema_id: int) -> float:
    """Spark's own Kafka sink, each value the wire-format header and ``to_avro`` of the struct with ``schema``."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    header = F.lit(b"\x00" + schema_id.to_bytes(4, "big"))
    began = time.perf_counter()
    (
        df.select("key", F.concat(header, to_avro("value", schema)).alias("value"))
        .write.format("kafka")
        .options(**{"kafka.bootstrap.servers": bootstrap, "topic": topic})
        .mode("append")
        .save()
    )
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    records, repeat, widths = parse_args("bench.avro_encode", __doc__ or "", argv)

    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import Schema
    from pyspark.sql import functions as F

    from connectors.services.apache_kafka import ApacheKafka
    from connectors.services.schema_registry import ApicurioRegistry, confluent_client
    from connectors.services.spark import local_session
    from eos_core.registry_avro import avro_schema

    peer = jvm_peer()
    broker, registry = ApacheKafka(), ApicurioRegistry()
    spark = local_session("bench-avro-encode", "local[2]", **(peer or {}))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        print(f"records {records:,} in 2 partitions, median of {repeat} (after one untimed write), records/s")
        if peer is None:
            print("(Spark's to_avro: run in .venv-peer, see the module's doc)")
        for fields in widths:
            topic = f"avro-out-{fields}-{uuid.uuid4().hex[:8]}"
            admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
            df = rows(spark, fields, records)
            df.count()
            json_df = df.select("key", F.to_json("value").alias("value"))
            base = {"kafka.bootstrap.servers": broker.bootstrap, "topic": topic, "visibility": "partition"}
            avro = {**base, "value.format": "avro", "schema.registry.url": registry.url, "value.subject": topic}
            runs: list[tuple[str, Callable[[], float]]] = [
                ("kafka-eos json (partition)", functools.partial(spark_write, json_df, base)),
                ("kafka-eos avro (partition)", functools.partial(spark_write, df, avro)),
                ("kafka-eos avro (batch)", functools.partial(spark_write, df, {**avro, "visibility": "batch"})),
                (
                    "kafka-eos json-schema (partition)",
                    functools.partial(
                        spark_write, df, {**avro, "value.format": "json-schema", "value.subject": f"{topic}-j"}
                    ),
                ),
                (
                    "plain loop + AvroSerializer",
                    functools.partial(plain_loop, broker.bootstrap, registry.url, topic, fields, records),
                ),
            ]
            if peer is not None:
                text = json.dumps(avro_schema(df.schema["value"].dataType))
                with confluent_client(registry.url) as client:
                    schema_id = client.register_schema(f"{topic}-spark", Schema(text, "AVRO"))
                jvm = functools.partial(spark_to_avro, df, broker.bootstrap, topic, text, schema_id)
                runs.append(("Spark kafka + to_avro", jvm))
            rates = measure(runs, records, repeat, fields)
            df.unpersist()
            avro_rate = rates["kafka-eos avro (partition)"]
            print(
                f"  avro / json {avro_rate / rates['kafka-eos json (partition)']:.2f}x, "
                f"avro / plain loop {avro_rate / rates['plain loop + AvroSerializer']:.2f}x, "
                f"batch avro / plain loop {rates['kafka-eos avro (batch)'] / rates['plain loop + AvroSerializer']:.2f}x, "
                f"json-schema / to_json {rates['kafka-eos json-schema (partition)'] / rates['kafka-eos json (partition)']:.2f}x"
                + (
                    f", avro / Spark's to_avro {avro_rate / rates['Spark kafka + to_avro']:.2f}x"
                    if peer is not None
                    else ""
                )
            )
    finally:
        spark.stop()
        registry.stop()
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
