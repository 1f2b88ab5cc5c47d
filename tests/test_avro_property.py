"""A property of the Avro path both directions of kafka-eos share (``eos_core.registry_avro``), over generated
schemas and records.

Hypothesis draws a Spark struct type (booleans, integers, floats and doubles at their limits, strings with any
code point, binary, decimals of any precision and scale, dates, timestamps with and without a time zone, arrays,
maps, nested structs, each field nullable or not) and rows of it. For every draw:
- the Avro schema the sink derives (``avro_schema``, as ``to_avro`` would) maps back to the same Spark type the
  source plans with (``spark_type``, as ``from_avro`` maps);
- what the sink's encoder writes, the source's decoder reads back equal, value for value, as Arrow holds it;
- the encoder by column (``eos_core.avro_columns``, for the schemas it takes) writes the same bytes as fastavro;
- fastavro reading the same bytes with the derived schema (the library confluent-kafka's own deserializer runs)
  gives the same values, so the wire format is plain Confluent Avro, not a private dialect.

Bounded: ``max_examples`` 60, no deadline, derandomized (the same examples every run); ``EOS_HYPOTHESIS_EXAMPLES``
raises the count for a longer hunt.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType

from eos_core import registry_avro as ra
from tests.avro_cases import COLUMNAR, PROPERTY, FakeRegistry, as_avro, typed_rows


@PROPERTY
@given(case=typed_rows())
def test_what_the_sink_encodes_the_source_decodes_and_fastavro_reads_alike(
    case: tuple[StructType, list[Any]], monkeypatch_module: pytest.MonkeyPatch
) -> None:
    import fastavro

    spark, rows = case
    schema = ra.avro_schema(spark)
    text = json.dumps(schema)
    back, nullable = ra.spark_type(text)
    assert back == spark and not nullable
    arrow = pa.array(rows, type=to_arrow_type(spark, timezone="UTC"))
    expected = arrow.to_pylist()

    encoder = ra.AvroEncoder(text, 42, spark, column="value")
    payloads = encoder.encode(expected, lambda i: f"row {i}")
    # by column (eos_core.avro_columns, where the schema allows) the same bytes as fastavro's, record for record
    assert encoder.encode_arrow(arrow, lambda i: f"row {i}").to_pylist() == payloads
    monkeypatch_module.setattr(ra, "_client", lambda conf: FakeRegistry(text))
    decoder = ra.AvroDecoder(ra.RegistryConf("http://r"), ra.ReaderSchema(text, 42, "t-value"), spark, column="value")
    assert decoder.decode(payloads, lambda i: f"row {i}").to_pylist() == expected

    parsed = fastavro.parse_schema(schema)
    for payload, row in zip(payloads, expected, strict=True):
        if row is None:
            assert payload is None
            continue
        assert payload is not None and payload[:5] == b"\x00\x00\x00\x00\x2a"
        read = fastavro.schemaless_reader(io.BytesIO(payload[5:]), parsed, None)
        assert read == as_avro(row, spark)


@PROPERTY
@given(case=typed_rows(COLUMNAR))
def test_the_encoder_by_column_writes_fastavros_bytes_for_every_type_it_takes(
    case: tuple[StructType, list[Any]],
) -> None:
    """The draws of the types ``eos_core.avro_columns`` encodes (every leaf but decimals, nested structs, each
    field nullable or not, null rows among them): planned by column, and byte for byte fastavro's."""
    from eos_core import avro_columns

    spark, rows = case
    text = json.dumps(ra.avro_schema(spark))
    arrow = pa.array(rows, type=to_arrow_type(spark, timezone="UTC"))
    encoder = ra.AvroEncoder(text, 7, spark, column="value")
    assert avro_columns.plan(encoder._parsed, arrow.type, b"\x00\x00\x00\x00\x07") is not None
    assert encoder.encode_arrow(arrow, lambda i: f"row {i}").to_pylist() == encoder.encode(rows, lambda i: f"row {i}")


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        yield mp
