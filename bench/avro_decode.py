"""Benchmark: kafka-eos decoding Confluent wire-format Avro (``value.format=avro``) against the same topic read raw,
and against the peer a Python user writes: a plain confluent-kafka consumer loop with confluent-kafka's own
``AvroDeserializer``.

Run: ``.venv/bin/python -m bench.avro_decode [--quick] [--records N] [--fields F ...] [--repeat R]``.

A throwaway embedded Apache Kafka (plaintext) and Apicurio Registry (``connectors.services.schema_registry``); per
record schema width (``--fields``, default 10 and 50: strings, longs, doubles, ints, booleans in turn), one topic of
``--records`` records (default 200,000; ``--quick`` 20,000) in 2 partitions, written with ``AvroSerializer``. Each
reader drains the topic ``--repeat`` times (3) after one untimed read, and the median is printed in records/s:

- ``kafka-eos raw``: ``spark.read.format("kafka-eos") ... .write.format("noop")``, Spark ``local[2]``: the read alone;
- ``kafka-eos avro``: the same with ``value.format=avro`` (every record decoded onto the latest schema);
- ``plain loop + AvroDeserializer``: this process alone, one Consumer on both partitions, ``consume(1000)`` until
  the end, each value through ``AvroDeserializer`` (one core: no Spark, no Arrow).

In the peer environment (PySpark 4.2, where Maven Central serves Spark's Kafka connector and ``spark-avro``:
``PYSPARK_PYTHON=.venv-peer/bin/python .venv-peer/bin/python -m bench.avro_decode``), the JVM's limit too:

- ``Spark kafka raw``: Spark's own ``format("kafka")`` into ``noop``;
- ``Spark kafka + from_avro``: the same, each value's body after the 5-byte header through ``from_avro`` with the
  topic's writer schema (what ABRiS-less Spark users write: no registry, the schema given by hand).

The ratios: avro / raw (what decoding costs a read in Spark), avro / the plain loop (both cores of Spark
against the one of the loop) and, in the peer environment, avro / Spark's from_avro.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["main"]

_TYPES = ("string", "long", "double", "int", "boolean")


def schema_of(fields: int) -> dict[str, Any]:
    return {
        "type": "record",
        "name": f"Wide{fields}",
        "namespace": "bench",
        "fields": [{"name": f"f{i}", "type": _TYPES[i % len(_TYPES)]} for i in range(fields)],
    }


def record(i: int, fields: int) -> dict[str, Any]:
    values = {"string": f"value-{i}", "long": i * 7, "double": i * 0.5, "int": i % 1000, "boolean": i % 2 == 0}
    return {f"f{k}": values[_TYPES[k % len(_TYPES)]] for k in range(fields)}


def produce(bootstrap: str, registry: str, topic: str, fields: int, records: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: a dropped client cancels it
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    with confluent_client(registry) as client:
        ser = AvroSerializer(client, json.dumps(schema_of(fields)))
        ctx = SerializationContext(topic, MessageField.VALUE)
        for i in range(records):
            while True:
                try:
                    producer.produce(topic, ser(record(i, fields), ctx), partition=i % 2)
                    break
                except BufferError:
                    producer.poll(0.05)
    assert producer.flush(60) == 0


def plain_loop(bootstrap: str, registry: str, topic: str, records: int) -> float:
    """Seconds for one consumer to read and deserialize the whole topic."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    with confluent_client(registry) as client:
        de = AvroDeserializer(client)
        ctx = SerializationContext(topic, MessageField.VALUE)
        began, seen = time.perf_counter(), 0
        while seen < records:
            for m in consumer.consume(1000, 5.0):
                if m.error() is None:
                    de(m.value(), ctx)
                    seen += 1
        elapsed = time.perf_counter() - began
    consumer.close()
    return elapsed


def spark_read(spark: Any, options: dict[str, str]) -> float:
    began = time.perf_counter()
    spark.read.format("kafka-eos").options(**options).load().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def spark_from_avro(spark: Any, bootstrap: str, topic: str, schema: str | None) -> float:
    """Spark's own source into noop, each value's body decoded by ``from_avro`` with ``schema`` (None: raw)."""
    from pyspark.sql import functions as F

    began = time.perf_counter()
    df = (
        spark.read.format("kafka")
        .options(**{"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"})
        .load()
    )
    if schema is not None:
        from pyspark.sql.avro.functions import from_avro

        df = df.select(from_avro(F.expr("substring(value, 6, length(value) - 5)"), schema).alias("value"))
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def jvm_peer() -> dict[str, str] | None:
    """The session conf with Spark's Kafka connector and spark-avro, where Maven Central serves them for this
    PySpark (the peer environment); None elsewhere."""
    import pyspark

    from connectors.services.spark_kafka import SPARK_KAFKA_VERSION, session_conf

    return session_conf(avro=True) if pyspark.__version__ == SPARK_KAFKA_VERSION else None


def parse_args(prog: str, doc: str, argv: list[str] | None) -> tuple[int, int, list[int]]:
    """``--quick``, ``--records``, ``--fields``, ``--repeat`` of both Avro benchmarks: (records, repeat, fields)."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20,000 records, one run each")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--fields", type=int, nargs="+", default=[10, 50])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    records, repeat = (20_000, 1) if args.quick else (args.records, args.repeat)
    return records, repeat, list(args.fields)


def measure(runs: list[tuple[str, Callable[[], float]]], records: int, repeat: int, fields: int) -> dict[str, float]:
    """Each run once untimed (Python workers, the registry client's cache, the JVM warm), then its median of
    ``repeat`` in records/s; printed under the record width."""
    rates: dict[str, float] = {}
    for name, run in runs:
        run()
        rates[name] = records / statistics.median(run() for _ in range(repeat))
    print(f"{fields} fields:")
    for name, rate in rates.items():
        print(f"  {name:<32} {rate:>12,.0f}")
    return rates


def main(argv: list[str] | None = None) -> int:
    records, repeat, widths = parse_args("bench.avro_decode", __doc__ or "", argv)

    from connectors.services.apache_kafka import ApacheKafka
    from connectors.services.schema_registry import ApicurioRegistry
    from connectors.services.spark import local_session

    peer = jvm_peer()
    broker, registry = ApacheKafka(), ApicurioRegistry()
    spark = local_session("bench-avro", "local[2]", **(peer or {}))
    try:
        print(f"records {records:,} in 2 partitions, median of {repeat} (after one untimed read), records/s")
        if peer is None:
            print("(Spark's from_avro: run in .venv-peer, see the module's doc)")
        for fields in widths:
            topic = f"avro-{fields}-{uuid.uuid4().hex[:8]}"
            produce(broker.bootstrap, registry.url, topic, fields, records)
            base = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
            avro = {**base, "value.format": "avro", "schema.registry.url": registry.url}
            runs: list[tuple[str, Callable[[], float]]] = [
                ("kafka-eos raw", functools.partial(spark_read, spark, base)),
                ("kafka-eos avro", functools.partial(spark_read, spark, avro)),
                (
                    "plain loop + AvroDeserializer",
                    functools.partial(plain_loop, broker.bootstrap, registry.url, topic, records),
                ),
            ]
            if peer is not None:
                text = json.dumps(schema_of(fields))
                runs += [
                    ("Spark kafka raw", functools.partial(spark_from_avro, spark, broker.bootstrap, topic, None)),
                    (
                        "Spark kafka + from_avro",
                        functools.partial(spark_from_avro, spark, broker.bootstrap, topic, text),
                    ),
                ]
            rates = measure(runs, records, repeat, fields)
            line = (
                f"  avro / raw {rates['kafka-eos avro'] / rates['kafka-eos raw']:.2f}x, "
                f"avro / plain loop {rates['kafka-eos avro'] / rates['plain loop + AvroDeserializer']:.2f}x"
            )
            if peer is not None:
                line += f", avro / Spark's from_avro {rates['kafka-eos avro'] / rates['Spark kafka + from_avro']:.2f}x"
            print(line)
    finally:
        spark.stop()
        registry.stop()
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
