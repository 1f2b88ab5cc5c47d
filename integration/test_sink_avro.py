"""The kafka-eos sink writes Confluent wire-format Avro (value.format=avro, key.format=avro) with a real Schema
Registry: the schema derived from the column's Spark type is registered before any task runs, every record is
read back by confluent-kafka's own AvroDeserializer (the oracle) and by the kafka-eos source, an incompatible
change is refused by the registry before anything of its batch is visible, and a compatible one becomes the
subject's next version."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

pytestmark = [pytest.mark.integration]


def _write(df: Any, kafka_service: Any, registry: Any, topic: str, batch: int, **extra: str) -> None:
    (
        df.write.format("kafka-eos")
        .options(**kafka_service.app_options)
        .option("topic", topic)
        .option("sink.id", f"avro-{topic}")
        .option("visibility", "partition")
        .option("batch.id", str(batch))
        .option("value.format", "avro")
        .option("schema.registry.url", registry.url)
        .options(**extra)
        .mode("append")
        .save()
    )


def _raw(spark: Any, kafka_service: Any, topic: str) -> list[Any]:
    df = (
        spark.read.format("kafka-eos")
        .options(**kafka_service.app_options)
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    return [r for r in df.orderBy("partition", "offset").collect()]


def test_the_sink_registers_the_columns_schema_and_writes_what_confluents_deserializer_and_the_source_read(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    topic = new_topic(partitions=2)
    rows = [(f"k{i}", (f"p{i}", i * 10, None if i % 2 else f"note {i}")) for i in range(6)]
    df = spark.createDataFrame(
        rows, "key string, value struct<id:string not null, amount:bigint not null, note:string>"
    )
    _write(df.repartition(2), kafka_service, schema_registry, topic, 1)

    with confluent_client(schema_registry.url) as client:
        latest = client.get_latest_version(f"{topic}-value")
        assert (
            latest.version == 1 and '"name":"note","type":["null","string"],"default":null' in latest.schema.schema_str
        )
        de = AvroDeserializer(client)
        ctx = SerializationContext(topic, MessageField.VALUE)
        raw = _raw(spark, kafka_service, topic)
        assert {r["value"][1:5] for r in raw} == {latest.schema_id.to_bytes(4, "big")}  # the registered id, each
        oracle = sorted((r["key"].decode(), de(r["value"], ctx)) for r in raw)
    assert oracle == [(k, {"id": v[0], "amount": v[1], "note": v[2]}) for k, v in rows]

    read = (
        spark.read.format("kafka-eos")
        .options(**kafka_service.app_options)
        .options(**{"subscribe": topic, "value.format": "avro", "schema.registry.url": schema_registry.url})
        .load()
    )
    assert read.schema["value"].dataType.simpleString() == "struct<id:string,amount:bigint,note:string>"
    assert sorted((r["key"].decode(), tuple(r["value"])) for r in read.collect()) == rows

    # the writer's batch again: a no-op (exactly once), with the same schema id
    _write(df.repartition(2), kafka_service, schema_registry, topic, 1)
    assert len(_raw(spark, kafka_service, topic)) == 6
    # a restarted driver registers the same schema again (auto): the registry answers its id, no new version
    from confluent_kafka.schema_registry import Schema

    with confluent_client(schema_registry.url) as client:
        again = client.register_schema(f"{topic}-value", Schema(latest.schema.schema_str, "AVRO"))
        assert again == latest.schema_id and client.get_versions(f"{topic}-value") == [1]


def test_rows_naming_their_topics_register_one_subject_by_the_record_name_strategy(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any
) -> None:
    """value.subject.name.strategy=record (Confluent's RecordNameStrategy): the subject is the record's full name,
    so rows that name their own topics share it; confluent-kafka's deserializer and the source read each topic."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    topics = [new_topic(), new_topic()]
    record = f"com.acme.Payment{uuid.uuid4().hex[:8]}"
    rows = [(topics[i % 2], f"k{i}", (f"p{i}", i)) for i in range(6)]
    df = spark.createDataFrame(rows, "topic string, key string, value struct<id:string not null, n:bigint not null>")
    (
        df.write.format("kafka-eos")
        .options(**kafka_service.app_options)
        .option("marker.topic", topics[0])
        .option("sink.id", f"avro-{record}")
        .option("batch.id", "1")
        .option("value.format", "avro")
        .option("schema.registry.url", schema_registry.url)
        .option("value.subject.name.strategy", "io.confluent.kafka.serializers.subject.RecordNameStrategy")
        .option("value.record.name", record)
        .mode("append")
        .save()
    )
    with confluent_client(schema_registry.url) as client:
        subjects = client.get_subjects()
        assert record in subjects and not any(t in s for t in topics for s in subjects), subjects
        latest = client.get_latest_version(record)
        registered = json.loads(latest.schema.schema_str)
        full = ".".join(filter(None, (registered.get("namespace"), registered["name"])))
        assert full == record and latest.version == 1, latest.schema.schema_str  # the record, named by the option
        de = AvroDeserializer(client)
        for topic in topics:
            raw = _raw(spark, kafka_service, topic)
            got = sorted(
                (r["key"].decode(), de(r["value"], SerializationContext(topic, MessageField.VALUE))) for r in raw
            )
            assert got == [(k, {"id": v[0], "n": v[1]}) for t, k, v in rows if t == topic]
    read = (
        spark.read.format("kafka-eos")
        .options(**kafka_service.app_options)
        .options(**{"subscribe": topics[1], "value.format": "avro", "schema.registry.url": schema_registry.url})
        .option("value.subject", record)  # the source's reader schema: the record's subject
        .load()
    )
    assert sorted(tuple(r["value"]) for r in read.collect()) == [v for t, _, v in rows if t == topics[1]]


def test_an_incompatible_column_is_refused_before_anything_is_written_and_a_compatible_one_is_the_next_version(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any
) -> None:
    """Lifecycle rows: the query changes its value struct. A field's type changed (BACKWARD compatibility, as
    Confluent's registry defaults to): the registry refuses the new schema, the batch fails naming the subject
    and nothing of it is visible. A nullable field added: the subject's next version, old records read with
    it as null."""
    from connectors.services.schema_registry import confluent_client

    topic = new_topic()
    subject = f"{topic}-value"
    v1 = spark.createDataFrame([("a", (1,))], "key string, value struct<n:bigint not null>")
    _write(v1, kafka_service, schema_registry, topic, 1)
    with confluent_client(schema_registry.url) as client:
        client.set_compatibility(subject, "BACKWARD")

    changed = spark.createDataFrame([("b", ("x",))], "key string, value struct<n:string not null>")
    with pytest.raises(Exception) as refused:
        _write(changed, kafka_service, schema_registry, topic, 2)
    text = str(refused.value)
    assert f"subject {subject!r}" in text and "incompatible" in text and "(value.subject)" in text, text[-1500:]
    assert len(_raw(spark, kafka_service, topic)) == 1  # nothing of batch 2

    added = spark.createDataFrame([("c", (3, "new"))], "key string, value struct<n:bigint not null, tag:string>")
    _write(added, kafka_service, schema_registry, topic, 3)
    with confluent_client(schema_registry.url) as client:
        assert client.get_latest_version(subject).version == 2
    read = (
        spark.read.format("kafka-eos")
        .options(**kafka_service.app_options)
        .options(**{"subscribe": topic, "value.format": "avro", "schema.registry.url": schema_registry.url})
        .load()
    )
    assert sorted((r["key"].decode(), r["value"].asDict()) for r in read.collect()) == [
        ("a", {"n": 1, "tag": None}),
        ("c", {"n": 3, "tag": "new"}),
    ]


def test_a_write_names_what_is_missing(spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any) -> None:
    topic = new_topic()
    df = spark.createDataFrame([("a", (1,))], "key string, value struct<n:bigint>")
    with pytest.raises(Exception, match=r"set option 'schema.registry.url'"):
        _write(df, kafka_service, schema_registry, topic, 1, **{"schema.registry.url": ""})
    with pytest.raises(
        Exception, match=r"column 'value' is struct<n:bigint>; it must be string or binary .*value.format=avro"
    ):
        _write(df, kafka_service, schema_registry, topic, 1, **{"value.format": "raw"})
    pinned = {"value.schema": "version:1", "value.subject": f"none-{uuid.uuid4().hex[:8]}"}
    with pytest.raises(Exception, match=r"has no subject|no version 1|value.schema"):
        _write(df, kafka_service, schema_registry, topic, 1, **pinned)


def test_a_stream_reads_avro_and_writes_avro_exactly_once_through_a_staged_batch(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any, produce: Any, tmp_path: Any
) -> None:
    """Kafka -> Spark -> Kafka in Avro both ways: records of two writer schemas decoded onto the latest, changed,
    and written by the sink (visibility=batch: staged, then published by the driver) under the output topic's
    subject; stopped and restarted from its checkpoint, every record is in the output once."""
    import json

    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from pyspark.sql import functions as F

    from connectors.services.schema_registry import confluent_client

    src, out = new_topic(partitions=2), new_topic()
    v1 = {
        "type": "record",
        "name": "Payment",
        "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
    }
    v2 = {**v1, "fields": [*v1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
    ctx = SerializationContext(src, MessageField.VALUE)
    with confluent_client(schema_registry.url) as client:
        first = [AvroSerializer(client, json.dumps(v1))({"id": f"a{i}", "amount": i}, ctx) for i in range(4)]
        second = [
            AvroSerializer(client, json.dumps(v2))({"id": f"b{i}", "amount": i, "currency": "CHF"}, ctx)
            for i in range(4)
        ]

    def run() -> None:
        query = (
            spark.readStream.format("kafka-eos")
            .options(**kafka_service.app_options)
            .options(**{"subscribe": src, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "3"})
            .options(**{"value.format": "avro", "schema.registry.url": schema_registry.url})
            .load()
            .select(
                F.col("value.id").alias("key"),
                F.struct(
                    F.col("value.id").alias("id"), (F.col("value.amount") * 100).alias("cents"), "value.currency"
                ).alias("value"),
            )
            .writeStream.format("kafka-eos")
            .options(**kafka_service.app_options)
            .options(**{"topic": out, "sink.id": f"avro-{out}", "value.format": "avro"})
            .option("schema.registry.url", schema_registry.url)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(240) is not False and query.exception() is None

    produce(src, [{"value": p, "partition": i % 2} for i, p in enumerate(first)])
    run()
    produce(src, [{"value": p, "partition": i % 2} for i, p in enumerate(second)])
    run()  # the restart: only what the checkpoint has not read
    with confluent_client(schema_registry.url) as client:
        de = AvroDeserializer(client)
        got = sorted(
            (
                r["key"].decode(),
                json.dumps(de(r["value"], SerializationContext(out, MessageField.VALUE)), sort_keys=True),
            )
            for r in _raw(spark, kafka_service, out)
        )
    want = [(f"a{i}", {"id": f"a{i}", "cents": i * 100, "currency": "EUR"}) for i in range(4)]
    want += [(f"b{i}", {"id": f"b{i}", "cents": i * 100, "currency": "CHF"}) for i in range(4)]
    assert got == sorted((k, json.dumps(v, sort_keys=True)) for k, v in want)  # each once
