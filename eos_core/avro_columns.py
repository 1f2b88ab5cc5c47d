"""Avro binary encoding by column: a struct column's Arrow array into Confluent wire-format records without a
Python call per record (issue 49: encoding was the sink's bottleneck, 0.30-0.37x Spark's JVM ``to_avro``).

Avro's binary encoding of a record is its fields' encodings one after the other: ``int``/``long`` (and the
``date``, ``timestamp-micros`` and ``local-timestamp-micros`` logical types, which Arrow holds as those integers)
a zigzag varint, ``float``/``double`` 4/8 bytes little-endian, ``boolean`` one byte, ``string``/``bytes`` a varint
length then the bytes, a union the varint index of its branch then that branch. Each field becomes an Arrow binary
array of its per-row encodings (numpy for the arithmetic), and Arrow's ``binary_join_element_wise`` concatenates
them row by row, behind the 5-byte header, in C.

``plan(schema, arrow_type)`` returns the encoding function for a writer schema and the column's Arrow type, or
None where the schema holds what is not encoded here (arrays, maps, enums, fixed, decimals, other unions, other
logical types): the caller encodes those record by record (``registry_avro.AvroEncoder.encode``, fastavro). A
batch in which a field the schema does not allow null holds one falls back too, so that the record-by-record path
names the row. ``tests/test_avro_property.py`` checks that every record is byte for byte what fastavro writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Fallback", "plan"]

_Encode = Callable[[pa.Array], pa.Array]
_EMPTY = pa.scalar(b"", pa.binary())


class Fallback(Exception):
    """This batch is encoded record by record (a null where the schema has none)."""


def _binary(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _varints(values: np.ndarray) -> pa.Array:
    """Each int64 as Avro's zigzag varint."""
    v = ((values.astype(np.int64) << 1) ^ (values.astype(np.int64) >> 63)).view(np.uint64)
    n = len(v)
    out = np.empty((n, 10), dtype=np.uint8)
    lengths = np.ones(n, dtype=np.int64)
    for k in range(10):
        low = (v & np.uint64(0x7F)).astype(np.uint8)
        v = v >> np.uint64(7)
        more = v != 0
        out[:, k] = low | (more.astype(np.uint8) << 7)
        lengths += more
    return _binary(lengths, out[np.arange(10) < lengths[:, None]])


def _ints(a: pa.Array) -> pa.Array:
    if pa.types.is_timestamp(a.type) or pa.types.is_date32(a.type):
        a = a.cast(pa.int64() if pa.types.is_timestamp(a.type) else pa.int32())
    return _varints(np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False)))


def _fixed(width: int, dtype: str) -> _Encode:
    def encode(a: pa.Array) -> pa.Array:
        filled = a.fill_null(0) if width > 1 else a.fill_null(False)
        values = np.ascontiguousarray(np.asarray(filled.to_numpy(zero_copy_only=False), dtype=dtype))
        if dtype == "<f4" and np.isnan(values).any():  # a signalling NaN quieted, as fastavro's write of it does
            values = values.copy()  # (Arrow's buffer is read-only)
            values.view(np.uint32)[np.isnan(values)] |= np.uint32(0x400000)
        return _binary(np.full(len(a), width, dtype=np.int64), values.view(np.uint8))

    return encode


def _bytes(a: pa.Array) -> pa.Array:
    if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
        try:
            a.validate(full=True)  # bytes that are not UTF-8 (Spark's CAST of binary does not check): record by record
        except pa.ArrowInvalid:
            raise Fallback from None
    raw = a.cast(pa.binary()).fill_null(b"")
    lengths = np.asarray(pc.binary_length(raw).to_numpy(zero_copy_only=False), dtype=np.int64)
    return pc.binary_join_element_wise(_varints(lengths), raw, _EMPTY)


_PRIMITIVE: dict[str, tuple[Callable[[pa.DataType], bool], _Encode]] = {
    "int": (lambda t: t in (pa.int8(), pa.int16(), pa.int32()), _ints),
    "long": (lambda t: t in (pa.int8(), pa.int16(), pa.int32(), pa.int64()), _ints),
    "float": (pa.types.is_float32, _fixed(4, "<f4")),
    "double": (pa.types.is_float64, _fixed(8, "<f8")),
    "boolean": (pa.types.is_boolean, _fixed(1, "u1")),
    "string": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), _bytes),
    "bytes": (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), _bytes),
}
# logical type -> (its base type, the Arrow values it takes)
_LOGICAL: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    "date": ("int", pa.types.is_date32),
    "timestamp-micros": ("long", lambda t: pa.types.is_timestamp(t) and t.unit == "us" and t.tz is not None),
    "local-timestamp-micros": ("long", lambda t: pa.types.is_timestamp(t) and t.unit == "us" and t.tz is None),
}


def _strict(encode: _Encode) -> _Encode:
    """A field the schema does not let be null: a batch holding a null there goes record by record."""

    def checked(a: pa.Array) -> pa.Array:
        if a.null_count:
            raise Fallback
        return encode(a)

    return checked


def _field(schema: Any, t: pa.DataType) -> _Encode | None:
    """The encoding of one Avro type for Arrow values of type ``t``, None where it is not encoded here."""
    if isinstance(schema, list):
        if len(schema) != 2 or "null" not in schema:
            return None
        null_first = schema[0] == "null"
        inner = _field(schema[1] if null_first else schema[0], t)
        if inner is None:
            return None
        null_tag, value_tag = (b"\x00", b"\x02") if null_first else (b"\x02", b"\x00")
        tag = pa.scalar(value_tag, pa.binary())
        null = pa.scalar(null_tag, pa.binary())
        return lambda a: _on_valid(a, lambda v: pc.binary_join_element_wise(tag, inner(v), _EMPTY), null)
    if isinstance(schema, str):
        found = _PRIMITIVE.get(schema)
        return _strict(found[1]) if found is not None and found[0](t) else None
    if not isinstance(schema, dict):
        return None
    logical = schema.get("logicalType")
    if logical is not None:
        base, fits = _LOGICAL.get(logical, ("", None))
        ok = fits is not None and schema.get("type") == base and fits(t)  # on another base: not encoded here
        return _strict(_ints) if ok else None
    if schema.get("type") == "record" and pa.types.is_struct(t):
        return _record(schema, t)
    if isinstance(schema.get("type"), str) and len(schema) == 1:  # {"type": "long"}
        return _field(schema["type"], t)
    return None


def _record(schema: dict[str, Any], t: pa.StructType) -> _Encode | None:
    names = [t.field(i).name for i in range(t.num_fields)]
    fields: list[tuple[int, _Encode]] = []
    for f in schema["fields"]:
        if f["name"] not in names:
            return None
        i = names.index(f["name"])
        one = _field(f["type"], t.field(i).type)
        if one is None:
            return None
        fields.append((i, one))

    def encode(a: pa.Array) -> pa.Array:
        if not fields:
            return pa.array([b""] * len(a), pa.binary())
        parts = [enc(a.field(i)) for i, enc in fields]
        return pc.binary_join_element_wise(*parts, _EMPTY) if len(parts) > 1 else parts[0]

    return _strict(encode)


def _on_valid(a: pa.Array, encode: _Encode, null: pa.Scalar) -> pa.Array:
    """``encode`` of the rows of ``a`` that are not null, ``null`` in the others' places (a null struct's fields
    hold anything: they are never encoded)."""
    if not a.null_count:
        return encode(a)
    valid = a.is_valid()
    encoded = encode(a.filter(valid))
    if len(encoded) == 0:
        return pa.array([null.as_py()] * len(a), pa.binary())
    positions = np.cumsum(np.asarray(valid.to_numpy(zero_copy_only=False), dtype=np.int64)) - 1
    return pc.if_else(valid, encoded.take(pa.array(np.maximum(positions, 0))), null)


def plan(schema: Any, arrow_type: pa.DataType, header: bytes) -> Callable[[pa.Array], pa.Array] | None:
    """What encodes a struct column of ``arrow_type`` with the parsed writer ``schema`` (a record) into
    ``header`` + body per row, a null row staying null; None where the schema is not encoded here. The function
    raises Fallback for a batch to encode record by record."""
    if not (isinstance(schema, dict) and schema.get("type") == "record" and pa.types.is_struct(arrow_type)):
        return None
    record = _record(schema, arrow_type)
    if record is None:
        return None
    head = pa.scalar(header, pa.binary())
    null = pa.scalar(None, pa.binary())

    def encode(a: pa.Array) -> pa.Array:
        if isinstance(a, pa.ChunkedArray):
            a = a.combine_chunks()
        return _on_valid(a, lambda v: pc.binary_join_element_wise(head, record(v), _EMPTY), null)  # null: a tombstone

    return encode
