"""What the target refused, in words an operator can act on: table, column or constraint, value.

Postgres names the column for NOT NULL and the constraint for CHECK/unique/foreign keys, with the
key or the failing row in its DETAIL; for data exceptions (class 22: a value too long for
``varchar(n)``, out of range, not castable) it names neither column nor value. There
:func:`describe` probes the staged rows column by column for the first value the target's column
type refuses. Probing costs work proportional to the batch, and only runs on the failure path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import psycopg
import pyarrow as pa
from psycopg import sql

from connectors.core.errors import FatalError
from sinks.postgres.options import TableName, quote_ident

__all__ = ["REFUSED_CLASSES", "DataRefused", "copy_value", "describe", "shorten"]

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
