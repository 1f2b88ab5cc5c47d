"""Confluent wire-format Avro without a registry: the type mapping, the reader schema options, the decoder's
projection and its refusals (a fake registry answers by id; integration/test_source_avro.py uses a real one)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from eos_core import registry_avro as ra
from eos_core.errors import ConfigError, FatalError

V1 = {"type": "record", "name": "P", "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "int"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "cur", "type": "string", "default": "EUR"}]}


def _encode(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


class _Schema:
    def __init__(self, schema: dict[str, Any], kind: str = "AVRO") -> None:
        self.schema_str, self.schema_type, self.references = json.dumps(schema), kind, []


class _Registry:
    def __init__(self, by_id: dict[int, _Schema]) -> None:
        self.by_id = by_id
        self.asked: list[int] = []

    def get_schema(self, schema_id: int) -> _Schema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        self.asked.append(schema_id)
        if schema_id not in self.by_id:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.by_id[schema_id]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> _Registry:
    fake = _Registry({1: _Schema(V1), 2: _Schema(V2), 3: _Schema({"type": "string"}, kind="PROTOBUF")})
    monkeypatch.setattr(ra, "_client", lambda conf: fake)
    monkeypatch.setattr(ra, "_MISSING_RETRY_S", 0.0)
    return fake


def _decoder(reader: dict[str, Any]) -> ra.AvroDecoder:
    text = json.dumps(reader)
    spark, _ = ra.spark_type(text)
    return ra.AvroDecoder(
        ra.RegistryConf("http://r"),
        ra.ReaderSchema(text, None, None),
        spark,
        column="value",
    )


def _where(i: int) -> str:
    return f"topic t partition 0 offset {10 + i}"


def test_records_of_two_writer_schemas_are_projected_onto_the_reader_and_each_id_is_fetched_once(
    registry: _Registry,
) -> None:
    decoder = _decoder(V2)
    payloads = [
        _encode(1, V1, {"id": "a", "n": 1}),
        None,
        _encode(2, V2, {"id": "b", "n": 2, "cur": "USD"}),
        _encode(1, V1, {"id": "c", "n": 3}),
    ]
    out = decoder.decode(payloads, _where)
    assert out.to_pylist() == [
        {"id": "a", "n": 1, "cur": "EUR"},
        None,
        {"id": "b", "n": 2, "cur": "USD"},
        {"id": "c", "n": 3, "cur": "EUR"},
    ]
    assert out.type == pa.struct(
        [pa.field("id", pa.string(), False), pa.field("n", pa.int32(), False), pa.field("cur", pa.string(), False)]
    )
    assert registry.asked == [1, 2]  # the writer schemas are kept per process


def test_a_decoder_travels_to_the_executors_without_its_parsed_schemas(registry: _Registry) -> None:
    import pickle

    decoder = pickle.loads(pickle.dumps(_decoder(V1)))
    assert decoder.decode([_encode(1, V1, {"id": "a", "n": 1})], _where).to_pylist() == [{"id": "a", "n": 1}]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"plain text", "not in Confluent's wire format (magic byte 112, 10 bytes)"),
        (b"\x00\x00", "not in Confluent's wire format (magic byte 0, 2 bytes)"),
        (b"\x00\x00\x00\x00\x09abc", "has no schema id 9"),
        (b"\x00\x00\x00\x00\x03abc", "written with a PROTOBUF schema (id 3), not Avro"),
        (b"\x00\x00\x00\x00\x01\x02", "(writer schema id 1) cannot be read with the reader schema given inline"),
    ],
)
def test_a_record_that_cannot_be_read_fails_naming_where_it_is(
    registry: _Registry, payload: bytes, message: str
) -> None:
    good = _encode(1, V1, {"id": "a", "n": 1})
    with pytest.raises(FatalError) as err:
        _decoder(V1).decode([good, payload], _where)
    assert message in str(err.value) and "topic t partition 0 offset 11" in str(err.value), str(err.value)
    # errors.tolerance=all: the same record is a null and an error naming it; the others decode
    errors: dict[int, tuple[int | None, str]] = {}
    out = _decoder(V1).decode([good, payload, good], _where, errors)
    assert out.to_pylist() == [{"id": "a", "n": 1}, None, {"id": "a", "n": 1}]
    assert list(errors) == [1] and message in errors[1][1] and "offset 11" in errors[1][1], errors
    wire = len(payload) >= 5 and payload[0] == 0
    assert errors[1][0] == (int.from_bytes(payload[1:5], "big") if wire else None)  # the id, when it had one


def test_an_unreachable_registry_fails_a_tolerant_decode_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """errors.tolerance=all keeps records that cannot be decoded, never records the registry could not be asked
    about: those would be dead-lettered for a passing outage."""
    from eos_core.errors import RetriableError

    decoder = ra.AvroDecoder(
        ra.RegistryConf("http://127.0.0.1:9"),
        ra.ReaderSchema(json.dumps(V1), None, None),
        ra.spark_type(json.dumps(V1))[0],
        column="value",
        tolerate=True,
    )
    with pytest.raises(RetriableError, match="could not be reached"):
        decoder.decode([_encode(1, V1, {"id": "a", "n": 1})], _where, {})


def test_a_tolerant_batch_keeps_undecodable_records_with_every_columns_error_and_bytes(registry: _Registry) -> None:
    from sources.kafka.datasource import kafka_schema
    from sources.kafka.formats import DECODE_ERRORS, decode_batch, decoded_schema

    text = json.dumps(V1)

    def decoder(column: str) -> ra.AvroDecoder:
        reader = ra.ReaderSchema(text, None, None)
        return ra.AvroDecoder(ra.RegistryConf("http://r"), reader, ra.spark_type(text)[0], column=column, tolerate=True)

    good = _encode(1, V1, {"id": "a", "n": 1})
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [good, good, b"KEYJUNK", None],
            "value": [good, b"junk", b"VALUEJUNK", None],
            "topic": ["t"] * 4,
            "partition": [0] * 4,
            "offset": [10, 11, 12, 13],
        },
    )
    out = decode_batch(batch, {"key": decoder("key"), "value": decoder("value")})
    assert out.schema.names == ["key", "value", "topic", "partition", "offset", "decode_errors"]
    assert out.column("value").to_pylist() == [{"id": "a", "n": 1}, None, None, None]  # a tombstone is no error
    errors = out.column("decode_errors").to_pylist()
    assert errors[0] is None and errors[3] is None
    assert [(e["column"], e["payload"], e["schema_id"]) for e in errors[1]] == [("value", b"junk", None)]
    assert "topic t partition 0 offset 11" in errors[1][0]["message"]
    # both columns of one record undecodable: both errors, both payloads kept (nothing of the record is lost)
    assert [(e["column"], e["payload"]) for e in errors[2]] == [("key", b"KEYJUNK"), ("value", b"VALUEJUNK")]
    planned = decoded_schema(kafka_schema(False), {"value": decoder("value")})
    assert planned.fields[-1] == DECODE_ERRORS and planned.names[-1] == "decode_errors"


def test_a_flat_layout_puts_the_values_fields_in_its_place_nulled_by_a_tombstone_or_a_decode_error(
    registry: _Registry,
) -> None:
    from sources.kafka.datasource import kafka_schema
    from sources.kafka.formats import decode_batch, decoded_schema

    text = json.dumps(V2)
    reader = ra.ReaderSchema(text, None, None)
    decoder = ra.AvroDecoder(ra.RegistryConf("http://r"), reader, ra.spark_type(text)[0], column="value", tolerate=True)
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [b"k1", b"k2", b"k3"],
            "value": [_encode(1, V1, {"id": "a", "n": 1}), None, b"junk"],
            "topic": ["t"] * 3,
            "partition": [0] * 3,
            "offset": [10, 11, 12],
        },
    )
    out = decode_batch(batch, {"value": decoder}, flat=True)
    assert out.schema.names == ["key", "id", "n", "cur", "topic", "partition", "offset", "decode_errors"]
    # the writer's record projected onto the reader (cur: its default); a tombstone and an undecodable record null
    # every field, and only the undecodable one has an error, with its bytes
    assert out.column("id").to_pylist() == ["a", None, None]
    assert out.column("cur").to_pylist() == ["EUR", None, None]
    assert out.column("key").to_pylist() == [b"k1", b"k2", b"k3"]
    errors = out.column("decode_errors").to_pylist()
    assert errors[:2] == [None, None] and errors[2][0]["payload"] == b"junk"
    planned = decoded_schema(kafka_schema(False), {"value": decoder}, flat=True)
    assert planned.names == [
        "key",
        "id",
        "n",
        "cur",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "decode_errors",
    ]
    assert all(f.nullable for f in planned.fields[1:4])  # id and n are required in Avro, not in the columns
    assert [f.name for f in out.schema] == [*planned.names[:7], "decode_errors"]


def test_a_flat_layout_is_refused_for_a_raw_value_a_non_record_or_a_field_named_like_kafkas_columns(
    registry: _Registry,
) -> None:
    from sources.kafka import parse_options
    from sources.kafka.datasource import kafka_schema
    from sources.kafka.formats import decoded_schema

    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "value.layout": "flat"}
    with pytest.raises(ConfigError, match=r"'value.layout' is 'flat'.*read raw: set option 'value.format'") as err:
        parse_options(base, streaming=True)
    assert err.value.option == "value.layout"

    def planned(schema: dict[str, Any] | str, headers: bool = False) -> Any:
        text = json.dumps(schema)
        decoder = ra.AvroDecoder(
            ra.RegistryConf("http://r"), ra.ReaderSchema(text, None, None), ra.spark_type(text)[0], column="value"
        )
        return decoded_schema(kafka_schema(headers), {"value": decoder}, flat=True)

    with pytest.raises(ConfigError, match=r"reader schema is string, not a record"):
        planned("string")
    clash = {**V1, "fields": [*V1["fields"], {"name": "Offset", "type": "long"}]}
    with pytest.raises(ConfigError, match=r"field\(s\) Offset would take the name of Kafka's column"):
        planned(clash)
    twins = {**V1, "fields": [*V1["fields"], {"name": "ID", "type": "string"}]}
    with pytest.raises(ConfigError, match=r"fields ID, id differ only in case"):
        planned(twins)
    named_headers = {**V1, "fields": [*V1["fields"], {"name": "headers", "type": "string"}]}
    assert "headers" in planned(named_headers).names  # no headers column without includeHeaders
    with pytest.raises(ConfigError, match=r"field\(s\) headers would"):
        planned(named_headers, headers=True)


def test_a_schema_id_the_registry_does_not_have_is_asked_twice_before_the_record_is_blamed(
    registry: _Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ra, "_MISSING_RETRY_S", 0.0)
    errors: dict[int, tuple[int | None, str]] = {}
    _decoder(V1).decode([b"\x00\x00\x00\x00\x09abc"], _where, errors)
    assert registry.asked == [9, 9] and "has no schema id 9" in errors[0][1]  # a lagging replica gets a second ask


def test_a_writer_the_reader_cannot_be_resolved_with_is_a_decode_error(registry: _Registry) -> None:
    reader = {**V1, "fields": [*V1["fields"], {"name": "must", "type": "string"}]}  # no default: v1 cannot fill it
    with pytest.raises(FatalError, match=r"offset 10: the value \(writer schema id 1\) cannot be read"):
        _decoder(reader).decode([_encode(1, V1, {"id": "a", "n": 1})], _where)


def test_avro_types_map_to_spark_types_as_from_avro_maps_them() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "a", "type": ["string", "null"]},
            {"name": "b", "type": {"type": "array", "items": ["null", "long"]}},
            {"name": "c", "type": {"type": "map", "values": "double"}},
            {
                "name": "d",
                "type": {"type": "fixed", "name": "F", "size": 2, "logicalType": "decimal", "precision": 4, "scale": 1},
            },
            {"name": "e", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "f", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
        ],
    }
    spark, nullable = ra.spark_type(json.dumps(schema))
    assert not nullable
    assert (
        spark.simpleString()
        == "struct<a:string,b:array<bigint>,c:map<string,double>,d:decimal(4,1),e:timestamp_ntz,f:string>"
    )
    assert [f.nullable for f in spark.fields] == [True, False, False, False, False, False]
    assert spark.fields[1].dataType.containsNull


def test_a_union_of_several_types_is_refused_naming_the_field() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {
                "name": "inner",
                "type": {"type": "record", "name": "I", "fields": [{"name": "x", "type": ["null", "int", "string"]}]},
            }
        ],
    }
    with pytest.raises(ConfigError, match=r"value.schema: inner.x is a union of several types \(int, string\)"):
        ra.spark_type(json.dumps(schema))


def test_the_reader_schema_option_is_latest_a_version_an_id_or_inline() -> None:
    inline = ra.reader_schema(ra.RegistryConf("http://r"), "s", json.dumps(V1), option="value.schema")
    assert inline.schema_id is None and json.loads(inline.text) == V1
    with pytest.raises(ConfigError, match=r"option 'value.schema': not an Avro schema"):
        ra.reader_schema(ra.RegistryConf("http://r"), "s", '{"type": "nope"}', option="value.schema")
    with pytest.raises(ConfigError, match=r"expected latest, version:N, id:N or an Avro schema"):
        ra.reader_schema(ra.RegistryConf("http://r"), "s", "newest", option="value.schema")


def test_an_unreachable_registry_is_retriable_and_names_its_url_not_the_credentials() -> None:
    from eos_core.errors import RetriableError

    conf = ra.RegistryConf("http://127.0.0.1:9", user_info="me:s3cret")
    assert "s3cret" not in repr(conf)
    with pytest.raises(RetriableError) as err:
        ra.reader_schema(conf, "orders-value", "latest", option="value.schema")
    assert "http://127.0.0.1:9" in str(err.value) and "s3cret" not in str(err.value)
    in_url = ra.RegistryConf("http://me:s3cret@127.0.0.1:9")  # credentials in the URL: the client takes them too
    assert "s3cret" not in repr(in_url) and "***@" in repr(in_url)
    with pytest.raises(RetriableError) as err:
        ra.reader_schema(in_url, "orders-value", "latest", option="value.schema")
    assert "http://***@127.0.0.1:9" in str(err.value) and "s3cret" not in str(err.value), str(err.value)


def test_a_registry_that_accepts_and_never_answers_fails_the_call_within_its_timeout_naming_the_option() -> None:
    """A paused or wedged registry still completes TCP handshakes (the kernel does) and then says nothing:
    without a timeout confluent-kafka's client waits for ever (a 30-minute stall of a CI test was one)."""
    import socket
    import time

    from eos_core.errors import RetriableError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # never accepted, never answered
        conf = ra.RegistryConf(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_ms=300)
        assert conf.client_config()["timeout"] == 0.3
        began = time.monotonic()
        with pytest.raises(RetriableError) as err:
            ra.reader_schema(conf, "orders-value", "latest", option="value.schema")
        took = time.monotonic() - began
    assert "schema.registry.request.timeout.ms=300" in str(err.value) and conf.url in str(err.value), str(err.value)
    assert ra.ATTEMPTS * 0.3 <= took < 20, took  # every attempt waited its timeout, and no longer than the backoffs


def test_an_avro_format_on_a_write_goes_to_the_sink() -> None:
    from sources.kafka.datasource import write_options

    assert write_options({"topic": "t", "value.format": "avro"}) == {"topic": "t", "value.format": "avro"}
    assert write_options({"topic": "t", "startingOffsets": "earliest"}) == {"topic": "t"}  # a read's own: dropped


def test_errors_tolerance_on_a_read_applies_to_decoded_formats_only() -> None:
    from sources.kafka import parse_options

    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    with pytest.raises(ConfigError, match=r"'errors.tolerance' is 'all' on a read of raw keys and values"):
        parse_options({**base, "errors.tolerance": "all"}, streaming=True)
    opts = parse_options(
        {**base, "errors.tolerance": "all", "value.format": "avro", "schema.registry.url": "http://r"}, streaming=True
    )
    assert opts.errors_tolerance == "all"
    with pytest.raises(ConfigError, match=r"errors.tolerance"):
        parse_options(
            {**base, "errors.tolerance": "some", "value.format": "avro", "schema.registry.url": "http://r"},
            streaming=False,
        )


def _every_spark_type() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    inner = StructType([StructField("city", StringType(), False), StructField("zip", IntegerType(), True)])
    return StructType(
        [
            StructField("id", StringType(), False),
            StructField("n", LongType(), False),
            StructField("small", IntegerType(), True),
            StructField("flag", BooleanType(), True),
            StructField("ratio", FloatType(), True),
            StructField("precise", DoubleType(), True),
            StructField("blob", BinaryType(), True),
            StructField("day", DateType(), True),
            StructField("at", TimestampType(), True),
            StructField("local", TimestampNTZType(), True),
            StructField("price", DecimalType(10, 2), True),
            StructField("tags", ArrayType(StringType(), True), True),
            StructField("counts", MapType(StringType(), LongType(), False), True),
            StructField("address", inner, True),
            StructField("history", ArrayType(inner, False), True),
        ]
    )


def test_a_spark_struct_maps_to_the_avro_schema_that_maps_back_to_it() -> None:
    spark = _every_spark_type()
    schema = ra.avro_schema(spark)
    assert schema["name"] == "topLevelRecord"
    assert schema["fields"][2] == {"name": "small", "type": ["null", "int"], "default": None}  # droppable later
    back, nullable = ra.spark_type(json.dumps(schema))
    assert back == spark and not nullable
    from pyspark.sql.types import IntegerType, MapType, StringType, StructField, StructType

    with pytest.raises(ConfigError, match=r"Avro maps have string keys"):
        ra.avro_schema(StructType([StructField("m", MapType(IntegerType(), StringType()))]))
    with pytest.raises(ConfigError, match=r"avro writes a struct"):
        ra.avro_schema(StringType())


def test_what_the_encoder_writes_the_decoder_reads_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt
    import decimal

    from pyspark.sql.pandas.types import to_arrow_type

    spark = _every_spark_type()
    text = json.dumps(ra.avro_schema(spark))
    fake = _Registry({7: _Schema(json.loads(text))})
    monkeypatch.setattr(ra, "_client", lambda conf: fake)
    rows = [
        {
            "id": "a",
            "n": 1,
            "small": None,
            "flag": True,
            "ratio": 0.5,
            "precise": 2.25,
            "blob": b"\x00\xff",
            "day": dt.date(2026, 11, 29),
            "at": dt.datetime(2026, 11, 29, 12, 0, 1, 123456, tzinfo=dt.timezone.utc),
            "local": dt.datetime(2026, 11, 29, 13, 0),
            "price": decimal.Decimal("12.34"),
            "tags": ["x", None],
            "counts": [("k", 3), ("j", 4)],
            "address": {"city": "Bern", "zip": None},
            "history": [{"city": "Basel", "zip": 4000}],
        },
        None,  # a null value: a tombstone
    ]
    arrow = pa.array(rows, type=to_arrow_type(spark, timezone="UTC"))
    encoder = pickle_roundtrip(ra.AvroEncoder(text, 7, spark, column="value"))
    payloads = encoder.encode(arrow.to_pylist(), lambda i: f"row {i}")
    assert payloads[1] is None and payloads[0][:5] == b"\x00\x00\x00\x00\x07"
    decoder = ra.AvroDecoder(ra.RegistryConf("http://r"), ra.ReaderSchema(text, 7, "t-value"), spark, column="value")
    assert decoder.decode(payloads, _where).to_pylist() == arrow.to_pylist()
    with pytest.raises(FatalError, match=r"row 0: the value cannot be written with schema id 7"):
        encoder.encode([{**rows[0], "id": None}], lambda i: f"row {i}")  # a null where the schema has none


def pickle_roundtrip(obj: Any) -> Any:
    import pickle

    return pickle.loads(pickle.dumps(obj))


# a batch write of the Kafka sink with value.format=avro
_SINK_AVRO = {
    "kafka.bootstrap.servers": "b:1",
    "topic": "t",
    "sink.id": "s",
    "batch.id": "1",
    "value.format": "avro",
    "schema.registry.url": "http://r",
}


def test_auto_writes_small_integers_as_avro_ints_without_a_false_type_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.types import ByteType, ShortType, StructField, StructType

    from sinks.kafka import formats
    from sinks.kafka.options import parse_options

    monkeypatch.setattr(formats, "register", lambda conf, subject, text, option: 5)
    opts = parse_options(
        _SINK_AVRO,
        streaming=False,
    )
    small = StructType([StructField("b", ByteType(), False), StructField("s", ShortType(), True)])
    encoders = formats.column_encoders(opts, StructType([StructField("value", small)]))
    assert encoders["value"].schema_id == 5
    assert encoders["value"].encode([{"b": 1, "s": None}], lambda i: f"row {i}")[0] == b"\x00\x00\x00\x00\x05\x02\x00"


def test_credentials_in_a_registry_url_stay_out_of_reprs_and_errors() -> None:
    from sinks.kafka.options import parse_options

    opts = parse_options(
        {
            "kafka.bootstrap.servers": "b:1",
            "topic": "t",
            "sink.id": "s",
            "batch.id": "1",
            "value.format": "avro",
            "schema.registry.url": "https://u:p@ss@reg:8081",
        },
        streaming=False,
    )
    assert "p@ss" not in repr(opts) and "https://***@reg:8081" in repr(opts), repr(opts)
    with pytest.raises(ConfigError) as err:
        ra._client(ra.RegistryConf("u:s3cret@reg:8081"))  # no scheme: the client refuses it, naming the URL
    assert "s3cret" not in str(err.value) and "schema.registry.url" in str(err.value), str(err.value)


def test_the_sinks_subject_follows_its_naming_strategy_and_names_the_option_that_fixes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from sinks.kafka import formats
    from sinks.kafka.options import parse_options

    registered: list[tuple[str, str]] = []

    def register(conf: Any, subject: str, text: str, *, option: str) -> int:
        registered.append((subject, json.loads(text)["name"]))
        return 5

    def reader_schema(conf: Any, subject: str, spec: str, *, option: str) -> ra.ReaderSchema:
        registered.append((subject, spec))
        return ra.ReaderSchema(json.dumps(ra.avro_schema(value, name="com.acme.Pay")), 6, subject)

    monkeypatch.setattr(formats, "register", register)
    monkeypatch.setattr(formats, "reader_schema", reader_schema)
    value = StructType([StructField("id", StringType(), False), StructField("n", LongType(), True)])
    schema = StructType([StructField("value", value, True)])
    base = {
        "kafka.bootstrap.servers": "b:9092",
        "sink.id": "s",
        "checkpointLocation": "/tmp/cp",
        "marker.topic": "markers",  # where rows name their topics
        "value.format": "avro",
        "schema.registry.url": "http://r",
    }

    def subject(**options: str) -> tuple[str, str]:
        registered.clear()
        formats.column_encoders(parse_options({**base, **options}, streaming=True), schema)
        return registered[-1]

    assert subject(topic="pay") == ("pay-value", "topLevelRecord")  # TopicNameStrategy, to_avro's record name
    named = {"value.record.name": "com.acme.Pay"}
    assert subject(topic="pay", **named) == ("pay-value", "com.acme.Pay")
    assert subject(**{"value.subject.name.strategy": "record"}, **named) == ("com.acme.Pay", "com.acme.Pay")
    assert subject(
        topic="pay",
        **{"value.subject.name.strategy": "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy"},
        **named,
    ) == ("pay-com.acme.Pay", "com.acme.Pay")
    inline = json.dumps({**ra.avro_schema(value, name="Pay"), "namespace": "org.x"})
    assert subject(**{"value.subject.name.strategy": "record", "value.schema": inline}) == ("org.x.Pay", "Pay")
    latest = {"value.subject.name.strategy": "record", "value.schema": "latest", **named}
    assert subject(**latest) == ("com.acme.Pay", "latest")  # a registered schema looked up under the record's subject

    def refused(match: str, option: str, **options: str) -> None:
        with pytest.raises(ConfigError, match=match) as err:
            formats.column_encoders(parse_options({**base, **options}, streaming=True), schema)
        assert err.value.option == option, err.value.option

    # rows naming their own topics: only the record strategy, or a named subject, can name theirs
    refused(r"rows name their topics, so the topic naming strategy has no topic", "value.subject")
    refused(r"the topic-record naming", "value.subject", **{"value.subject.name.strategy": "topic-record"}, **named)
    # the record strategy needs a record of its own: to_avro's topLevelRecord would be every topic's subject
    refused(
        r"record's full name, and the value column's record has none",
        "value.record.name",
        **{"value.subject.name.strategy": "record"},
    )
    refused(r"not a record.s full name", "value.record.name", topic="t", **{"value.record.name": "com.9x"})
    refused(
        r"both name the subject",
        "value.subject.name.strategy",
        topic="t",
        **{"value.subject": "s", "value.subject.name.strategy": "record"},
    )
    refused(r"names its record 'org.x.Pay'", "value.record.name", topic="t", **named, **{"value.schema": inline})
    with pytest.raises(
        ConfigError, match=r"'value.subject.name.strategy' is 'Loose', no subject naming strategy.*RecordNameStrategy"
    ):
        parse_options({**base, "topic": "t", "value.subject.name.strategy": "Loose"}, streaming=True)

    # id:N needs no subject: rows naming their topics may pin one without a strategy
    assert subject(**{"value.schema": "id:6"}) == ("", "id:6")
    refused(r"option 'value.schema': not an Avro schema", "value.schema", topic="t", **{"value.schema": '{"type": '})
    for option in ("value.subject", "value.subject.name.strategy", "value.record.name"):
        with pytest.raises(
            ConfigError, match=rf"option '{option}' names the Schema Registry subject .*\(value.format=raw\)"
        ):
            parse_options({**base, "topic": "t", "value.format": "raw", option: "record"}, streaming=True)


def test_the_writer_registers_its_schema_when_handed_to_the_tasks_never_where_it_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark builds the writer twice per batch on the driver: where it plans the tasks (then pickles the writer
    for them) and where it commits. Only the first makes the encoders: the committing process asks the registry
    nothing and imports no client."""
    import pickle

    from pyspark.sql.types import LongType, StructField, StructType

    from sinks.kafka import formats, spark

    registered: list[str] = []
    monkeypatch.setattr(formats, "register", lambda conf, subject, text, option: registered.append(subject) or 5)
    monkeypatch.setattr(spark, "check_services", lambda opts: ())
    options = dict(_SINK_AVRO)
    schema = StructType([StructField("value", StructType([StructField("n", LongType(), False)]))])
    committer = spark.KafkaBatchWriter(options, schema)
    assert registered == [] and committer.plan.encoders == {}
    assert committer.plan.columns == ("value",)  # planned as the encoded (binary) column: a struct is refused
    tasks = pickle.loads(pickle.dumps(committer))
    assert registered == ["t-value"] and tasks.plan.encoders["value"].schema_id == 5
    pickle.dumps(committer)  # pickled again (a retried stage): made once
    assert registered == ["t-value"]

    # a refusal comes there too, before any task runs
    def refuse(conf: Any, subject: str, text: str, option: str) -> int:
        raise ConfigError(f"subject {subject!r}: incompatible", option=option)

    monkeypatch.setattr(formats, "register", refuse)
    with pytest.raises(ConfigError, match=r"subject 't-value': incompatible"):
        pickle.dumps(spark.KafkaBatchWriter(options, schema))


def test_the_columnar_encoder_writes_fastavros_bytes_and_falls_back_record_by_record_where_it_must() -> None:
    """eos_core.avro_columns: a record of every type it encodes (integers, floats, booleans, strings, bytes, dates,
    timestamps with and without a zone, nullable fields either union order, a nullable nested record), rows with
    nulls everywhere and a tombstone, byte for byte what fastavro writes record by record; a schema with an array
    is not planned (record by record), and a null where the schema has none falls back to the path that names it."""
    import datetime as dt

    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from eos_core import avro_columns

    columnar = ("id", "n", "small", "flag", "ratio", "precise", "blob", "day", "at", "local", "address")
    spark = StructType([f for f in _every_spark_type().fields if f.name in columnar])
    schema = ra.avro_schema(spark)
    schema["fields"][2]["type"] = ["int", "null"]  # to_avro's union order, beside ours
    text = json.dumps(schema)
    at = dt.datetime(2026, 11, 29, 12, 0, 1, 5, tzinfo=dt.timezone.utc)
    rows = [
        {
            "id": "\u00e9t\u00e9",
            "n": -(2**63),
            "small": -1,
            "ratio": 0.25,
            "precise": -1e300,
            "flag": True,
            "blob": b"\x00" * 200,
            "day": dt.date(1900, 1, 1),
            "at": at,
            "local": dt.datetime(2200, 1, 1),
            "address": {"city": "Bern", "zip": 3000},
        },
        None,
        {
            "id": "",
            "n": 2**63 - 1,
            "small": None,
            "ratio": None,
            "precise": 0.0,
            "flag": None,
            "blob": None,
            "day": None,
            "at": None,
            "local": None,
            "address": None,
        },
        {**{k: None for k in spark.names}, "id": "x", "n": 64, "precise": 1.5, "address": {"city": "", "zip": None}},
    ]
    arrow = pa.array(rows, type=to_arrow_type(spark, timezone="UTC"))
    encoder = ra.AvroEncoder(text, 300, spark, column="value")
    assert avro_columns.plan(encoder._parsed, arrow.type, b"\x00\x00\x00\x01\x2c") is not None
    assert encoder.encode_arrow(arrow, _where).to_pylist() == encoder.encode(rows, _where)

    listed = StructType([*spark.fields, _every_spark_type()["tags"]])
    with_array = ra.AvroEncoder(json.dumps(ra.avro_schema(listed)), 7, listed, column="value")
    array_rows = [{**rows[0], "tags": ["a"]}]
    arrow_listed = pa.array(array_rows, type=to_arrow_type(listed, timezone="UTC"))
    assert avro_columns.plan(with_array._parsed, arrow_listed.type, b"\x00" * 5) is None
    assert with_array.encode_arrow(arrow_listed, _where).to_pylist() == with_array.encode(array_rows, _where)

    # a null in a field the schema does not allow null (a registered schema stricter than the column): named
    loose = StructType([StructField("id", StringType(), True)])
    strict = ra.AvroEncoder(
        '{"type":"record","name":"R","fields":[{"name":"id","type":"string"}]}', 8, loose, column="value"
    )
    nulls = pa.array([{"id": "a"}, {"id": None}], type=to_arrow_type(loose, timezone="UTC"))
    with pytest.raises(FatalError, match=r"offset 11: the value cannot be written with schema id 8"):
        strict.encode_arrow(nulls, _where)


def test_the_columnar_encoder_declines_what_it_would_write_otherwise_than_fastavro() -> None:
    """From an independent review: a logical type on another base type than Avro's (a registry takes it), an Avro
    int from 64-bit integers, and strings that are not UTF-8 (Spark's CAST of binary does not check) are not
    encoded by column; the last fails naming its row. A signalling NaN float is quieted as fastavro quiets it."""
    from eos_core import avro_columns

    def record(field_type: Any) -> Any:
        return ra._parse(
            json.dumps({"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}), "s"
        )

    dates = pa.struct([("f", pa.date32())])
    assert avro_columns.plan(record({"type": "string", "logicalType": "date"}), dates, b"h") is None
    assert avro_columns.plan(record({"type": "int", "logicalType": "date"}), dates, b"h") is not None
    micros = pa.struct([("f", pa.timestamp("us", tz="UTC"))])
    assert avro_columns.plan(record({"type": "int", "logicalType": "timestamp-micros"}), micros, b"h") is None
    assert avro_columns.plan(record("int"), pa.struct([("f", pa.int64())]), b"h") is None
    assert avro_columns.plan(record("long"), pa.struct([("f", pa.uint64())]), b"h") is None

    from pyspark.sql.types import FloatType, StringType, StructField, StructType

    spark = StructType([StructField("f", StringType(), False)])
    encoder = ra.AvroEncoder(json.dumps(ra.avro_schema(spark)), 3, spark, column="value")
    offsets = pa.py_buffer(np.array([0, 1, 3], dtype=np.int32))
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"a\xc3(")])
    with pytest.raises(FatalError, match=r"offset 11: the value holds a string that is not UTF-8"):
        encoder.encode_arrow(pa.StructArray.from_arrays([bad], ["f"]), _where)

    floats = StructType([StructField("f", FloatType(), False)])
    f_encoder = ra.AvroEncoder(json.dumps(ra.avro_schema(floats)), 3, floats, column="value")
    signalling = np.array([0x7F800001], dtype=np.uint32).view(np.float32)
    rows = pa.StructArray.from_arrays([pa.array(signalling, pa.float32())], ["f"])
    assert f_encoder.encode_arrow(rows, _where).to_pylist() == f_encoder.encode(rows.to_pylist(), _where)


def test_a_writer_never_readied_for_its_tasks_refuses_to_write_a_struct_raw() -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from sinks.kafka.options import parse_options
    from sinks.kafka.plan import build_plan
    from sinks.kafka.writer import write_task

    schema = StructType([StructField("value", StructType([StructField("n", LongType(), False)]))])
    plan = build_plan(parse_options(_SINK_AVRO, streaming=False), schema, encode=False)
    assert plan.encoded == ("value",) and plan.encoders == {}
    with pytest.raises(FatalError, match=r"no encoder for the value column"):
        write_task(plan, iter([]))
