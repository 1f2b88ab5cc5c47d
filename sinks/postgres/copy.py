"""Binary COPY of Arrow record batches into a (staging) table through psycopg.

Public API:

- ``create_staging(cur, target, columns, *, temporary=True) -> str``: a staging table for one
  transaction with ``columns`` [(name, pg type), ...]; returns its quoted SQL name. Temporary tables
  are ``ON COMMIT DROP``. Postgres refuses ``PREPARE TRANSACTION`` after touching a temporary table,
  so the two-phase sink passes ``temporary=False``: an UNLOGGED table next to ``target`` that the
  caller removes with ``drop_staging`` before PREPARE.
- ``copy_arrow(cur, table, columns, batches) -> int``: COPY ``table`` (columns) FROM STDIN in
  binary format, values taken by name from each Arrow batch; returns the number of rows.
- ``to_python(array, pg_type) -> list``: one Arrow column as Python values psycopg can dump in
  binary (maps become dicts, structs/maps/nested arrays become JSON).

Two encoders. When every column's Arrow type encodes to exactly the staged Postgres type, ``pgpq``
(Rust) turns each Arrow record batch into binary COPY bytes with no per-row Python work; this is
the common case (numbers, text, bytes, dates, timestamps, decimals, arrays of those). Otherwise
(JSON-staged structs and maps, a width that differs) psycopg's ``write_row`` with ``set_types``
packs the rows: its C implementation writes the format, the Python side turns each Arrow column
into a list once (``to_pylist``). Both stream: each batch is sent as it comes.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import itertools
import json
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import set_json_dumps

from sinks.postgres.options import TableName, quote_ident

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["arrow_encoder", "copy_arrow", "create_staging", "drop_staging", "json_dumps", "to_python"]


def _json_default(value: Any) -> Any:
    # Struct/map values may hold types JSON lacks; pick lossless, readable encodings.
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def json_dumps(value: Any) -> str:
    """JSON for jsonb columns: decimals as strings, timestamps ISO 8601, bytes base64. Never NaN or
    Infinity (JSON has neither; jsonb refuses them): ``refusal.Screen`` takes such rows out before the
    COPY, and one that got here would be a ValueError rather than invalid JSON."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def create_staging(
    cur: psycopg.Cursor,
    target: TableName,
    columns: Sequence[tuple[str, str]],
    *,
    temporary: bool = True,
) -> str:
    """Create a staging table for this transaction; return its SQL name (quoted)."""
    suffix = uuid.uuid4().hex[:16]
    defs = ", ".join(f"{quote_ident(name)} {type_}" for name, type_ in columns)
    if temporary:
        name = quote_ident(f"eos_stage_{suffix}")
        # ON COMMIT DROP: nothing to clean up, even when the task dies mid-way.
        cur.execute(f"CREATE TEMP TABLE {name} ({defs}) ON COMMIT DROP")
    else:
        name = TableName(target.schema, f"eos_stage_{suffix}").sql
        cur.execute(f"CREATE UNLOGGED TABLE {name} ({defs})")
    return name


def drop_staging(cur: psycopg.Cursor, name: str) -> None:
    """Drop a non-temporary staging table (inside the same transaction, before PREPARE)."""
    cur.execute(f"DROP TABLE IF EXISTS {name}")


def _map_to_dict(value: Any) -> Any:
    if value is None:
        return None
    return {str(k) if not isinstance(k, str) else k: v for k, v in value}


def _maps_inside(value: Any, type_: pa.DataType) -> Any:
    """Turn Arrow map values (lists of pairs) into dicts anywhere inside a nested value."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(type_):
        return {(k if isinstance(k, str) else json_dumps(k)): _maps_inside(v, type_.item_type) for k, v in value}
    if pa.types.is_struct(type_):
        return {f.name: _maps_inside(value.get(f.name), f.type) for f in type_}
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return [_maps_inside(v, type_.value_type) for v in value]
    return value


def _has_map(type_: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_map(type_):
        return True
    if pa.types.is_struct(type_):
        return any(_has_map(f.type) for f in type_)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return _has_map(type_.value_type)
    return False


def to_python(array: pa.Array | pa.ChunkedArray, pg_type: str) -> list[Any]:
    """Python values of one Arrow column, ready for psycopg's binary dumper of ``pg_type``."""
    import pyarrow as pa

    values: list[Any] = array.to_pylist()
    type_ = array.type
    if pg_type == "jsonb":
        if _has_map(type_):
            values = [_maps_inside(v, type_) for v in values]
        return values
    if pa.types.is_map(type_):
        return [_map_to_dict(v) for v in values]
    return values


_REGISTRY_NAMES = {
    "timestamp with time zone": "timestamptz",
    "timestamp without time zone": "timestamp",
    "double precision": "float8",
    "real": "float4",
    "smallint": "int2",
    "integer": "int4",
    "bigint": "int8",
    "boolean": "bool",
}


def copy_type(pg_type: str) -> str:
    """The name psycopg's type registry knows for a staged type: modifiers dropped, aliases resolved."""
    is_array = pg_type.endswith("[]")
    core = pg_type[:-2] if is_array else pg_type
    core = core.split("(", 1)[0].strip()
    core = _REGISTRY_NAMES.get(core, core)
    return core + ("[]" if is_array else "")


# pgpq's type names (``ddl()``) for the registry names of copy_type(). Binary timestamp and
# timestamptz are the same bytes (microseconds since 2000-01-01 UTC), so either takes TIMESTAMP.
_PGPQ_NAMES = {
    "BOOL": ("bool",),
    "INT2": ("int2",),
    "INT4": ("int4",),
    "INT8": ("int8",),
    "FLOAT4": ("float4",),
    "FLOAT8": ("float8",),
    "TEXT": ("text",),
    "BYTEA": ("bytea",),
    "DATE": ("date",),
    "TIMESTAMP": ("timestamp", "timestamptz"),
    "NUMERIC": ("numeric",),
}


def _pgpq_fits(ddl: str | None, staged: str) -> bool:
    if not ddl:
        return False
    if ddl.endswith("[]"):
        return staged.endswith("[]") and _pgpq_fits(ddl[:-2], staged[:-2])
    return staged in _PGPQ_NAMES.get(ddl, ())


def arrow_encoder(schema: pa.Schema, types: Sequence[str]) -> Any | None:
    """A pgpq encoder for batches of ``schema`` when each column encodes to its staged type, else None."""
    try:
        import pgpq
    except ImportError:  # pragma: no cover - a dependency; the psycopg path still works without it
        return None
    try:
        encoder = pgpq.ArrowToPostgresBinaryEncoder(schema)
        encoded = [c.data_type.ddl() for c in encoder.schema().columns]
    except Exception:  # a type pgpq does not encode (maps, ...): the psycopg path takes it
        return None
    if len(encoded) != len(types) or not all(_pgpq_fits(d, copy_type(t)) for d, t in zip(encoded, types, strict=True)):
        return None
    return encoder


def copy_arrow(
    cur: psycopg.Cursor,
    table: str,
    columns: Sequence[tuple[str, str]],
    batches: Iterable[pa.RecordBatch],
    *,
    targets: Sequence[str] | None = None,
) -> int:
    """COPY the named columns of every batch into ``table`` (binary format); return the row count.

    ``table`` is an SQL name (quoted as needed); ``columns`` are (Arrow field name, pg type) pairs,
    written to the table columns of the same names unless ``targets`` names them. A batch lacking
    one of the columns is a programming error (KeyError). Batches are sent as they come.
    """
    names = [name for name, _ in columns]
    types = [type_ for _, type_ in columns]
    rows = 0
    column_sql = ", ".join(quote_ident(n) for n in (targets or names))
    it = iter(batches)
    first = next((b for b in it if b.num_rows), None)
    if first is None:
        return 0
    first = first.select(names)
    encoder = arrow_encoder(first.schema, types)
    with cur.copy(f"COPY {table} ({column_sql}) FROM STDIN (FORMAT BINARY)") as copy:
        if encoder is not None:
            copy.write(encoder.write_header())
            for batch in itertools.chain((first,), it):
                if batch.num_rows:
                    copy.write(encoder.write_batch(batch.select(names)))
                    rows += batch.num_rows
            copy.write(encoder.finish())
            return rows
        set_json_dumps(json_dumps, context=cur)
        copy.set_types([copy_type(t) for t in types])
        write = copy.write_row
        for batch in itertools.chain((first,), it):
            if batch.num_rows == 0:
                continue
            index = {name: i for i, name in enumerate(batch.schema.names)}
            lists = [to_python(batch.column(index[n]), t) for n, t in columns]
            for row in zip(*lists, strict=True):
                write(row)
            rows += batch.num_rows
    return rows
