"""Unit tests for the Spark -> Postgres type mapping, compatibility and CREATE TABLE generation."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_core.errors import ConfigError
from sinks.postgres.copy import copy_type
from sinks.postgres.options import TableName
from sinks.postgres.types import Column, compatible, create_table_sql, pg_type, plan_columns


@pytest.mark.parametrize(
    ("spark", "pg"),
    [
        (BooleanType(), "boolean"),
        (ByteType(), "smallint"),
        (ShortType(), "smallint"),
        (IntegerType(), "integer"),
        (LongType(), "bigint"),
        (FloatType(), "real"),
        (DoubleType(), "double precision"),
        (DecimalType(38, 10), "numeric(38,10)"),
        (StringType(), "text"),
        (BinaryType(), "bytea"),
        (DateType(), "date"),
        (TimestampType(), "timestamp with time zone"),
        (TimestampNTZType(), "timestamp without time zone"),
        (ArrayType(LongType()), "bigint[]"),
        (ArrayType(DecimalType(5, 2)), "numeric(5,2)[]"),
        (ArrayType(ArrayType(LongType())), "jsonb"),
        (ArrayType(StructType([StructField("a", LongType())])), "jsonb"),
        (StructType([StructField("a", LongType())]), "jsonb"),
        (MapType(StringType(), LongType()), "jsonb"),
    ],
)
def test_pg_type(spark: DataType, pg: str) -> None:
    assert pg_type(spark) == pg


@pytest.mark.parametrize(
    ("pg", "registry"),
    [
        ("numeric(38,10)", "numeric"),
        ("timestamp with time zone", "timestamptz"),
        ("double precision", "float8"),
        ("numeric(5,2)[]", "numeric[]"),
        ("bigint[]", "int8[]"),
        ("jsonb", "jsonb"),
    ],
)
def test_copy_type_names(pg: str, registry: str) -> None:
    assert copy_type(pg) == registry


@pytest.mark.parametrize(
    ("staged", "target", "ok"),
    [
        ("bigint", "bigint", True),
        ("bigint", "integer", False),  # narrowing
        ("integer", "bigint", True),
        ("bigint", "numeric(20,0)", True),
        ("text", "character varying(20)", True),
        ("text", "uuid", True),
        ("text", "integer", False),
        ("numeric(10,2)", "numeric(12,4)", True),
        ("double precision", "real", False),
        ("timestamp with time zone", "timestamp without time zone", False),
        ("timestamp without time zone", "timestamp without time zone", True),
        ("date", "timestamp with time zone", True),
        ("bytea", "text", False),
        ("jsonb", "json", True),
        ("jsonb", "text", False),
        ("bigint[]", "bigint[]", True),
        ("integer[]", "bigint[]", True),
        ("bigint[]", "integer[]", False),
        ("text[]", "jsonb", True),
        ("boolean", "integer", False),
    ],
)
def test_compatible(staged: str, target: str, ok: bool) -> None:
    assert compatible(staged, target) is ok


def test_text_into_enum() -> None:
    assert compatible("text", "mood", "e") and not compatible("bigint", "mood", "e")


def test_plan_columns_and_create_table() -> None:
    schema = StructType(
        [
            StructField("userId", LongType(), False),
            StructField("name", StringType()),
            StructField("tags", ArrayType(StringType())),
        ]
    )
    cols = plan_columns(schema, {"userId": "user_id"})
    assert [c.target for c in cols] == ["user_id", "name", "tags"]
    sql = create_table_sql(TableName("app", "users"), cols, ["userId"])
    assert sql == (
        'CREATE TABLE IF NOT EXISTS "app"."users" ("user_id" bigint NOT NULL, "name" text, "tags" text[], '
        'PRIMARY KEY ("user_id"))'
    )
    # append tables (postgres-2pc append mode) have no key and get no primary key
    assert create_table_sql(TableName(None, "log"), cols, ()) == (
        'CREATE TABLE IF NOT EXISTS "log" ("user_id" bigint, "name" text, "tags" text[])'
    )


def test_plan_columns_errors() -> None:
    schema = StructType([StructField("a", LongType()), StructField("b", LongType())])
    with pytest.raises(ConfigError, match="renames 'zz', not a DataFrame column"):
        plan_columns(schema, {"zz": "x"})
    with pytest.raises(ConfigError, match="maps two DataFrame columns"):
        plan_columns(schema, {"a": "b"})


def test_unmappable_type_is_a_clear_error() -> None:
    from pyspark.sql.types import CalendarIntervalType

    with pytest.raises(ConfigError, match="has no Postgres mapping"):
        pg_type(CalendarIntervalType())


def test_column_values_use_assignment_conversion_unless_a_cast_is_needed() -> None:
    same = Column("a", "a", "bigint", "bigint", target_type="bigint")
    wider = Column("a", "a", "integer", "int", target_type="bigint")
    text_uuid = Column("a", "a", "text", "string", target_type="uuid")
    short = Column("a", "a", "text", "string", target_type="character varying(3)")
    tags = Column("a", "a", "text[]", "array<string>", target_type="jsonb")
    assert same.cast is None and wider.cast is None and short.cast is None  # INSERT converts, raising on overflow
    assert text_uuid.cast == "uuid" and text_uuid.sql_value("d.a") == "CAST(d.a AS uuid)"
    assert short.sql_value("d.a") == "d.a"  # an explicit CAST to varchar(3) would truncate silently
    assert tags.sql_value("d.a") == "to_jsonb(d.a)"
    assert Column("a", "a", "text[]", "array<string>", target_type="json").sql_value("d.a") == "to_jsonb(d.a)::json"
    assert Column("d", "d", "numeric(10,2)", "decimal(10,2)", target_type="numeric(12,2)").cast is None
    assert pickle.loads(pickle.dumps(text_uuid)) == text_uuid


@pytest.mark.parametrize(
    ("staged", "target", "ok"),
    [
        ("numeric(10,2)", "numeric", True),
        ("numeric(10,2)", "numeric(12,4)", True),
        ("numeric(10,2)", "numeric(10,1)", False),  # would round
        ("numeric(10,2)", "numeric(9,2)", False),  # could overflow
        ("numeric(38,0)", "numeric(38,0)", True),
    ],
)
def test_numeric_precision_and_scale(staged: str, target: str, ok: bool) -> None:
    assert compatible(staged, target) is ok
