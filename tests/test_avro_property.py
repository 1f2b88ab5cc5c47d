"""A property of the Avro path both directions of kafka-eos share (``eos_core.registry_avro``), over generated
schemas and records.

Hypothesis draws a Spark struct type (booleans, integers, floats and doubles at their limits, strings with any
code point, binary, decimals of any precision and scale, dates, timestamps with and without a time zone, arrays,
maps, nested structs, each field nullable or not) and rows of it. For every draw:
- the Avro schema the sink derives (``avro_schema``, as ``to_avro`` would) maps back to the same Spark type the
  source plans with (``spark_type``, as ``from_avro`` maps);
- what the sink's encoder writes, the source's decoder reads back equal, value for value, as Arrow holds it;
- fastavro reading the same bytes with the derived schema (the library confluent-kafka's own deserializer runs)
  gives the same values, so the wire format is plain Confluent Avro, not a private dialect.

Bounded: ``max_examples`` 60, no deadline, derandomized (the same examples every run); ``EOS_HYPOTHESIS_EXAMPLES``
raises the count for a longer hunt.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import os
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
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

from eos_core import registry_avro as ra

EXAMPLES = int(os.environ.get("EOS_HYPOTHESIS_EXAMPLES", "60"))
_UTC = dt.timezone.utc
_LO, _HI = dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)


def _decimals() -> st.SearchStrategy[DataType]:
    return st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: DecimalType(p, s)))


LEAVES: st.SearchStrategy[DataType] = st.one_of(
    st.sampled_from(
        [
            BooleanType(),
            IntegerType(),
            LongType(),
            FloatType(),
            DoubleType(),
            StringType(),
            BinaryType(),
            DateType(),
            TimestampType(),
            TimestampNTZType(),
        ]
    ),
    _decimals(),
)


def _struct(children: st.SearchStrategy[DataType]) -> st.SearchStrategy[StructType]:
    field = st.tuples(children, st.booleans())
    return st.lists(field, min_size=1, max_size=5).map(
        lambda fs: StructType([StructField(f"f{i}", t, nullable) for i, (t, nullable) in enumerate(fs)])
    )


TYPES: st.SearchStrategy[DataType] = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        _struct(children),
        st.tuples(children, st.booleans()).map(lambda t: ArrayType(t[0], t[1])),
        st.tuples(children, st.booleans()).map(lambda t: MapType(StringType(), t[0], t[1])),
    ),
    max_leaves=8,
)


def values(t: DataType) -> st.SearchStrategy[Any]:
    """Values of ``t`` as Arrow takes them (maps as key-value pairs)."""
    if isinstance(t, BooleanType):
        return st.booleans()
    if isinstance(t, IntegerType):
        return st.integers(-(2**31), 2**31 - 1)
    if isinstance(t, LongType):
        return st.integers(-(2**63), 2**63 - 1)
    if isinstance(t, FloatType):
        return st.floats(width=32, allow_nan=False)
    if isinstance(t, DoubleType):
        return st.floats(allow_nan=False)
    if isinstance(t, StringType):
        return st.text(st.characters(codec="utf-8"), max_size=12)
    if isinstance(t, BinaryType):
        return st.binary(max_size=12)
    if isinstance(t, DecimalType):
        bound = 10**t.precision - 1
        return st.integers(-bound, bound).map(lambda n: decimal.Decimal(n).scaleb(-t.scale))
    if isinstance(t, DateType):
        return st.dates(_LO.date(), _HI.date())
    if isinstance(t, TimestampType):
        return st.datetimes(_LO, _HI).map(lambda d: d.replace(tzinfo=_UTC))
    if isinstance(t, TimestampNTZType):
        return st.datetimes(_LO, _HI)
    if isinstance(t, ArrayType):
        item = values(t.elementType)
        return st.lists(st.one_of(st.none(), item) if t.containsNull else item, max_size=3)
    if isinstance(t, MapType):
        value = values(t.valueType)
        pairs = st.dictionaries(st.text(max_size=4), st.one_of(st.none(), value) if t.valueContainsNull else value)
        return pairs.map(lambda d: list(d.items()))
    assert isinstance(t, StructType)
    return st.fixed_dictionaries(
        {f.name: st.one_of(st.none(), values(f.dataType)) if f.nullable else values(f.dataType) for f in t.fields}
    )


@st.composite
def typed_rows(draw: st.DrawFn) -> tuple[StructType, list[Any]]:
    t = draw(_struct(TYPES))
    rows = draw(st.lists(st.one_of(st.none(), values(t)), min_size=1, max_size=4))
    return t, rows


class _Registry:
    def __init__(self, text: str) -> None:
        self.text = text

    def get_schema(self, schema_id: int) -> Any:
        class Schema:
            schema_str, schema_type, references = self.text, "AVRO", []

        return Schema()


def _as_avro(value: Any, t: DataType) -> Any:
    """What fastavro returns for ``value`` (an Arrow-side value of ``t``): maps as dicts."""
    if value is None:
        return None
    if isinstance(t, MapType):
        return {k: _as_avro(v, t.valueType) for k, v in value}
    if isinstance(t, ArrayType):
        return [_as_avro(v, t.elementType) for v in value]
    if isinstance(t, StructType):
        return {f.name: _as_avro(value[f.name], f.dataType) for f in t.fields}
    return value


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
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

    payloads = ra.AvroEncoder(text, 42, spark, column="value").encode(expected, lambda i: f"row {i}")
    monkeypatch_module.setattr(ra, "_client", lambda conf: _Registry(text))
    decoder = ra.AvroDecoder(ra.RegistryConf("http://r"), ra.ReaderSchema(text, 42, "t-value"), spark, column="value")
    assert decoder.decode(payloads, lambda i: f"row {i}").to_pylist() == expected

    parsed = fastavro.parse_schema(schema)
    for payload, row in zip(payloads, expected, strict=True):
        if row is None:
            assert payload is None
            continue
        assert payload is not None and payload[:5] == b"\x00\x00\x00\x00\x2a"
        read = fastavro.schemaless_reader(io.BytesIO(payload[5:]), parsed, None)
        assert read == _as_avro(row, spark)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        yield mp
