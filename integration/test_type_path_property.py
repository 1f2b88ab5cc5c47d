"""A property of the whole type path, from Arrow batches to Postgres rows, in every mode of both sinks.

Hypothesis draws batches of every Spark type the sinks take (booleans, integers at their limits,
floats and doubles with NaN, infinities and -0.0, decimals at the precision limits, text with NUL
characters and invalid UTF-8 (surrogates encoded as UTF-8, stray continuation bytes), binary, dates and
timestamps (with and without time zone) including values outside Postgres' range, arrays, structs,
maps, arrays of structs, large values) and writes each batch through ``postgres-upsert`` and
``postgres-2pc`` with visibility=batch and visibility=partition, at the writer level (as Spark's tasks
and committer would; no Spark query), with ``errors.tolerance`` none or all.

The property, for every row: it ends **written exactly** (read back and compared value by value), or
**diverted** to the dead-letter table (errors.tolerance=all) naming the column, or the batch is
**refused before anything is visible** with an error naming the column and the value. Never a wedge
(every write returns or raises within the test's bounds; nothing stays prepared), never a silent
change (a row in the table equals what was sent), and a row with nothing Postgres refuses is never
diverted or refused.

Bounded: ``max_examples`` 30 per run, no deadline, derandomized (the same examples in CI every run);
``EOS_HYPOTHESIS_EXAMPLES`` raises the count for a longer hunt.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
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

from eos_core.errors import EosError
from integration.test_twophase_protocol import plan, sink
from integration.test_twophase_support import twophase_pg
from sinks.postgres.copy import json_dumps
from sinks.postgres.merge import KeyTracker
from sinks.postgres.options import UpsertOptions
from sinks.postgres.staging import UpsertPlanner, prepared_rows
from sinks.postgres.twophase import TwoPhaseStreamWriter
from sinks.postgres.upsert import write_transaction

__all__ = ["sink", "twophase_pg"]

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("EOS_HYPOTHESIS_EXAMPLES", "30"))

INNER = StructType(
    [
        StructField("x", DoubleType()),
        StructField("s", StringType()),
        StructField("d", DecimalType(10, 2)),
        StructField("t", TimestampType()),
        StructField("b", BinaryType()),
    ]
)
SCHEMA = StructType(
    [
        StructField("id", LongType(), False),
        StructField("bo", BooleanType()),
        StructField("i8", ByteType()),
        StructField("i16", ShortType()),
        StructField("i32", IntegerType()),
        StructField("i64", LongType()),
        StructField("f32", FloatType()),
        StructField("f64", DoubleType()),
        StructField("d38", DecimalType(38, 10)),
        StructField("d38i", DecimalType(38, 0)),
        StructField("s", StringType()),
        StructField("bin", BinaryType()),
        StructField("dt", DateType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("ai", ArrayType(IntegerType())),
        StructField("asx", ArrayType(StringType())),
        StructField("af", ArrayType(DoubleType())),
        StructField("st", INNER),
        StructField("m", MapType(StringType(), DoubleType())),
        StructField("ast", ArrayType(StructType([StructField("a", LongType()), StructField("b", StringType())]))),
    ]
)
INNER_ARROW = pa.struct(
    [
        ("x", pa.float64()),
        ("s", pa.string()),
        ("d", pa.decimal128(10, 2)),
        ("t", pa.timestamp("us", tz="UTC")),
        ("b", pa.binary()),
    ]
)
ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("bo", pa.bool_()),
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("d38", pa.decimal128(38, 10)),
        ("d38i", pa.decimal128(38, 0)),
        ("s", pa.string()),
        ("bin", pa.binary()),
        ("dt", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("ai", pa.list_(pa.int32())),
        ("asx", pa.list_(pa.string())),
        ("af", pa.list_(pa.float64())),
        ("st", INNER_ARROW),
        ("m", pa.map_(pa.string(), pa.float64())),
        ("ast", pa.list_(pa.struct([("a", pa.int64()), ("b", pa.string())]))),
    ]
)

# -- what hypothesis draws --------------------------------------------------------------------------

SPARK_MIN_US = -62135596800000000  # 0001-01-01 (Spark's timestamps and dates run 0001..9999)
SPARK_MAX_US = 253402300799999999  # 9999-12-31 23:59:59.999999
PG_OUT_US = [-211_000_000_000_000_000, -(2**62)]  # before 4713 BC: Postgres has no such timestamp
SPARK_MIN_DAYS, SPARK_MAX_DAYS = -719162, 2932896
PG_OUT_DAYS = [-2_500_000, -(2**31) + 5, 2_146_000_000]  # outside 4713 BC .. 5874897 AD

INVALID_UTF8 = [b"\xed\xa0\x80", b"ab\xed\xbf\xbfcd", b"\x80", b"x\xffy", b"\xc3", b"ok\xf0\x9f\x98"]
text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
text_nul = st.one_of(text, st.builds(lambda a, b: a + "\x00" + b, text, text))
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 5e-324, 1.7976931348623157e308])
)
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


def _dec(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    """decimal(precision, scale) values up to the limit, built from integers (exact: no context rounding)."""
    top = 10**precision - 1
    digits = st.one_of(st.integers(-top, top), st.sampled_from([top, -top, 0, 1]))
    return digits.map(lambda n: decimal.Decimal(f"{n}E-{scale}"))


def _ints(bits: int) -> st.SearchStrategy[int]:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0]))


def _maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


# strings: ("text", str) or ("raw", bytes): raw bytes become a string array Spark passes on unchecked
strings = st.one_of(
    text_nul.map(lambda t: ("text", t)),
    st.sampled_from(INVALID_UTF8).map(lambda b: ("raw", b)),
    st.integers(20_000, 200_000).map(lambda n: ("text", "é" * n)),  # a large value
)
micros = st.one_of(
    st.integers(SPARK_MIN_US, SPARK_MAX_US), st.sampled_from([SPARK_MIN_US, SPARK_MAX_US, 0, *PG_OUT_US])
)
days = st.one_of(
    st.integers(SPARK_MIN_DAYS, SPARK_MAX_DAYS), st.sampled_from([SPARK_MIN_DAYS, SPARK_MAX_DAYS, *PG_OUT_DAYS])
)
in_python = st.integers(SPARK_MIN_US, SPARK_MAX_US)  # inside a struct: JSON via Python datetimes

row_values = st.fixed_dictionaries(
    {
        "bo": _maybe(st.booleans()),
        "i8": _maybe(_ints(8)),
        "i16": _maybe(_ints(16)),
        "i32": _maybe(_ints(32)),
        "i64": _maybe(_ints(64)),
        "f32": _maybe(floats32),
        "f64": _maybe(floats),
        "d38": _maybe(_dec(38, 10)),
        "d38i": _maybe(_dec(38, 0)),
        "s": _maybe(strings),
        "bin": _maybe(st.one_of(st.binary(max_size=16), st.integers(60_000, 80_000).map(lambda n: b"\x00" * n))),
        "dt": _maybe(days),
        "ts": _maybe(micros),
        "ntz": _maybe(micros),
        "ai": _maybe(st.lists(_maybe(_ints(32)), max_size=4)),
        "asx": _maybe(st.lists(_maybe(text_nul), max_size=3)),
        "af": _maybe(st.lists(_maybe(floats), max_size=3)),
        "st": _maybe(
            st.fixed_dictionaries(
                {
                    "x": _maybe(floats),
                    "s": _maybe(text_nul),
                    "d": _maybe(_dec(10, 2)),
                    "t": _maybe(in_python),
                    "b": _maybe(st.binary(max_size=6)),
                }
            )
        ),
        "m": _maybe(st.dictionaries(text_nul, _maybe(floats), max_size=3)),
        "ast": _maybe(
            st.lists(_maybe(st.fixed_dictionaries({"a": _maybe(_ints(64)), "b": _maybe(text_nul)})), max_size=3)
        ),
    }
)
batches = st.lists(row_values, min_size=1, max_size=6)


def _us(v: int | None, tz: bool) -> Any:
    if v is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc if tz else None) + dt.timedelta(microseconds=v)


def _arrow(rows: list[dict[str, Any]], first_id: int) -> pa.RecordBatch:
    """The Arrow batch a Spark task would hand the sink (strings with invalid UTF-8 built from bytes)."""
    cols: dict[str, pa.Array] = {"id": pa.array(range(first_id, first_id + len(rows)), pa.int64())}
    for field in ARROW:
        name = field.name
        if name == "id":
            continue
        values = [r[name] for r in rows]
        if name == "s":
            raw = [None if v is None else (v[1] if v[0] == "raw" else v[1].encode()) for v in values]
            b = pa.array(raw, pa.binary())
            cols[name] = pa.Array.from_buffers(pa.string(), len(b), b.buffers(), offset=b.offset)
        elif name in ("ts", "ntz"):
            cols[name] = pa.array(values, pa.int64()).cast(field.type)
        elif name == "dt":
            cols[name] = pa.array(values, pa.int32()).cast(pa.date32())
        elif name == "st":
            cols[name] = pa.array([None if v is None else {**v, "t": _us(v["t"], True)} for v in values], field.type)
        elif name == "m":
            cols[name] = pa.array([None if v is None else list(v.items()) for v in values], field.type)
        else:
            cols[name] = pa.array(values, field.type)
    return pa.RecordBatch.from_pydict(cols, schema=ARROW)


# -- the oracle: what Postgres must take, and how it reads back ------------------------------------

PG_MIN_US = -210866803200000000


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    return False


def storable(row: dict[str, Any]) -> bool:
    """Whether Postgres can hold every value of ``row`` as sent (else it must be diverted or refused)."""
    s = row["s"]
    if s is not None and (s[0] == "raw" or "\x00" in s[1]):
        return False
    if row["asx"] is not None and _has_nul(row["asx"]):
        return False
    for json_col in ("st", "m", "ast"):
        if row[json_col] is not None and (_has_nul(row[json_col]) or _non_finite(row[json_col])):
            return False
    for col in ("ts", "ntz"):
        if row[col] is not None and row[col] < PG_MIN_US:
            return False
    return not (row["dt"] is not None and not (-2440588 <= row["dt"] < 2145042906))


def _json_expected(value: Any) -> Any:
    """What the sink's JSON encoding of a nested value reads back as (decimals as strings, ...)."""
    return json.loads(json_dumps(value))


def expected(row: dict[str, Any], rid: int) -> dict[str, Any]:
    """The row as it must read back (SELECT below), value by value."""
    out = {"id": rid}
    for name in ("bo", "i8", "i16", "i32", "i64", "d38", "d38i", "bin", "ai", "asx", "dt", "ts", "ntz"):
        out[name] = row[name]
    out["f32"] = None if row["f32"] is None else float(np.float32(row["f32"]))
    out["f64"] = row["f64"]
    out["af"] = row["af"]
    out["s"] = None if row["s"] is None else row["s"][1]
    st_ = row["st"]
    out["st"] = None if st_ is None else _json_expected({**st_, "t": _us(st_["t"], True)})
    out["m"] = None if row["m"] is None else _json_expected(row["m"])
    out["ast"] = None if row["ast"] is None else _json_expected(row["ast"])
    if out["bin"] is not None:
        out["bin"] = bytes(out["bin"])
    return out


SELECT = (
    "SELECT id, bo, i8, i16, i32, i64, f32, f64, d38, d38i, s, bin, (dt - DATE '1970-01-01')::bigint AS dt, "
    "(extract(epoch FROM ts) * 1000000)::numeric AS ts, (extract(epoch FROM ntz) * 1000000)::numeric AS ntz, "
    "ai, asx, af, st, m, ast FROM {table} ORDER BY id"
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, float) and not isinstance(a, bool):
        a = float(a)  # a JSON number without a fraction (jsonb prints 7.2e16 as 72000000000000000): as a double
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        return a is not None and b is not None and decimal.Decimal(a) == decimal.Decimal(b)
    return bool(a == b)


def _check_row(got: dict[str, Any], want: dict[str, Any]) -> None:
    if got["f32"] is not None:  # Postgres prints a real in its shortest form: the same float32, another double
        got = {**got, "f32": float(np.float32(got["f32"]))}
    for name, value in want.items():
        assert _same(got[name], value), f"column {name}: sent {value!r}, read back {got[name]!r} (row {want['id']})"


# -- the modes ----------------------------------------------------------------------------------------

TABLE_SQL = (
    "CREATE TABLE {t} (id bigint PRIMARY KEY, bo boolean, i8 smallint, i16 smallint, i32 integer, i64 bigint, "
    "f32 real, f64 double precision, d38 numeric(38,10), d38i numeric(38,0), s text, bin bytea, dt date, "
    "ts timestamptz, ntz timestamp, ai integer[], asx text[], af double precision[], st jsonb, m jsonb, ast jsonb)"
)


class Modes:
    """The three write paths under test against one Postgres; each mode has its own table."""

    def __init__(self, s: dict[str, Any]) -> None:
        self.s = s
        self.dsn = s["dsn"]
        self.batch = 0  # the upsert writes' batch id
        # each 2PC sink's next batch, as Spark numbers a stream's: one after another, and a batch that failed is
        # run again with its number (the sink refuses a batch whose predecessors it has no decision of)
        self.next_batch = {"batch": 0, "partition": 0}
        self.tables = {m: f"{s['table']}_{m}" for m in ("upsert", "batch", "partition")}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for t in self.tables.values():
                conn.execute(TABLE_SQL.format(t=t).encode())

    def reset(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for t in self.tables.values():
                conn.execute(f"TRUNCATE {t}".encode())
                if conn.execute("SELECT to_regclass(%s)", (f"{t}_refused",)).fetchone() != (None,):
                    conn.execute(f"TRUNCATE {t}_refused".encode())  # kept: the sinks create it once per process

    def write(self, mode: str, data: pa.RecordBatch, divert: bool) -> None:
        table = self.tables[mode]
        extra = {"errors.tolerance": "all", "errors.table": f"{table}_refused"} if divert else {}
        if mode == "upsert":
            opts = UpsertOptions.from_options({"dsn": self.dsn, "table": table, "key": "id", **extra})
            merge = UpsertPlanner(opts, SCHEMA).plan()
            keys = KeyTracker(merge.key)
            rows = list(prepared_rows(iter([data]), merge, opts, keys))
            self.batch += 1
            write_transaction(opts, merge, rows, keys=keys, batch_id=self.batch)
            return
        batch = self.next_batch[mode]
        opts = dict(self.s["opts"], table=table, visibility=mode, **{"sink.id": f"{self.s['sink_id']}-{mode}"}, **extra)
        plan(self.s["checkpoint"], batch)
        writer = TwoPhaseStreamWriter(opts, SCHEMA)
        half = max(1, data.num_rows // 2)
        msgs = []
        try:
            for p, part in enumerate((data.slice(0, half), data.slice(half))):
                self.s["state"]["ctx"] = (p, 0, p, batch, "q1", "run1")
                msgs.append(writer.write(iter([part])))
            TwoPhaseStreamWriter(opts, SCHEMA).commit(msgs, batch)
        except BaseException:
            TwoPhaseStreamWriter(opts, SCHEMA).abort(msgs, batch)  # as Spark does after a failed task/commit
            raise
        self.next_batch[mode] = batch + 1

    def read(self, mode: str) -> dict[int, dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            rows = cur.execute(SELECT.format(table=self.tables[mode]).encode()).fetchall()
        for r in rows:
            for c in ("ts", "ntz"):
                r[c] = None if r[c] is None else int(r[c])
            if r["bin"] is not None:
                r["bin"] = bytes(r["bin"])
        return {r["id"]: r for r in rows}

    def letters(self, mode: str) -> dict[int, tuple[str, str]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (f"{self.tables[mode]}_refused",)).fetchone()
            if not exists or exists[0] is None:
                return {}
            rows = conn.execute(
                f"SELECT (row->>'id')::bigint, column_name, message FROM {self.tables[mode]}_refused".encode()
            ).fetchall()
        out: dict[int, tuple[str, str]] = {}
        for rid, column, message in rows:
            assert rid not in out, f"row {rid} diverted twice"
            out[rid] = (column, message)
        return out

    def prepared(self) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"eos:{self.s['sink_id']}-",)
            ).fetchone()
            return int(row[0]) if row else 0


COLUMNS = [f.name for f in SCHEMA.fields]


def _holds(modes: Modes, mode: str, rows: list[dict[str, Any]], divert: bool) -> None:
    """Write ``rows`` in ``mode``; check the property."""
    data = _arrow(rows, 1)
    error: BaseException | None = None
    try:
        modes.write(mode, data, divert)
    except (EosError, psycopg.Error) as exc:
        error = exc
    got = modes.read(mode)
    assert modes.prepared() == 0, f"{mode}: a prepared transaction was left behind"
    if error is not None:
        text = str(error)
        assert not divert, f"{mode}: errors.tolerance=all, yet the batch failed: {text}"
        assert got == {}, f"{mode}: the batch was refused ({text}) but rows are visible"
        assert any(f'column "{c}"' in text for c in COLUMNS), f"{mode}: the refusal names no column: {text}"
        assert "value" in text, f"{mode}: the refusal names no value: {text}"
        assert not all(storable(r) for r in rows), f"{mode}: a batch Postgres can hold was refused: {text}"
        return
    letters = modes.letters(mode)
    for i, row in enumerate(rows, 1):
        if i in got:
            assert i not in letters, f"{mode}: row {i} written and diverted"
            _check_row(got[i], expected(row, i))
        else:
            assert i in letters, f"{mode}: row {i} neither written, diverted nor refused"
            assert divert and not storable(row), f"{mode}: row {i} diverted though Postgres can hold it: {letters[i]}"
            column, message = letters[i]
            assert column in COLUMNS and f'"{column}"' in message, letters[i]


@pytest.fixture
def modes(sink: dict[str, Any]) -> Modes:
    return Modes(sink)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rows=batches, divert=st.booleans())
def test_every_row_is_written_exactly_diverted_or_refused_by_name(
    modes: Modes, rows: list[dict[str, Any]], divert: bool
) -> None:
    modes.reset()
    for mode in ("upsert", "batch", "partition"):
        _holds(modes, mode, rows, divert)


def test_the_oracle_sees_poison(modes: Modes) -> None:
    """The oracle is not vacuous: a NUL, invalid UTF-8, NaN in JSON and an old timestamp are unstorable;
    the same row without them is stored exactly in every mode."""
    clean: dict[str, Any] = {k: None for k in (f.name for f in SCHEMA.fields) if k != "id"}
    clean.update(s=("text", "ok"), st={"x": 1.5, "s": "a", "d": decimal.Decimal("1.25"), "t": 0, "b": b"\x01"})
    assert storable(clean)
    for change in (
        {"s": ("text", "a\x00")},
        {"s": ("raw", b"\xed\xa0\x80")},
        {"m": {"k": math.nan}},
        {"ts": PG_OUT_US[0]},
        {"dt": PG_OUT_DAYS[0]},
    ):
        assert not storable({**clean, **change}), change
    modes.reset()
    for mode in ("upsert", "batch", "partition"):
        _holds(modes, mode, [clean], divert=False)
        assert set(modes.read(mode)) == {1}
