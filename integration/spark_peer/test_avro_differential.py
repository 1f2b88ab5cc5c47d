"""The avro formats against Spark's own Avro reader and writer (``spark-avro``'s ``from_avro``/``to_avro``, the JVM's
Avro library), record for record, over generated schemas and rows (issue 49's oracle; ``tests/avro_cases.py``
draws them: every Spark type the formats map, nested records, arrays, maps, nulls, decimals up to 38 digits,
timestamps with and without a zone).

For each draw, in the peer's one Spark session:
- **what the sink writes, Spark reads**: the body of each record the sink's encoder writes (after Confluent's
  5-byte header), read by ``from_avro`` with the schema the sink registered, equals the row, value for value as
  Spark holds it; and the Spark type ``from_avro`` gives it is the one the source plans with (``spark_type``);
- **what Spark writes, the source reads**: ``to_avro``'s bytes of the same rows, behind a header naming Spark's
  own derived writer schema (``SchemaConverters.toAvroType``: decimals as ``fixed``, nullable fields as
  ``[T, "null"]``, records named by field), decoded by the source's decoder with that schema as its reader,
  equal the rows; the Spark type the source maps Spark's schema to is the column's.

No broker or registry: the registry is a stand-in answering the one schema (``FakeRegistry``); the records' way
through Kafka is the source's and sink's own suites'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import LongType, StructField, StructType

from eos_core import registry_avro as ra
from tests.avro_cases import FakeRegistry, typed_rows

EXAMPLES = int(os.environ.get("EOS_HYPOTHESIS_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def patched() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _frame(spark: Any, t: StructType, rows: list[Any], *, nullable: bool) -> Any:
    """A DataFrame (i, v) of ``rows`` as Spark holds them, through Arrow (maps as key-value pairs)."""
    arrow = pa.array(rows, type=to_arrow_type(t, timezone="UTC"))
    schema = StructType([StructField("i", LongType(), False), StructField("v", t, nullable)])
    return spark.createDataFrame(pa.table({"i": pa.array(range(len(rows)), pa.int64()), "v": arrow}), schema)


def _values(df: Any, column: str = "v") -> list[Any]:
    return [r[column] for r in df.orderBy("i").collect()]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(case=typed_rows())
def test_from_avro_reads_what_the_sink_writes_and_the_source_reads_what_to_avro_writes(
    case: tuple[StructType, list[Any]], spark: Any, patched: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.avro.functions import from_avro, to_avro

    t, drawn = case
    rows = [r for r in drawn if r is not None]  # a null value is a tombstone: no body to compare
    if not rows:
        return
    expected = _values(_frame(spark, t, rows, nullable=False))

    # the sink's bytes, read by Spark's JVM reader with the schema the sink registers
    text = json.dumps(ra.avro_schema(t))
    payloads = ra.AvroEncoder(text, 42, t, column="value").encode(
        pa.array(rows, type=to_arrow_type(t, timezone="UTC")).to_pylist(), lambda i: f"row {i}"
    )
    bodies = spark.createDataFrame([(i, p[5:]) for i, p in enumerate(payloads)], "i long, body binary")
    read = bodies.select("i", from_avro("body", text).alias("v"))
    assert read.schema["v"].dataType.simpleString() == ra.spark_type(text)[0].simpleString()
    assert _values(read) == expected

    # Spark's bytes, with the writer schema Spark derives, read by the source's decoder
    frame = _frame(spark, t, rows, nullable=False)
    written = [bytes(b) for b in _values(frame.select("i", to_avro("v").alias("v")))]
    jvm = spark.sparkContext._jvm
    jtype = frame._jdf.schema().apply("v").dataType()
    spark_schema = jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
        jtype, False, "topLevelRecord", ""
    ).toString()
    mapped, nullable = ra.spark_type(spark_schema)
    assert mapped.simpleString() == t.simpleString() and not nullable, spark_schema
    patched.setattr(ra, "_client", lambda conf: FakeRegistry(spark_schema))
    decoder = ra.AvroDecoder(
        ra.RegistryConf("http://r"), ra.ReaderSchema(spark_schema, 7, "t-value"), mapped, column="value"
    )
    decoded = decoder.decode([b"\x00\x00\x00\x00\x07" + w for w in written], lambda i: f"row {i}")
    assert _values(_frame(spark, mapped, decoded.to_pylist(), nullable=False)) == expected
