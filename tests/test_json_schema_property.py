"""A property of the JSON Schema path both directions of kafka-eos share (``eos_core.registry_json``), over the
generated Spark types and rows of the Avro property (``tests/avro_cases.py``). For every draw:
- the JSON Schema the sink derives (``json_schema``) is a valid draft-07 schema, and every record the sink's
  encoder writes is valid under it (the check Confluent's serializer and any consumer's validator make);
- the source, reading with that schema, reads back each value as JSON holds it: integers as bigint, float, double
  and decimal as double (a decimal's exact digits parsed), dates and timestamps as ISO 8601 strings, binary as
  base64, maps and nested structs whole, nulls where they were;
- a row with an infinite float fails its batch naming the row (JSON has no infinity), never written as a string.

Bounded: ``max_examples`` 60, no deadline, derandomized; ``EOS_HYPOTHESIS_EXAMPLES`` raises the count.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import jsonschema
import pyarrow as pa
import pytest
from hypothesis import given
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    MapType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_core import registry_avro as ra
from eos_core import registry_json as rj
from eos_core.errors import FatalError
from tests.avro_cases import PROPERTY, FakeRegistry, typed_rows


def as_json(value: Any, t: DataType) -> Any:
    """What a JSON reader holds for ``value`` (an Arrow-side value of ``t``), as the source's reader returns it."""
    if value is None:
        return None
    if isinstance(t, StructType):
        return {f.name: as_json(value[f.name], f.dataType) for f in t.fields}
    if isinstance(t, ArrayType):
        return [as_json(v, t.elementType) for v in value]
    if isinstance(t, MapType):
        return [(k, as_json(v, t.valueType)) for k, v in value]
    if isinstance(t, (FloatType, DoubleType, DecimalType)):
        return float(value)
    if isinstance(t, BinaryType):
        return base64.b64encode(value).decode()
    if isinstance(t, TimestampType):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(t, (DateType, TimestampNTZType)):
        return value.isoformat()
    return value


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


@PROPERTY
@given(case=typed_rows())
def test_what_the_sink_encodes_is_valid_under_its_schema_and_the_source_reads_back_as_json_holds_it(
    case: tuple[StructType, list[Any]], monkeypatch_module: pytest.MonkeyPatch
) -> None:
    spark, rows = case
    schema = rj.json_schema(spark)
    jsonschema.Draft7Validator.check_schema(schema)
    text = json.dumps(schema)
    arrow = pa.array(rows, type=to_arrow_type(spark, timezone="UTC"))
    values = arrow.to_pylist()
    encoder = rj.JsonSchemaEncoder(text, 42, spark, column="value", validate=False)
    if not all(_finite(v) for v in values):
        with pytest.raises(FatalError, match=r"row \d+: the value cannot be written .*not a JSON number"):
            encoder.encode(values, lambda i: f"row {i}")
        return
    payloads = encoder.encode(values, lambda i: f"row {i}")
    validator = jsonschema.Draft7Validator(schema)
    for payload, row in zip(payloads, values, strict=True):
        assert (payload is None) == (row is None)
        if payload is not None:
            assert payload[:5] == b"\x00\x00\x00\x00\x2a"
            validator.validate(json.loads(payload[5:]))

    monkeypatch_module.setattr(ra, "_client", lambda conf: FakeRegistry(text, "JSON"))
    reader, nullable = rj.spark_type(text)
    assert not nullable and rj.canonical(reader) == rj.read_as(spark)
    decoder = rj.JsonSchemaDecoder(
        ra.RegistryConf("http://r"), ra.ReaderSchema(text, 42, "t-value"), reader, column="value"
    )
    assert decoder.decode(payloads, lambda i: f"row {i}").to_pylist() == [as_json(v, spark) for v in values]


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        yield mp
