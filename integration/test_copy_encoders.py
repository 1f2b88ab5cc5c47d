"""The two binary COPY encoders write the same values: pgpq (Arrow-native) and psycopg's write_row."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from integration import test_twophase_support as support
from sinks.postgres import copy as copy_mod

twophase_pg = support.twophase_pg

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
COLUMNS = [
    ("id", "bigint"),
    ("small", "smallint"),
    ("n", "integer"),
    ("ok", "boolean"),
    ("f4", "real"),
    ("f8", "double precision"),
    ("price", "numeric(12,3)"),
    ("name", "text"),
    ("blob", "bytea"),
    ("day", "date"),
    ("at", "timestamp with time zone"),
    ("local", "timestamp without time zone"),
    ("tags", "text[]"),
    ("nums", "bigint[]"),
]


def _batch() -> pa.RecordBatch:
    big = bytes(range(256)) * 64
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "small": pa.array([-32768, None, 32767], pa.int16()),
            "n": pa.array([0, -(2**31), None], pa.int32()),
            "ok": pa.array([True, None, False]),
            "f4": pa.array([0.25, None, float("-inf")], pa.float32()),
            "f8": pa.array([float("inf"), 1e-300, None]),
            "price": pa.array([decimal.Decimal("1.500"), None, decimal.Decimal("-99999.999")], pa.decimal128(12, 3)),
            "name": pa.array(["plain", "ünïcödé ✓ 日本語 😀", None]),
            "blob": pa.array([b"\x00\xff", big, b""]),
            "day": pa.array([dt.date(2024, 1, 2), dt.date(1, 1, 1), None], pa.date32()),
            "at": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 600000), dt.datetime(1970, 1, 1), None], pa.timestamp("us", tz="UTC")
            ),
            "local": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5), None, dt.datetime(1999, 12, 31)], pa.timestamp("us")),
            "tags": pa.array([["a", None], [], None], pa.list_(pa.string())),
            "nums": pa.array([[1, 2], [None], None], pa.list_(pa.int64())),
        }
    )


def _write(dsn: str, table: str, batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        defs = ", ".join(f"{n} {t}" for n, t in COLUMNS)
        conn.execute(f"CREATE TABLE {table} ({defs})")  # type: ignore[arg-type]
        with conn.cursor() as cur:
            assert copy_mod.copy_arrow(cur, table, COLUMNS, batches) == sum(b.num_rows for b in batches)
        conn.commit()
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()  # type: ignore[arg-type]


def test_pgpq_and_psycopg_write_the_same_values(twophase_pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [_batch(), _batch().slice(0, 0)]
    used: list[bool] = []
    real = copy_mod.arrow_encoder

    def spy(schema: pa.Schema, types: Any) -> Any:
        enc = real(schema, types)
        used.append(enc is not None)
        return enc

    monkeypatch.setattr(copy_mod, "arrow_encoder", spy)
    fast = _write(twophase_pg.dsn, "enc_" + uuid.uuid4().hex[:8], batches)
    assert used == [True], "the Arrow-native encoder was not used for these types"
    monkeypatch.setattr(copy_mod, "arrow_encoder", lambda schema, types: None)
    slow = _write(twophase_pg.dsn, "enc_" + uuid.uuid4().hex[:8], batches)
    assert fast == slow
    assert fast[0][10] == dt.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    assert fast[1][9] == dt.date(1, 1, 1) and fast[1][8] == bytes(range(256)) * 64
    assert fast[0][6] == decimal.Decimal("1.500") and fast[2][6] == decimal.Decimal("-99999.999")


def test_columns_pgpq_cannot_encode_exactly_take_the_psycopg_path() -> None:
    schema = pa.schema([("id", pa.int64()), ("attrs", pa.struct([("a", pa.int64())]))])
    assert copy_mod.arrow_encoder(schema, ["bigint", "jsonb"]) is None
    assert copy_mod.arrow_encoder(pa.schema([("n", pa.int64())]), ["integer"]) is None  # widths differ
    assert copy_mod.arrow_encoder(pa.schema([("n", pa.int64())]), ["bigint"]) is not None
