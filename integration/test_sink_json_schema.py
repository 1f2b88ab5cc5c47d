"""The kafka-eos sink writes Confluent wire-format JSON Schema (value.format=json-schema) with a real Schema Registry
(Apicurio, the session's): the schema derived from the column's Spark type is registered (schema type JSON) before
any task runs, every record is read back by confluent-kafka's own ``JSONDeserializer`` (the oracle, which validates
it against the registered schema) and by the kafka-eos source; a schema given inline holds constraints the Spark
type does not, and a row that breaks one fails the batch naming the row with nothing of it visible."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pytest

pytestmark = [pytest.mark.integration]

COLUMNS = (
    "key string, value struct<id:string not null, amount:bigint not null, price:decimal(10,3), "
    "at:timestamp, tags:array<string>, address:struct<city:string not null, zip:int>>"
)


def _write(df: Any, kafka_service: Any, registry: Any, topic: str, batch: int, **extra: str) -> None:
    (
        df.write.format("kafka-eos")
        .options(**kafka_service.app_options)
        .options(**{"topic": topic, "sink.id": f"json-{topic}", "batch.id": str(batch)})
        .options(**{"value.format": "json-schema", "schema.registry.url": registry.url})
        .options(**extra)
        .mode("append")
        .save()
    )


def _read(spark: Any, kafka_service: Any, topic: str, **extra: str) -> list[Any]:
    df = (
        spark.read.format("kafka-eos")
        .options(**kafka_service.app_options)
        .options(**{"subscribe": topic, "kafka.isolation.level": "read_committed", **extra})
        .load()
    )
    return list(df.orderBy("partition", "offset").collect())


def test_the_sink_registers_a_json_schema_and_writes_what_confluents_deserializer_and_the_source_read(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any
) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    topic = new_topic(partitions=2)
    at = dt.datetime(2026, 11, 29, 12, 30, 0, 250000, tzinfo=dt.timezone.utc)
    rows = [
        (
            f"k{i}",
            (
                f"p{i}",
                i * 10,
                None if i % 2 else decimal.Decimal(f"{i}.125"),
                at,
                ["a", None],
                None if i % 3 else (f"city {i}", None),
            ),
        )
        for i in range(6)
    ]
    df = spark.createDataFrame(rows, COLUMNS)
    _write(df.repartition(2), kafka_service, schema_registry, topic, 1, **{"value.record.name": "com.acme.Payment"})

    ctx = SerializationContext(topic, MessageField.VALUE)
    with confluent_client(schema_registry.url) as client:
        latest = client.get_latest_version(f"{topic}-value")
        assert latest.version == 1 and latest.schema.schema_type == "JSON"
        assert json.loads(latest.schema.schema_str)["title"] == "com.acme.Payment"
        raw = _read(spark, kafka_service, topic)
        assert {r["value"][:5] for r in raw} == {b"\x00" + latest.schema_id.to_bytes(4, "big")}
        de = JSONDeserializer(None, schema_registry_client=client)  # validates each record against the schema
        oracle = sorted((r["key"].decode(), de(r["value"], ctx)) for r in raw)

    def as_json(v: Any) -> dict[str, Any]:
        address = None if v[5] is None else {"city": v[5][0], "zip": v[5][1]}
        price = None if v[2] is None else float(v[2])
        at_text = "2026-11-29T12:30:00.250000Z"
        return {"id": v[0], "amount": v[1], "price": price, "at": at_text, "tags": v[4], "address": address}

    assert oracle == [(k, as_json(v)) for k, v in rows]

    read = _read(
        spark, kafka_service, topic, **{"value.format": "json-schema", "schema.registry.url": schema_registry.url}
    )
    assert {r["value"].asDict(recursive=True)["id"] for r in read} == {f"p{i}" for i in range(6)}
    got = sorted((r["key"].decode(), r["value"].asDict(recursive=True)) for r in read)
    assert got == [(k, as_json(v)) for k, v in rows]

    # the writer's batch again: a no-op (exactly once), the same schema, no new version
    _write(df.repartition(2), kafka_service, schema_registry, topic, 1, **{"value.record.name": "com.acme.Payment"})
    assert len(_read(spark, kafka_service, topic)) == 6
    with confluent_client(schema_registry.url) as client:
        assert client.get_versions(f"{topic}-value") == [1]


def test_a_row_breaking_an_inline_schemas_constraint_fails_its_batch_naming_the_row_and_writes_nothing(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any
) -> None:
    topic = new_topic()
    given = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Payment",
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "minimum": 0},
            "id": {"type": "string", "pattern": "^p[0-9]+$"},
        },
        "required": ["id", "amount"],
    }
    df = spark.createDataFrame(
        [("k1", ("p1", 5)), ("k2", ("p2", -3))], "key string, value struct<id:string not null, amount:bigint not null>"
    ).coalesce(1)
    with pytest.raises(Exception) as err:
        _write(df, kafka_service, schema_registry, topic, 1, **{"value.schema": json.dumps(given)})
    text = str(err.value)
    assert "row 1 of the batch: the value cannot be written with schema id" in text and "amount: -3 is less" in text
    assert _read(spark, kafka_service, topic) == []  # visibility=batch: nothing of the batch
    # the same batch with the row fixed is written once, validated, under the inline schema's subject
    fixed = spark.createDataFrame(
        [("k1", ("p1", 5)), ("k2", ("p2", 3))], "key string, value struct<id:string not null, amount:bigint not null>"
    ).coalesce(1)
    _write(fixed, kafka_service, schema_registry, topic, 1, **{"value.schema": json.dumps(given)})
    values = [json.loads(r["value"][5:]) for r in _read(spark, kafka_service, topic)]
    assert values == [{"id": "p1", "amount": 5}, {"id": "p2", "amount": 3}]


def test_a_changed_property_type_is_refused_before_anything_is_written_and_an_added_nullable_one_is_the_next_version(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any
) -> None:
    """Lifecycle rows: the query changes its value struct under BACKWARD compatibility (Confluent's default). A
    property's type changed: the registry refuses the derived schema, the batch fails naming the subject, nothing
    of it visible. A nullable field added (an optional property of a closed object): the next version."""
    from connectors.services.schema_registry import confluent_client

    topic = new_topic()
    subject = f"{topic}-value"
    _write(
        spark.createDataFrame([("a", (1,))], "key string, value struct<n:bigint not null>"),
        kafka_service,
        schema_registry,
        topic,
        1,
    )
    with confluent_client(schema_registry.url) as client:
        client.set_compatibility(subject, "BACKWARD")

    changed = spark.createDataFrame([("b", ("x",))], "key string, value struct<n:string not null>")
    with pytest.raises(Exception) as refused:
        _write(changed, kafka_service, schema_registry, topic, 2)
    text = str(refused.value)
    assert f"subject {subject!r}" in text and "incompatible" in text and "a new property is optional" in text, text[
        -1500:
    ]
    assert len(_read(spark, kafka_service, topic)) == 1  # nothing of batch 2

    added = spark.createDataFrame([("c", (3, "new"))], "key string, value struct<n:bigint not null, tag:string>")
    _write(added, kafka_service, schema_registry, topic, 3)
    with confluent_client(schema_registry.url) as client:
        assert client.get_latest_version(subject).version == 2
    read = _read(
        spark, kafka_service, topic, **{"value.format": "json-schema", "schema.registry.url": schema_registry.url}
    )
    assert [(r["key"].decode(), r["value"].asDict()) for r in read] == [
        ("a", {"n": 1, "tag": None}),
        ("c", {"n": 3, "tag": "new"}),
    ]
