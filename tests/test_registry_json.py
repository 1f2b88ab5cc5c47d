"""Confluent wire-format JSON Schema without a registry: the type mapping, the decoder's projection onto the reader
schema and its refusals (a fake registry answers by id; integration/test_source_json_schema.py uses a real one)."""

from __future__ import annotations

import json
from typing import Any

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
