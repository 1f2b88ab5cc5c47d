"""Generated Spark struct types and rows of them, for the property and differential tests of the Avro path
(``tests/test_avro_property.py``, ``integration/spark_peer/test_avro_differential.py``): booleans, integers,
floats and doubles at their limits, strings with any code point, binary, decimals of any precision and scale,
dates, timestamps with and without a time zone, arrays, maps, nested structs, each field nullable or not."""

from __future__ import annotations

import datetime as dt
import decimal
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
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

__all__ = ["COLUMNAR", "PROPERTY", "TYPES", "FakeRegistry", "as_avro", "typed_rows", "values"]

# the property tests' bounds: 60 examples (EOS_HYPOTHESIS_EXAMPLES raises them for a longer hunt), no deadline,
# derandomized (the same examples every run)
PROPERTY = settings(
    max_examples=int(os.environ.get("EOS_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_UTC = dt.timezone.utc
_LO, _HI = dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)


def _decimals() -> st.SearchStrategy[DataType]:
    return st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: DecimalType(p, s)))


LEAVES_PLAIN: list[DataType] = [
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
LEAVES: st.SearchStrategy[DataType] = st.one_of(st.sampled_from(LEAVES_PLAIN), _decimals())


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
        exact = decimal.Context(prec=t.precision)  # the default context (28 digits) would round 38
        return st.integers(-bound, bound).map(lambda n: decimal.Decimal(n).scaleb(-t.scale, exact))
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


# what eos_core.avro_columns encodes by column: the leaves but decimals, in nested structs
COLUMNAR: st.SearchStrategy[DataType] = st.recursive(
    st.sampled_from(LEAVES_PLAIN),
    _struct,
    max_leaves=8,
)


@st.composite
def typed_rows(draw: st.DrawFn, types: st.SearchStrategy[DataType] | None = None) -> tuple[StructType, list[Any]]:
    t = draw(_struct(types if types is not None else TYPES))
    rows = draw(st.lists(st.one_of(st.none(), values(t)), min_size=1, max_size=4))
    return t, rows


class FakeRegistry:
    """Answers every schema id with one schema, Avro or of type ``kind`` (``eos_core.registry_avro._client``'s
    stand-in)."""

    def __init__(self, text: str, kind: str = "AVRO") -> None:
        self.text, self.kind = text, kind

    def get_schema(self, schema_id: int) -> Any:
        class Schema:
            schema_str, schema_type, references = self.text, self.kind, []

        return Schema()


def as_avro(value: Any, t: DataType) -> Any:
    """What fastavro returns for ``value`` (an Arrow-side value of ``t``): maps as dicts."""
    if value is None:
        return None
    if isinstance(t, MapType):
        return {k: as_avro(v, t.valueType) for k, v in value}
    if isinstance(t, ArrayType):
        return [as_avro(v, t.elementType) for v in value]
    if isinstance(t, StructType):
        return {f.name: as_avro(value[f.name], f.dataType) for f in t.fields}
    return value
