"""What the target refused, in words an operator can act on: table, column or constraint, value.

Postgres names the column for NOT NULL and the constraint for CHECK/unique/foreign keys, with the
key or the failing row in its DETAIL; for data exceptions (class 22: a value too long for
``varchar(n)``, out of range, not castable) it names neither column nor value. There
:func:`describe` probes the staged rows column by column for the first value the target's column
type refuses. Probing costs work proportional to the batch, and only runs on the failure path.

Before any of that, ``Screen`` checks each Arrow batch a task COPYs for the values Postgres cannot
take as sent (the COPY itself would fail, naming nothing) or would change without a word
(``unstorable``): refused here naming column, value, row and reason, or staged with the refusal in
``WHY`` for ``deadletter.merge_diverting`` (errors.tolerance=all).
"""

from __future__ import annotations

import decimal
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from eos_core.errors import FatalError
from sinks.postgres.options import TableName, quote_ident
from sinks.postgres.types import Column, base_type

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = [
    "REFUSED_CLASSES",
    "WHY",
    "DataRefused",
    "Screen",
    "Unstaged",
    "Unstorable",
    "copy_value",
    "describe",
    "shorten",
    "unstorable",
    "why_of",
]

log = logging.getLogger(__name__)

REFUSED_CLASSES = ("22", "23")
"""SQLSTATE classes of a refusal of the row's values: 22 data exceptions, 23 integrity violations."""

_VALUE_CHARS = 80
_DETAIL_CHARS = 300


class DataRefused(FatalError):
    """The target refused rows of a batch (types, lengths, NOT NULL, CHECK, keys, a timeout).

    Raised before anything of the batch is visible, with the batch left undecided, so a query
    fixed to produce other rows, restarted from the same checkpoint, writes the batch anew.
    """


def shorten(text: object, limit: int = _VALUE_CHARS) -> str:
    value = str(text)
    return value if len(value) <= limit else value[: limit - 3] + "..."


# Does the value fit the column? Inserted as a literal, it passes the column type's input function
# with its modifier, as the publish's INSERT does (an explicit CAST would silently truncate a
# varchar). The probe row is undone by raising; the exception block is a subtransaction.
_FITS = """
CREATE OR REPLACE FUNCTION pg_temp.eos_fits(v text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
  BEGIN
    EXECUTE format('INSERT INTO pg_temp.eos_probe VALUES (%L)', v);
    RAISE SQLSTATE 'EOSOK';
  EXCEPTION
    WHEN SQLSTATE 'EOSOK' THEN RETURN true;
    WHEN others THEN RETURN false;
  END;
END $f$
"""


def _target_types(conn: psycopg.Connection, target: TableName) -> dict[str, str]:
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
        (target.sql,),
    ).fetchall()
    return {str(name): str(kind) for name, kind in rows}


def _probe(
    conn: psycopg.Connection,
    target: TableName,
    columns: list[tuple[str, str]],
    staged: sql.Composable,
    where: sql.Composable,
) -> tuple[str, str, str] | None:
    """(target column, its type, the first staged value it refuses) or None."""
    types = _target_types(conn, target)
    conn.execute(_FITS.encode())
    for source, column in columns:
        kind = types.get(column)
        if kind is None:
            continue
        conn.execute(b"DROP TABLE IF EXISTS pg_temp.eos_probe")
        conn.execute(f"CREATE TEMP TABLE eos_probe (v {kind})".encode())
        row = conn.execute(
            sql.SQL(
                "SELECT {col}::text FROM {staged} WHERE {where} AND {col} IS NOT NULL "
                "AND NOT pg_temp.eos_fits({col}::text) LIMIT 1"
            ).format(col=sql.Identifier(source), staged=staged, where=where)
        ).fetchone()
        if row is not None:
            return column, kind, str(row[0])
    return None


_COPY_AT = re.compile(r"^COPY [^,]+, line (\d+), column ([^:]+)")


def copy_value(exc: psycopg.Error, batches: Iterable[pa.RecordBatch], names: dict[str, str]) -> str | None:
    """For a binary COPY that failed at "line N, column c": the value the task sent there, found in
    its Arrow batches (``names`` maps table columns to batch columns). None when not traceable."""
    m = _COPY_AT.match((exc.diag.context or "").strip())
    if m is None:
        return None
    line, column = int(m.group(1)), m.group(2).strip()
    field = names.get(column)
    if field is None:
        return None
    row = line - 1
    for batch in batches:
        if row < batch.num_rows:
            value = batch.column(batch.schema.get_field_index(field))[row].as_py()
            return f"column {quote_ident(column)} (row {line} of the task) refuses the value {shorten(value)!r}"
        row -= batch.num_rows
    return None


def describe(
    exc: psycopg.Error,
    *,
    target: TableName,
    sent: str | None = None,
    connect: object = None,
    columns: list[tuple[str, str]] = (),  # type: ignore[assignment]
    staged: sql.Composable | None = None,
    where: sql.Composable | None = None,
) -> str:
    """One sentence: what was refused, where, and the value (shortened; never connection secrets).

    ``columns`` maps staged column -> target column; with ``connect`` (a callable returning a new
    autocommit connection), ``staged`` and ``where``, a class-22 error is traced to its column and value.
    """
    diag = exc.diag
    state = exc.sqlstate or "?"
    primary = (diag.message_primary or str(exc)).strip()
    parts = [f"table {target.sql} refused the batch: {primary} (sqlstate {state})"]
    if diag.column_name:
        parts.append(f"column {quote_ident(diag.column_name)}")
    if diag.constraint_name:
        parts.append(f"constraint {quote_ident(diag.constraint_name)}")
    if diag.message_detail:
        parts.append(f"detail: {shorten(diag.message_detail.strip(), _DETAIL_CHARS)}")
    if sent is not None:
        parts.append(sent)
    elif diag.context and diag.context.startswith("COPY "):  # "COPY t, line 3, column code"
        parts.append(f"at {shorten(diag.context.strip().splitlines()[0], _DETAIL_CHARS)}")
    if state.startswith("22") and not diag.column_name and connect is not None and staged is not None:
        conn = None
        try:
            conn = connect()  # type: ignore[operator]
            found = _probe(conn, target, list(columns), staged, where or sql.SQL("true"))
            if found is not None:
                column, kind, value = found
                parts.append(f"column {quote_ident(column)} ({kind}) refuses the value {shorten(value)!r}")
        except Exception as probe_exc:  # diagnostics must never hide the refusal itself
            log.warning("could not trace the refused value to a column: %s", probe_exc)
        finally:
            if conn is not None:
                conn.close()
    return "; ".join(parts)


# ---- values Postgres cannot store, or would store changed: found in the task before any COPY ------
#
# COPY refuses a NUL character in text, invalid UTF-8, NaN or a NUL inside JSON, a date or timestamp out
# of Postgres' range: the whole COPY fails, before the diverting merge can pick the row out, and with a
# message that names neither column nor value. Other values Postgres takes but changes without a word:
# text cut to 63 bytes in a ``name`` column, microseconds rounded by ``timestamp(p)``, a float rounded
# into ``numeric``, a NaN version (it sorts above every number, so the key never takes a newer row).
# ``unstorable`` finds all of them in an Arrow batch, vectorised where Arrow can; ``Screen`` refuses the
# task's rows before anything is visible (naming column, value, row and reason) or, with
# errors.tolerance=all, stages each such row with its refusal in the ``WHY`` column for
# ``deadletter.merge_diverting`` to divert (the value Postgres cannot hold is staged NULL and written,
# escaped, to the dead-letter row).

WHY = "__eos_why"
"""A staged column (text, JSON) with the refusal of a row whose value Postgres cannot take as sent."""

PG_MIN_TIMESTAMP_US = -210866803200000000  # 4713-11-24 BC 00:00 UTC, in microseconds since 1970
PG_MIN_DATE_DAYS = -2440588  # 4713-11-24 BC, in days since 1970
PG_END_DATE_DAYS = 2145042906  # 5874898-01-01, the first day Postgres' date cannot hold
NAME_BYTES = 63
FLOAT_DIGITS = {"float": 6, "double": 15}  # significant digits Postgres keeps converting to numeric


@dataclass(frozen=True)
class Unstorable:
    """One value of a batch that Postgres cannot take as sent (``replace``: stage it NULL)."""

    row: int  # in the batch
    column: str  # the batch's column (DataFrame name)
    target: str  # the table column
    target_type: str
    sqlstate: str
    reason: str
    shown: str  # the value for messages (escaped, shortened)
    escaped: Any = None  # the value as the dead-letter row holds it (JSON)
    replace: bool = True


ESCAPED_NOTE = "the dead-letter row holds it escaped"
"""In ``detail`` of a dead-letter row whose ``row`` holds a value Postgres could not store, escaped
(``replay-errors`` keeps such a row until it is repaired)."""


def why_of(found: Sequence[Unstorable], place: str) -> str:
    """The ``WHY`` value (JSON) of one row: the first refusal names the row's error; every value that
    cannot be staged is in ``values`` (target column -> escaped), for the dead-letter row."""
    first = found[0]
    details = "; ".join(f"column {quote_ident(u.target)}: the value {u.shown}" for u in found)
    values = {u.target: u.escaped for u in found if u.replace}
    return json.dumps(
        {
            "column": first.target,
            "sqlstate": first.sqlstate,
            "message": f"column {quote_ident(first.target)} ({first.target_type}): {first.reason}",
            "detail": f"{place}; {details}" + (f"; {ESCAPED_NOTE}" if values else ""),
            "values": values,
        },
        ensure_ascii=False,
    )


def _escape_bytes(raw: bytes) -> str:
    """Text for a value with NUL or invalid UTF-8: bad bytes as \\xNN, a backslash doubled."""
    text = raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return text.replace("\x00", "\\x00")


def _escape_json(value: Any) -> Any:
    """A nested value with NaN/Infinity as the strings "NaN"/"Infinity" and NUL as \\x00, for the dead letter."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, str):
        return _escape_bytes(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {_escape_json(k): _escape_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escape_json(v) for v in value]
    if isinstance(value, (int, bool)) or value is None:
        return value
    return str(value)


def _leaves(array: pa.Array, rows: np.ndarray) -> Iterator[tuple[pa.Array, np.ndarray, bool]]:
    """Every leaf array inside ``array`` with the batch row of each of its values, and whether it is a
    map key. Struct children, list/map entries (by offsets: Arrow's kernels do not take maps)."""
    import numpy as np
    import pyarrow as pa

    type_ = array.type
    if pa.types.is_struct(type_):
        for child in array.flatten():
            yield from _leaves(child, rows)
    elif pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_map(type_):
        offsets = np.asarray(array.offsets)
        entries = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        parents = np.repeat(rows, np.diff(offsets))
        if pa.types.is_map(type_):
            keys, items = entries.flatten()
            yield keys, parents, True
            yield from _leaves(items, parents)
        else:
            yield from _leaves(entries, parents)
    else:
        yield array, rows, False


def _bad_utf8(array: pa.Array) -> list[tuple[int, bytes]]:
    """(row, raw bytes) of the strings of ``array`` that are not valid UTF-8 (Spark passes bytes on)."""
    import pyarrow as pa

    try:
        array.validate(full=True)
        return []
    except pa.ArrowInvalid:
        pass
    binary = pa.Array.from_buffers(
        pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary(),
        len(array),
        array.buffers(),
        offset=array.offset,
    )
    bad = []
    for i, raw in enumerate(binary.to_pylist()):
        if raw is not None:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                bad.append((i, raw))
    return bad


def _may_hold_nul(array: pa.Array) -> bool:
    """Whether the bytes of a string array's values hold a NUL (a scan of its data buffer, ~30x faster
    than ``match_substring``, which then finds the rows; bytes under a null slot may give a false alarm)."""
    import numpy as np
    import pyarrow as pa

    buffers = array.buffers()
    if len(buffers) < 3 or buffers[2] is None:
        return False
    width = np.dtype(np.int64 if pa.types.is_large_string(array.type) else np.int32)
    offsets = np.frombuffer(buffers[1], dtype=width, count=len(array) + 1, offset=array.offset * width.itemsize)
    lo, hi = int(offsets[0]), int(offsets[-1])
    return not np.frombuffer(buffers[2], dtype=np.uint8, count=hi - lo, offset=lo).all()


def _is_text(type_: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(type_) or pa.types.is_large_string(type_))


def _typmod(target: str) -> int | None:
    m = re.search(r"\((\d+)(?:,\s*(\d+))?\)", target)
    return int(m.group(1)) if m else None


def unstorable(batch: pa.RecordBatch, columns: Sequence[Column], version: str | None = None) -> list[Unstorable]:
    """The values of ``batch`` (columns by DataFrame name) Postgres cannot take as sent, or would change."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    found: dict[tuple[int, str], Unstorable] = {}  # the first refusal of each (row, column)
    names = set(batch.schema.names)

    def add(
        row: int, c: Column, state: str, reason: str, shown: str, escaped: Any = None, replace: bool = True
    ) -> None:
        if (row, c.name) not in found:
            target_type = c.target_type or c.pg_type
            found[(row, c.name)] = Unstorable(
                row, c.name, c.target, target_type, state, reason, shown, escaped, replace
            )

    for c in columns:
        if c.name not in names:
            continue
        array = batch.column(batch.schema.get_field_index(c.name))
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        target = base_type(c.target_type or c.pg_type)
        json_staged = base_type(c.pg_type) == "jsonb"
        rows = np.arange(len(array))
        for leaf, where, is_key in _leaves(array, rows):
            kind = leaf.type
            if _is_text(kind):
                for i, raw in _bad_utf8(leaf):
                    shown = shorten(repr(raw))
                    add(
                        int(where[i]),
                        c,
                        "22021",
                        "invalid UTF-8 byte sequence",
                        shown,
                        _escape_value(array, int(where[i])),
                    )
                if leaf.null_count < len(leaf) and _may_hold_nul(leaf):
                    try:
                        mask = pc.fill_null(pc.match_substring(leaf, "\x00"), False)
                    except pa.ArrowInvalid:  # invalid UTF-8 found above
                        mask = None
                    if mask is not None and pc.any(mask).as_py():
                        for k in np.flatnonzero(np.asarray(mask)):
                            row = int(where[k])
                            what = "a JSON key" if is_key else "JSON" if json_staged else "text"
                            add(
                                row,
                                c,
                                "22P05" if json_staged else "22021",
                                f"{what} cannot hold the NUL character (0x00)",
                                shorten(repr(leaf[int(k)].as_py())),
                                _escape_value(array, row),
                            )
            elif json_staged and pa.types.is_floating(kind) and len(leaf):
                values = np.asarray(leaf.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
                for k in np.flatnonzero(~np.isfinite(values)):
                    row = int(where[k])
                    add(
                        row,
                        c,
                        "22P02",
                        f"JSON has no {_escape_json(float(values[k]))}: jsonb cannot hold the value",
                        shorten(repr(_escape_json(array[row].as_py()))),
                        _escape_value(array, row),
                    )
        _changed(array, c, target, add, version)
    order = {c.name: i for i, c in enumerate(columns)}
    return sorted(found.values(), key=lambda u: (u.row, order[u.column]))


def _escape_value(array: pa.Array, row: int) -> Any:
    """The value at ``row`` escaped for a jsonb dead-letter row (as ``to_jsonb`` would, but storable)."""
    import pyarrow as pa

    try:
        value = array[row].as_py()
    except (UnicodeDecodeError, pa.ArrowInvalid):  # invalid UTF-8 somewhere inside: the raw bytes, escaped
        raw = pa.Array.from_buffers(pa.binary(), len(array), array.buffers(), offset=array.offset)[row].as_py()
        return _escape_bytes(raw) if isinstance(raw, bytes) else None
    if isinstance(value, list) and value and isinstance(value[0], tuple) and pa.types.is_map(array.type):
        value = {json.dumps(k) if not isinstance(k, str) else k: v for k, v in value}
    return _escape_json(value)


def _changed(array: pa.Array, c: Column, target: str, add: Any, version: str | None) -> None:
    """Values Postgres would take but change: name cut, timestamp(p) rounding, float -> numeric rounding,
    a NaN version; dates and timestamps outside Postgres' range."""
    import numpy as np
    import pyarrow as pa

    type_ = array.type
    valid = ~np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if target == "name" and _is_text(type_):
        _changed_name(array, c, add)
    if pa.types.is_timestamp(type_) and len(array):
        _changed_timestamp(array, c, target, add, valid)
    if pa.types.is_date32(type_) and len(array):
        _changed_date(array, c, add, valid)
    if pa.types.is_floating(type_) and len(array):
        _changed_float(array, c, target, add, version, valid)


def _changed_name(array: pa.Array, c: Column, add: Any) -> None:
    """A text value longer than a ``name`` holds: Postgres would cut it."""
    import numpy as np
    import pyarrow.compute as pc

    lengths = np.asarray(pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False))
    for i in np.flatnonzero(lengths > NAME_BYTES):
        add(
            int(i),
            c,
            "22001",
            f"value too long for type name ({NAME_BYTES} bytes): Postgres would cut it to {NAME_BYTES} bytes",
            shorten(repr(array[int(i)].as_py())),
            replace=False,
        )


def _changed_timestamp(array: pa.Array, c: Column, target: str, add: Any, valid: Any) -> None:
    """A timestamp before Postgres' first day, or one that ``timestamp(p)`` would round."""
    import numpy as np
    import pyarrow as pa

    type_ = array.type
    micros = np.asarray(array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    unit = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 0}[type_.unit]
    if unit:
        low = PG_MIN_TIMESTAMP_US // unit
        for i in np.flatnonzero(valid & (micros < low)):
            add(
                int(i),
                c,
                "22008",
                "timestamp out of range for Postgres (4713 BC to 294276 AD)",
                f"{int(micros[i]) * unit} microseconds since 1970-01-01",
                f"{int(micros[i]) * unit}us since 1970",
            )
        places = _typmod(c.target_type or "") if target.startswith("timestamp") else None
        if places is not None and places < 6 and unit == 1:
            step = 10 ** (6 - places)
            for i in np.flatnonzero(valid & (micros >= low) & (micros % step != 0)):
                add(
                    int(i),
                    c,
                    "22001",
                    f"{c.target_type} would round the value to {places} fractional digits",
                    shorten(repr(str(array[int(i)].as_py()))),
                    replace=False,
                )


def _changed_date(array: pa.Array, c: Column, add: Any, valid: Any) -> None:
    """A date outside Postgres' range."""
    import numpy as np
    import pyarrow as pa

    days = np.asarray(array.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    for i in np.flatnonzero(valid & ((days < PG_MIN_DATE_DAYS) | (days >= PG_END_DATE_DAYS))):
        add(
            int(i),
            c,
            "22008",
            "date out of range for Postgres (4713 BC to 5874897 AD)",
            f"{int(days[i])} days since 1970-01-01",
            f"{int(days[i])} days since 1970",
        )


def _changed_float(array: pa.Array, c: Column, target: str, add: Any, version: str | None, valid: Any) -> None:
    """A NaN version, or a float that ``numeric`` would round to another number."""
    import numpy as np
    import pyarrow as pa

    type_ = array.type
    values = np.asarray(array.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
    if c.name == version:
        for i in np.flatnonzero(valid & np.isnan(values)):
            add(
                int(i),
                c,
                "22000",
                "a NaN version sorts above every number in Postgres: the key would never take a newer row",
                "NaN",
                replace=False,
            )
    if target == "numeric":
        digits = FLOAT_DIGITS["float" if pa.types.is_float32(type_) else "double"]
        scale = _numeric_scale(c.target_type or "")
        for i in np.flatnonzero(valid & np.isfinite(values)):
            v = float(values[i])
            kept = decimal.Decimal(f"{v:.{digits}g}")  # what float8_numeric / float4_numeric keep
            if scale is not None:
                kept = kept.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)
            back = float(kept) if digits == 15 else float(np.float32(float(kept)))
            if back != v:  # read back, it is another number
                add(
                    int(i),
                    c,
                    "22001",
                    f"{c.target_type} would round the {'double' if digits == 15 else 'real'} value to {kept}",
                    repr(v),
                    replace=False,
                )


def _numeric_scale(target: str) -> int | None:
    m = re.search(r"numeric\((\d+)(?:,\s*(-?\d+))?\)", target.replace(" ", ""))
    return None if m is None else int(m.group(2) or 0)


class Unstaged(Exception):
    """A value found that a direct COPY into the table cannot take (``Screen`` with ``on_found="raise"``):
    the caller takes its rows through a staging table, where they are diverted."""


class Screen:
    """The task's batches, each checked by ``unstorable`` as it streams into COPY (one pass per try).

    ``on_found``: ``"refuse"`` raises ``DataRefused`` naming column, value, row and reason (nothing is
    visible yet: the caller's transaction rolls back); ``"divert"`` (errors.tolerance=all) stages the
    row with its refusal in ``WHY`` (the values Postgres cannot hold staged NULL), every batch gaining
    the column; ``"raise"`` raises ``Unstaged`` (a direct COPY that must go through staging instead).
    ``found`` counts the rows with a refusal (the last pass)."""

    def __init__(
        self, columns: Sequence[Column], *, where: str, version: str | None = None, on_found: str = "refuse"
    ) -> None:
        self.columns = tuple(columns)
        self.where = where
        self.version = version
        self.on_found = on_found
        self.found = 0

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        offset = 0
        self.found = 0
        for batch in batches:
            bad = unstorable(batch, self.columns, self.version) if batch.num_rows else []
            if bad and self.on_found == "refuse":
                u = bad[0]
                raise DataRefused(
                    f"{self.where}: column {quote_ident(u.target)} ({u.target_type}) cannot take the value {u.shown} "
                    f"of row {offset + u.row + 1} of the task: {u.reason}. Nothing of the batch was written; filter or "
                    "repair such rows (or change the column's type) and restart from the same checkpoint, or set "
                    "errors.tolerance=all to divert them to the dead-letter table",
                    column=u.target,
                    sqlstate=u.sqlstate,
                )
            if bad and self.on_found == "raise":
                raise Unstaged(bad[0].reason)
            if self.on_found == "divert":
                batch = _with_why(batch, bad, offset)
                self.found += len({u.row for u in bad})
            offset += batch.num_rows
            yield batch


def _with_why(batch: pa.RecordBatch, bad: Sequence[Unstorable], offset: int) -> pa.RecordBatch:
    import numpy as np
    import pyarrow as pa

    by_row: dict[int, list[Unstorable]] = {}
    for u in bad:
        by_row.setdefault(u.row, []).append(u)
    why: list[str | None] = [None] * batch.num_rows
    for row, found in by_row.items():
        why[row] = why_of(found, f"row {offset + row + 1} of the task")
    arrays = list(batch.columns)
    for name in {u.column for u in bad if u.replace}:
        i = batch.schema.get_field_index(name)
        rows = {u.row for u in bad if u.replace and u.column == name}
        column = arrays[i]
        # the value Postgres cannot hold is staged NULL (the dead-letter row gets it escaped from WHY)
        padded = pa.concat_arrays([column, pa.nulls(1, column.type)])
        take = np.arange(len(column))
        take[sorted(rows)] = len(column)
        arrays[i] = padded.take(pa.array(take))
    arrays.append(pa.array(why, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, WHY])
