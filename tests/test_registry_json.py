"""Confluent wire-format JSON Schema without a registry: the type mapping, the decoder's projection onto the reader
schema and its refusals (a fake registry answers by id; integration/test_source_json_schema.py uses a real one)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from eos_core import registry_avro as ra
from eos_core import registry_json as rj
from eos_core.errors import ConfigError, FatalError

PAYMENT = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "amount": {"type": "integer"},
        "rate": {"type": "number"},
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"oneOf": [{"type": "null"}, {"type": "integer"}]}},
            "required": ["city"],
        },
        "kind": {"enum": ["CARD", "CASH"]},
    },
    "required": ["id", "amount"],
}


class _Schema:
    def __init__(self, schema: Any, kind: str | None) -> None:
        self.schema_str, self.schema_type, self.references = json.dumps(schema), kind, []


class _Registry:
    def __init__(self) -> None:
        self.asked: list[int] = []

    def get_schema(self, schema_id: int) -> _Schema:
        self.asked.append(schema_id)
        return {1: _Schema(PAYMENT, "JSON"), 2: _Schema({"type": "string"}, None)}[schema_id]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> _Registry:
    fake = _Registry()
    monkeypatch.setattr(ra, "_client", lambda conf: fake)
    return fake


def _wire(schema_id: int, record: Any) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + json.dumps(record).encode()


def _decoder(reader: Any = PAYMENT, *, tolerate: bool = False) -> rj.JsonSchemaDecoder:
    text = json.dumps(reader)
    spark, _ = rj.spark_type(text)
    return rj.JsonSchemaDecoder(
        ra.RegistryConf("http://r"), ra.ReaderSchema(text, None, None), spark, column="value", tolerate=tolerate
    )


def _where(i: int) -> str:
    return f"topic t partition 0 offset {10 + i}"


def test_json_schema_types_map_to_spark_types() -> None:
    spark, nullable = rj.spark_type(json.dumps(PAYMENT))
    assert not nullable
    assert spark.simpleString() == (
        "struct<id:string,amount:bigint,rate:double,paid:boolean,note:string,tags:array<string>,"
        "counts:map<string,bigint>,address:struct<city:string,zip:bigint>,kind:string>"
    )
    fields = {f.name: f for f in spark.fields}
    assert not fields["id"].nullable and not fields["amount"].nullable  # required
    assert fields["rate"].nullable and fields["note"].nullable  # not required / admits null
    assert [f.nullable for f in fields["address"].dataType.fields] == [False, True]


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"$ref": "#/definitions/P"}, r"is a reference .* give the schema inline"),
        ({"type": ["string", "integer"]}, r"one of several types \(string, integer\)"),
        ({"type": "object"}, r"neither properties nor a schema of additionalProperties"),
        ({"type": "object", "properties": {"x": {"type": "array"}}}, r"x is an array without items"),
        ({"type": "object", "properties": {"x": {"type": "date"}}}, r"x has type 'date'"),
    ],
)
def test_a_json_schema_with_no_spark_type_is_refused_naming_the_property(schema: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rj.spark_type(json.dumps(schema))


def test_records_are_read_onto_the_reader_and_what_does_not_fit_is_a_decode_error_naming_it(
    registry: _Registry,
) -> None:
    record = {
        "id": "p1",
        "amount": 12,
        "rate": 1,  # an integer where a number is: a number
        "paid": True,
        "tags": ["a"],
        "counts": {"x": 2},
        "address": {"city": "Bern"},
        "kind": "CARD",
        "extra": "the reader lacks it: skipped",
    }
    out = _decoder().decode([_wire(1, record), None], _where).to_pylist()
    assert out[1] is None  # a tombstone
    assert out[0] == {
        "id": "p1",
        "amount": 12,
        "rate": 1.0,
        "paid": True,
        "note": None,
        "tags": ["a"],
        "counts": [("x", 2)],
        "address": {"city": "Bern", "zip": None},
        "kind": "CARD",
    }
    assert registry.asked == [1]  # the writer schema fetched once and kept
    for bad, why in (
        ({"amount": 1}, r"offset 10: .* id is null or missing, and the reader schema requires it"),
        ({"id": "p", "amount": "12"}, r"amount is \"12\", not bigint"),
        ({"id": "p", "amount": True}, r"amount is true, not bigint"),
        ({"id": "p", "amount": 1, "address": {"zip": 1}}, r"address.city is null or missing"),
    ):
        with pytest.raises(FatalError, match=why):
            _decoder().decode([_wire(1, bad)], _where)
    with pytest.raises(FatalError, match=r"cannot be read with the reader schema: Expecting value"):
        _decoder().decode([b"\x00\x00\x00\x00\x01not json"], _where)
    with pytest.raises(FatalError, match=r"not in Confluent's wire format"):
        _decoder().decode([b'{"id": "p"}'], _where)
    with pytest.raises(
        FatalError, match=r"written with a AVRO schema \(id 2\), not a JSON Schema: read it with value.format=avro"
    ):
        _decoder().decode([_wire(2, "x")], _where)


def test_a_tolerant_decode_keeps_the_record_as_an_error(registry: _Registry) -> None:
    errors: dict[int, tuple[int | None, str]] = {}
    out = _decoder(tolerate=True).decode([_wire(1, {"id": "p", "amount": 1}), _wire(1, {"id": 5})], _where, errors)
    assert out.to_pylist()[0]["id"] == "p" and out.to_pylist()[1] is None
    assert list(errors) == [1] and errors[1][0] == 1 and "offset 11" in errors[1][1]


def test_the_reader_schema_must_be_a_json_schema_for_json_schema_and_avro_for_avro(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Found:
        def __init__(self, kind: str | None, text: str) -> None:
            self.schema, self.schema_id = _Schema(json.loads(text), kind), 4

    class Client:
        kind: str | None = "JSON"

        def get_version(self, subject: str, version: Any) -> Found:
            return Found(self.kind, json.dumps(PAYMENT) if self.kind == "JSON" else '"string"')

    client = Client()
    monkeypatch.setattr(ra, "_client", lambda conf: client)
    conf = ra.RegistryConf("http://r")
    assert (
        ra.reader_schema(conf, "t-value", "latest", option="value.schema", kind="JSON", parse=rj.parse_schema).schema_id
        == 4
    )
    with pytest.raises(ConfigError, match=r"is JSON, and value.format reads AVRO: set value.format=json-schema"):
        ra.reader_schema(conf, "t-value", "latest", option="value.schema")
    client.kind = None
    with pytest.raises(ConfigError, match=r"is AVRO, and value.format reads JSON: set value.format=avro"):
        ra.reader_schema(conf, "t-value", "latest", option="value.schema", kind="JSON", parse=rj.parse_schema)
    inline = ra.reader_schema(
        conf, "t-value", json.dumps(PAYMENT), option="value.schema", kind="JSON", parse=rj.parse_schema
    )
    assert inline.schema_id is None and json.loads(inline.text) == PAYMENT
    with pytest.raises(ConfigError, match=r"a JSON Schema is a JSON object"):
        ra.reader_schema(conf, "t-value", '"string"', option="value.schema", kind="JSON", parse=rj.parse_schema)


def test_a_decoder_travels_to_the_executors_as_its_options(registry: _Registry) -> None:
    import pickle

    decoder = pickle.loads(pickle.dumps(_decoder()))
    assert decoder.decode([_wire(1, {"id": "p", "amount": 1})], _where).to_pylist()[0]["amount"] == 1


def _columns() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DecimalType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    address = StructType([StructField("city", StringType(), False), StructField("zip", IntegerType(), True)])
    return StructType(
        [
            StructField("id", StringType(), False),
            StructField("price", DecimalType(10, 3), True),
            StructField("at", TimestampType(), True),
            StructField("blob", BinaryType(), True),
            StructField("tags", ArrayType(StringType(), True), True),
            StructField("counts", MapType(StringType(), IntegerType(), False), True),
            StructField("address", address, True),
        ]
    )


def test_a_struct_column_derives_a_closed_draft7_schema_whose_nullable_fields_are_optional() -> None:
    schema = rj.json_schema(_columns(), title="com.acme.Pay")
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#" and schema["title"] == "com.acme.Pay"
    assert schema["required"] == ["id"] and schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["id"] == {"type": "string"}
    assert props["price"] == {"oneOf": [{"type": "null"}, {"type": "number"}]}
    assert props["at"]["oneOf"][1] == {"type": "string", "format": "date-time"}
    assert props["blob"]["oneOf"][1] == {"type": "string", "contentEncoding": "base64"}
    assert props["tags"]["oneOf"][1] == {"type": "array", "items": {"oneOf": [{"type": "null"}, {"type": "string"}]}}
    assert props["counts"]["oneOf"][1] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["address"]["oneOf"][1]["required"] == ["city"]
    # read back: integers bigint, decimals double, timestamps and binary strings; fields by name
    assert rj.read_as(_columns()) == (
        "struct<address:struct<city:string,zip:bigint>,at:string,blob:string,counts:map<string,bigint>,id:string,"
        "price:double,tags:array<string>>"
    )
    from pyspark.sql.types import IntegerType, MapType, StringType, StructField, StructType

    with pytest.raises(ConfigError, match=r"m is map<int,string>: a JSON object's keys are strings"):
        rj.json_schema(StructType([StructField("m", MapType(IntegerType(), StringType()))]))
    with pytest.raises(ConfigError, match=r"json-schema writes a struct"):
        rj.json_schema(StringType())


def test_the_encoder_writes_json_text_after_the_header_a_decimal_with_its_own_digits() -> None:
    import datetime as dt
    import decimal
    import pickle

    row = {
        "id": "p\u00e9",
        "price": decimal.Decimal("12.340"),
        "at": dt.datetime(2026, 11, 29, 12, 0, 1, 5, tzinfo=dt.timezone.utc),
        "blob": b"\x00\xff",
        "tags": ["x", None],
        "counts": [("a", 1)],
        "address": {"city": "Bern", "zip": None},
    }
    encoder = pickle.loads(pickle.dumps(rj.JsonSchemaEncoder("{}", 9, _columns(), column="value", validate=False)))
    (payload, tombstone) = encoder.encode([row, None], lambda i: f"row {i}")
    assert tombstone is None and payload is not None and payload[:5] == b"\x00\x00\x00\x00\x09"
    assert payload[5:].decode() == (
        '{"id":"p\u00e9","price":12.340,"at":"2026-11-29T12:00:01.000005Z","blob":"AP8=","tags":["x",null],'
        '"counts":{"a":1},"address":{"city":"Bern","zip":null}}'
    )
    from pyspark.sql.types import DoubleType, StructField, StructType

    ratio = StructType([StructField("r", DoubleType(), True)])
    with pytest.raises(
        FatalError,
        match=r"row 1: the value cannot be written with schema id 9: a float is NaN or infinite, not a JSON number",
    ):
        rj.JsonSchemaEncoder("{}", 9, ratio, column="value", validate=False).encode(
            [{"r": 1.0}, {"r": float("inf")}], lambda i: f"row {i}"
        )
    from pyspark.sql.types import DecimalType

    mixed = StructType([StructField("r", DoubleType(), True), StructField("d", DecimalType(5, 2), True)])  # by parts
    with pytest.raises(FatalError, match=r"row 0: .*: a float is NaN or infinite"):
        rj.JsonSchemaEncoder("{}", 9, mixed, column="value", validate=False).encode(
            [{"r": float("nan"), "d": None}], lambda i: f"row {i}"
        )


def test_a_given_schema_checks_each_value_against_its_constraints_naming_the_row_and_the_property() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    columns = StructType([StructField("id", StringType(), False), StructField("kind", StringType(), True)])
    given = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^p[0-9]+$"}, "kind": {"enum": ["CARD", "CASH", None]}},
        "required": ["id"],
    }
    encoder = rj.JsonSchemaEncoder(json.dumps(given), 3, columns, column="value", validate=True)
    assert len(encoder.encode([{"id": "p1", "kind": "CARD"}, {"id": "p2", "kind": None}], _where)) == 2
    with pytest.raises(
        FatalError, match=r"offset 11: the value cannot be written with schema id 3: kind: 'GOLD' is not"
    ):
        encoder.encode([{"id": "p1", "kind": "CASH"}, {"id": "p2", "kind": "GOLD"}], _where)
    with pytest.raises(FatalError, match=r"id: 'x' does not match"):
        encoder.encode([{"id": "x", "kind": None}], _where)
    # a schema that is no valid JSON Schema is refused when the writer is built, naming the option
    with pytest.raises(ConfigError, match=r"option 'value.schema': not a valid JSON Schema") as err:
        rj.JsonSchemaEncoder('{"type": 5}', 3, columns, column="value", validate=True)
    assert err.value.option == "value.schema"


def test_the_sink_registers_a_json_schema_and_refuses_a_given_one_its_column_does_not_read_back_as(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from sinks.kafka import formats
    from sinks.kafka.options import parse_options

    registered: list[tuple[str, str, str]] = []

    def register(conf: Any, subject: str, text: str, *, option: str, kind: str = "AVRO") -> int:
        registered.append((subject, kind, json.loads(text).get("title")))
        return 8

    monkeypatch.setattr(formats, "register", register)
    value = StructType([StructField("id", StringType(), False), StructField("n", IntegerType(), True)])
    schema = StructType([StructField("value", value, True)])
    base = {
        "kafka.bootstrap.servers": "b:1",
        "topic": "pay",
        "sink.id": "s",
        "batch.id": "1",
        "value.format": "json-schema",
        "schema.registry.url": "http://r",
    }

    def encoder(**options: str) -> Any:
        return formats.column_encoders(parse_options({**base, **options}, streaming=False), schema)["value"]

    auto = encoder(**{"value.record.name": "com.acme.Pay"})
    assert registered[-1] == ("pay-value", "JSON", "com.acme.Pay") and not auto.validate
    assert auto.encode([{"id": "a", "n": 1}], _where) == [b'\x00\x00\x00\x00\x08{"id":"a","n":1}']
    # a schema given inline: its properties in any order, integer for int; its title names the record; validated
    given = {"title": "Pay", "type": "object", "properties": {"n": {"type": "integer"}, "id": {"type": "string"}}}
    inline = encoder(**{"value.schema": json.dumps(given), "value.subject.name.strategy": "record"})
    assert registered[-1] == ("Pay", "JSON", "Pay") and inline.validate
    wrong = {**given, "properties": {"id": {"type": "string"}, "n": {"type": "string"}}}
    with pytest.raises(
        ConfigError, match=r"the value column is struct<id:string,n:bigint>.*writes struct<id:string,n:string>"
    ) as err:
        encoder(**{"value.schema": json.dumps(wrong)})
    assert err.value.option == "value.schema"
    # a registered schema must be a JSON Schema: an Avro one under json-schema names the format that writes it
    monkeypatch.setattr(ra, "_client", lambda conf: _Registry())

    class _Avro:
        schema = _Schema({"type": "string"}, None)
        schema_id = 2

    monkeypatch.setattr(_Registry, "get_version", lambda self, subject, version: _Avro(), raising=False)
    with pytest.raises(
        ConfigError,
        match=r"schema 2 \(subject 'pay-value'\) is AVRO, and value.format reads JSON: set value.format=avro",
    ):
        encoder(**{"value.schema": "latest"})
    with pytest.raises(ConfigError, match=r"set option 'schema.registry.url'"):
        formats.column_encoders(parse_options({**base, "schema.registry.url": ""}, streaming=False), schema)


def test_timestamps_are_written_in_utc_and_decimals_validated_as_decimals() -> None:
    """From an independent review: a timestamp column in a session's other time zone is written as RFC 3339 in UTC
    (the same bytes whatever the zone); a given schema's multipleOf and bounds judge decimals exactly."""
    import datetime as dt
    import decimal

    from pyspark.sql.types import DecimalType, StructField, StructType, TimestampType

    columns = StructType([StructField("at", TimestampType(), False)])
    kolkata = pa.array(
        [{"at": dt.datetime(1850, 1, 1, tzinfo=dt.timezone.utc)}],
        pa.struct([("at", pa.timestamp("us", "Asia/Kolkata"))]),
    )
    encoder = rj.JsonSchemaEncoder("{}", 1, columns, column="value", validate=False)
    assert encoder.encode_arrow(kolkata, _where).to_pylist() == [b'\x00\x00\x00\x00\x01{"at":"1850-01-01T00:00:00Z"}']

    price = StructType([StructField("p", DecimalType(30, 20), False)])
    cents = {"type": "object", "properties": {"p": {"type": "number", "multipleOf": 0.01}}}
    strict = rj.JsonSchemaEncoder(json.dumps(cents), 2, price, column="value", validate=True)
    assert len(strict.encode([{"p": decimal.Decimal("1.15")}], _where)) == 1  # a float 1.15 is no multiple of 0.01
    bounded = {"type": "object", "properties": {"p": {"type": "number", "maximum": 1}}}
    strict = rj.JsonSchemaEncoder(json.dumps(bounded), 2, price, column="value", validate=True)
    with pytest.raises(FatalError, match=r"p: .* is greater than the maximum of 1"):  # as a float: 1.0
        strict.encode([{"p": decimal.Decimal("1.00000000000000000001")}], _where)
