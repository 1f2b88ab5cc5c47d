"""kafka-eos reads Confluent wire-format JSON Schema (value.format=json-schema) with a real Schema Registry
(Apicurio, the session's): records written by confluent-kafka's own ``JSONSerializer`` (which validates each one
against the schema) are read onto the latest schema's Spark type as its ``JSONDeserializer`` reads them (the
oracle); a tombstone stays null; a record written with an Avro schema into the same topic is a decode error naming
the fix, kept aside with errors.tolerance=all; the fields read flat beside Kafka's columns."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = [pytest.mark.integration]

PAYMENT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Payment",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "amount": {"type": "integer"},
        "rate": {"type": "number"},
        "note": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["id", "amount"],
}
RECORDS = [
    {"id": "p0", "amount": 10, "rate": 0.5, "note": "first", "tags": ["a", "b"], "address": {"city": "Bern"}},
    {"id": "p1", "amount": 11},
    {"id": "p2", "amount": 2**40, "rate": 3, "note": None, "tags": []},
]


def test_json_schema_records_are_read_as_confluents_deserializer_reads_them(
    spark: Any, kafka_service: Any, schema_registry: Any, new_topic: Any, produce: Any
) -> None:
    from confluent_kafka.schema_registry import topic_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    topic = new_topic()
    ctx = SerializationContext(topic, MessageField.VALUE)
    strategy = {"subject.name.strategy": topic_subject_name_strategy}  # no associations look-up (Apicurio lacks it)
    with confluent_client(schema_registry.url) as client:
        payloads = [JSONSerializer(json.dumps(PAYMENT), client, conf=strategy)(r, ctx) for r in RECORDS]
        oracle = [JSONDeserializer(None, schema_registry_client=client)(p, ctx) for p in payloads]
        other = f"{topic}-avro"
        avro = AvroSerializer(
            client,
            '{"type": "record", "name": "A", "fields": [{"name": "id", "type": "string"}]}',
            conf={"subject.name.strategy": lambda c, n: other},
        )({"id": "x"}, ctx)
    produce(topic, [{"key": b"k", "value": p} for p in payloads] + [{"key": b"gone", "value": None}])

    options = {
        **kafka_service.app_options,
        "subscribe": topic,
        "value.format": "json-schema",
        "schema.registry.url": schema_registry.url,
        "kafkaConsumer.pollTimeoutMs": "20000",
    }
    df = spark.read.format("kafka-eos").options(**options).load()
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:string,amount:bigint,rate:double,note:string,tags:array<string>,address:struct<city:string>>"
    )
    rows = [r.asDict(recursive=True) for r in df.orderBy("offset").collect()]
    fields = list(PAYMENT["properties"])
    expected = [{f: o.get(f) for f in fields} for o in oracle]
    expected[2]["rate"] = 3.0  # an integer where a number is: a double, as from_json reads it
    assert [r["value"] for r in rows[:3]] == expected
    assert rows[3]["value"] is None and rows[3]["key"] == b"gone"  # a tombstone stays null

    # the same, flat; and a record of an Avro schema in the topic: refused, or kept aside with its error
    produce(topic, [{"key": b"avro", "value": avro}])
    with pytest.raises(Exception, match=r"written with a AVRO schema .* read it with value.format=avro"):
        spark.read.format("kafka-eos").options(**options).load().collect()
    tolerant = {**options, "value.layout": "flat", "errors.tolerance": "all"}
    flat = spark.read.format("kafka-eos").options(**tolerant).load().orderBy("offset").collect()
    assert [r["id"] for r in flat] == ["p0", "p1", "p2", None, None]
    assert flat[3]["decode_errors"] is None  # the tombstone
    (error,) = flat[4]["decode_errors"]
    assert error["column"] == "value" and bytes(error["payload"]) == avro and "value.format=avro" in error["message"]
