"""Rows the target refuses go to a dead-letter table, in the transaction that writes the good ones.

Public API (``postgres-upsert`` with ``errors.tolerance=all``):

- ``ErrorsPolicy`` (from ``sinks.postgres.options``): the parsed ``errors.*`` options.
- ``ensure_table(conn, table)``: the dead-letter table (driver side, ``CREATE TABLE IF NOT EXISTS``
  under the sink's DDL lock).
- ``merge_diverting(cur, staging, plan, staged, letters, unique=...)``: merge the staged rows into the
  target; a row the target refuses goes to the dead-letter table instead (``refused`` in the counts).
- ``replay(conn, table, target, batch=None, force=False)``: move dead-letter rows of ``target`` back
  into it, each in the transaction that deletes it from the dead-letter table, never undoing a later
  write of its key (version guard and tombstones; without a version column only keys the target
  lacks, unless ``force``); rows refused again, or kept, stay with the reason.
- ``summary(conn, table)``: refused rows per target and batch, for ``spark-eos sinks errors``;
  ``per_batch(conn, table, batches)``: counts for ``spark-eos sinks status --errors-table``.

How the refused rows are found. The merge first runs as one statement set under a savepoint: with
no refused row that is all it costs. When the target refuses (SQLSTATE class 22, a data exception:
length, range, a value the column type cannot take; class 23, an integrity violation: NOT NULL,
CHECK, unique, foreign key), it rolls back to the savepoint. Refusals one query can find (a NULL in
a NOT NULL column, a string longer than its column, a failing CHECK) are then taken out together,
one query per reason (``_screen``), and the merge is tried again. What is still refused (unique and
foreign keys, other data exceptions) is found by merging the staged rows in ordinal ranges of
``CHUNK`` rows, each under its own savepoint; a range refused is split in halves until the refused
row stands alone, and that row is written to the dead-letter table. Ranges are merged in ordinal
order, so the version guard and "last row wins" give the target what one merge of the good rows
would. The cost is one merge when nothing is refused, and grows with the number of refused rows
(measured in ``bench/upsert.py``).

Values the COPY itself cannot take (a NUL in text, NaN inside JSON, ...) never reach the merge: the
task stages such a row with its refusal in ``refusal.WHY`` (the value NULL), and ``merge_diverting``
moves those rows to the dead-letter table first, the value escaped into ``row``.

Exactly once. The dead-letter rows are inserted in the task's transaction, so they commit with the
good rows or not at all. A batch Spark replays (a crash after the task's commit, before Spark's
commit log) inserts them again: the table's primary key (target, batch, row digest) turns that into
a no-op, as the version guard does for the target. A row identical to another of the same batch is
stored once (the upsert sink writes such rows once as well).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from eos_core.errors import FatalError
from sinks.postgres.connection import ddl_lock
from sinks.postgres.merge import (
    DELETE_FLAG,
    ORDINAL,
    TOMBSTONE_SUFFIX,
    MergeCounts,
    MergePlan,
    merge_dedup,
    merge_staged,
    on_conflict,
)
from sinks.postgres.options import ErrorsPolicy, TableName, quote_ident
from sinks.postgres.refusal import ESCAPED_NOTE, REFUSED_CLASSES, WHY
from sinks.postgres.types import Column

__all__ = [
    "CHUNK",
    "DeadLetters",
    "ErrorsPolicy",
    "ReplayResult",
    "ensure_table",
    "merge_diverting",
    "per_batch",
    "refusable",
    "replay",
    "summary",
    "table_sql",
]

log = logging.getLogger(__name__)

LOGGED = 5
"""Refusals a task logs one by one (the rest are counted); all of them are in the dead-letter table."""

CHUNK = 256
"""Rows merged together once a task's merge was refused (a refused range is then halved)."""


def table_sql(table: TableName) -> str:
    """The dead-letter table: one row per refused input row."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table.sql} ("
        "target text NOT NULL, "  # the table that refused the row (schema-qualified as the sink names it)
        "sink_id text, "  # postgres-2pc: the sink.id; postgres-upsert: NULL (the target names the sink)
        "batch_id bigint NOT NULL, "  # Spark's micro-batch id; -1 for a batch write (df.write)
        "partition integer NOT NULL, "
        "ordinal bigint NOT NULL, "  # the row's place in its task
        "op text NOT NULL, "  # upsert | delete
        "error_class text NOT NULL, "  # data (SQLSTATE class 22) | integrity (class 23)
        "sqlstate text NOT NULL, "
        "message text NOT NULL, "
        "detail text, "
        "constraint_name text, "
        "column_name text, "
        "key_columns text[] NOT NULL, "  # the target's key and version columns, for replay
        "version_column text, "
        "row jsonb NOT NULL, "  # the row as the sink staged it, under the target's column names
        "row_digest text NOT NULL, "
        "refused_at timestamptz NOT NULL DEFAULT now(), "
        "replay_error text, "  # the last replay's refusal, when a replay was refused again
        "PRIMARY KEY (target, batch_id, row_digest))"
    )


def ensure_table(conn: psycopg.Connection, table: TableName) -> None:
    """Create the dead-letter table when missing (under the sink's DDL lock: writers may start at once)."""
    with ddl_lock(conn), conn.cursor() as cur:
        # only when missing: CREATE TABLE IF NOT EXISTS asks for CREATE on the schema even when it exists
        row = cur.execute("SELECT to_regclass(%s) IS NULL", (table.sql,)).fetchone()
        if row is not None and row[0]:
            cur.execute(table_sql(table).encode())
        # a table of 0.1 has no sink_id: added once (ALTER TABLE takes an exclusive lock even when the
        # column exists, which would wait for prepared transactions holding the table)
        cur.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'sink_id' "
            "AND NOT attisdropped)",
            (table.sql,),
        )
        row = cur.fetchone()
        if row is not None and row[0]:
            cur.execute(f"ALTER TABLE {table.sql} ADD COLUMN sink_id text".encode())
    if not conn.autocommit:
        conn.commit()


def refusable(exc: BaseException) -> bool:
    """A refusal of the row's values (class 22 data exception, class 23 integrity violation)."""
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, psycopg.Error) and state.startswith(REFUSED_CLASSES)


@dataclass(frozen=True)
class DeadLetters:
    """Where one task's refused rows go, and what they are tagged with.

    ``partition`` None: the rows come from many partitions (a ``postgres-2pc`` publish) and each
    row's partition and ordinal are read from its ``SOURCE`` column, ``(partition << 40) + ordinal``.
    ``attempt`` set: the rows are one write attempt's (a ``postgres-2pc`` gid, or a publish), which
    commits at most once per batch; it goes into ``row_digest`` with the row's place, so two equal
    rows (an append) are two dead letters, and a losing twin attempt never waits on the winner's."""

    table: TableName
    target: TableName
    batch_id: int | None
    partition: int | None
    attempt: str | None = None
    sink_id: str | None = None


SOURCE = "__eos_src"
"""A materialized publish's column with each row's ``(partition << 40) + ordinal``."""

PART_SHIFT = 40


def _range(staging: str, lo: int, hi: int) -> str:
    return (
        f"(SELECT * FROM {staging} WHERE {quote_ident(ORDINAL)} >= {int(lo)} AND {quote_ident(ORDINAL)} < {int(hi)}) r"
    )


def _try_merge(
    cur: psycopg.Cursor, relation: str, plan: MergePlan, unique: bool
) -> tuple[MergeCounts | None, psycopg.Error | None]:
    cur.execute(b"SAVEPOINT eos_merge")
    try:
        counts = merge_staged(cur, relation, plan, unique=unique)
    except psycopg.Error as exc:
        if not refusable(exc):
            raise
        cur.execute(b"ROLLBACK TO SAVEPOINT eos_merge")
        return None, exc
    cur.execute(b"RELEASE SAVEPOINT eos_merge")
    return counts, None


@dataclass(frozen=True)
class _Refusal:
    """What the target said about a refused row (one per row in the dead-letter table)."""

    sqlstate: str
    message: str
    detail: str | None = None
    constraint: str | None = None
    column: str | None = None

    @classmethod
    def of(cls, exc: psycopg.Error) -> _Refusal:
        diag = exc.diag
        return cls(
            exc.sqlstate or "?",
            (diag.message_primary or str(exc)).strip(),
            diag.message_detail,
            diag.constraint_name,
            diag.column_name,
        )


def merge_diverting(
    cur: psycopg.Cursor,
    staging: str,
    plan: MergePlan,
    staged: int,
    letters: DeadLetters,
    *,
    unique: bool = False,
    materialize: bool = False,
    limit: Callable[[int], None] | None = None,
) -> MergeCounts:
    """Merge ``staging`` into the target; rows it refuses go to the dead-letter table (see the module
    docstring); ``refused`` in the counts says how many. Non-refusal errors propagate unchanged.

    ``materialize``: ``staging`` is a view whose ``ORDINAL`` is ``(partition << 40) + ordinal`` (a
    ``postgres-2pc`` publish); once refused, its rows are copied into a temporary table numbered
    0..n-1 in that order (the original in ``SOURCE``), which the search below then works on.

    ``limit``: called with the count diverted so far after each diversion; it raises to stop the search
    at once (errors.max), so a mass refusal does not search the whole batch first.

    Rows the task staged with a refusal in ``WHY`` (values Postgres cannot take as sent, found before
    the COPY: ``refusal.Screen``) go to the dead-letter table first, with that refusal. Deferred
    constraints are made immediate for the rest of the transaction, so each statement of the search
    checks them (at COMMIT or PREPARE they would fail the whole batch, outside the search)."""
    cur.execute(b"SET CONSTRAINTS ALL IMMEDIATE")
    diverted = 0
    why = _has_column(cur, staging, WHY)
    if why and cur.execute(f"SELECT 1 FROM {staging} WHERE {quote_ident(WHY)} IS NOT NULL LIMIT 1".encode()).fetchone():
        if materialize:
            staging, staged = _materialize(cur, staging, plan, why=True)
            materialize = False
        diverted = _divert_unstorable(cur, staging, plan, letters)
        if limit is not None:
            limit(diverted)
    counts, error = _try_merge(cur, staging, plan, unique)
    if error is None:
        assert counts is not None
        return MergeCounts(staged, counts.upserted, counts.deleted, counts.tombstoned, diverted)
    if materialize:
        staging, staged = _materialize(cur, staging, plan, why=why)
    # The reads below pick rows by ordinal: an index keeps each read as small as what it picks.
    cur.execute(f"CREATE INDEX ON {staging} ({quote_ident(ORDINAL)})".encode())
    cur.execute(f"ANALYZE {staging}".encode())
    for _ in range(SCREENS):
        assert error is not None
        found = _screen(cur, staging, plan, error, unique)
        if not found:
            break
        for ordinals, refusal in found:
            diverted += _divert(cur, staging, plan, ordinals, refusal, letters, logged=diverted)
            if limit is not None:
                limit(diverted)
        counts, error = _try_merge(cur, staging, plan, unique)
        if error is None:
            assert counts is not None
            return MergeCounts(staged, counts.upserted, counts.deleted, counts.tombstoned, diverted)
    total = MergeCounts(staged=staged)

    def merge_range(lo: int, hi: int, known: psycopg.Error | None) -> None:
        nonlocal total, diverted
        if known is None:
            done, known = _try_merge(cur, _range(staging, lo, hi), plan, unique)
            if known is None:
                assert done is not None
                total = total + MergeCounts(0, done.upserted, done.deleted, done.tombstoned)
                return
        if hi - lo == 1:
            diverted += _divert(cur, staging, plan, [lo], _Refusal.of(known), letters, logged=diverted)
            if limit is not None:
                limit(diverted)
            return
        mid = (lo + hi) // 2
        merge_range(lo, mid, None)
        merge_range(mid, hi, None)

    for lo in range(0, staged, CHUNK):
        merge_range(lo, min(lo + CHUNK, staged), None)
    return MergeCounts(staged, total.upserted, total.deleted, total.tombstoned, diverted)


def _has_column(cur: psycopg.Cursor, relation: str, column: str) -> bool:
    row = cur.execute(
        b"SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s AND NOT attisdropped",
        (relation, column),
    ).fetchone()
    return row is not None


def _materialize(cur: psycopg.Cursor, view: str, plan: MergePlan, *, why: bool = False) -> tuple[str, int]:
    names = [n for n, _ in plan.staging_columns() if n != ORDINAL] + ([WHY] if why else [])
    cols = ", ".join(quote_ident(n) for n in names)
    o = quote_ident(ORDINAL)
    cur.execute(
        f"CREATE TEMP TABLE eos_refusing ON COMMIT DROP AS SELECT {cols}, "
        f"(row_number() OVER (ORDER BY {o}) - 1) AS {o}, {o} AS {quote_ident(SOURCE)} FROM {view}".encode()
    )
    return "pg_temp.eos_refusing", max(cur.rowcount, 0)


SCREENS = 8
"""Set-based screens tried before the ranges (each removes every row refused for one reason)."""

_LENGTH = re.compile(r"^(?:character varying|character|varchar|char|bpchar)\((\d+)\)$")


def _screen(
    cur: psycopg.Cursor, staging: str, plan: MergePlan, exc: psycopg.Error, unique: bool
) -> list[tuple[list[int], _Refusal]]:
    """The rows refused for the reason ``exc`` names, found in one query each: a NULL in a NOT NULL
    column (23502), a string longer than its column (22001), a failing CHECK (23514). Only rows the
    merge would write are looked at (the newest of each key, not deletes). [] when the reason is
    another, or the query cannot be built or run (the ranges then find the rows one by one)."""
    state = exc.sqlstate or ""
    refusal = _Refusal.of(exc)
    preds: list[tuple[str, _Refusal]] = []
    by_target = {c.target: c for c in plan.columns}
    if state == "23502" and refusal.column in by_target:
        preds.append((f"x.{quote_ident(str(refusal.column))} IS NULL", refusal))
    elif state == "22001":
        for c in plan.columns:
            m = _LENGTH.match((c.target_type or "").strip())
            if m:
                why = _Refusal(state, f"value too long for type {c.target_type}", column=c.target)
                preds.append((f"length(rtrim(x.{quote_ident(c.target)}::text, ' ')) > {int(m.group(1))}", why))
    elif state == "23514" and refusal.constraint:
        row = cur.execute(
            b"SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
            b"AND conname = %s AND contype = 'c'",
            (plan.target.sql, refusal.constraint),
        ).fetchone()
        text = str(row[0]) if row else ""
        if text.startswith("CHECK "):
            expr = text[len("CHECK ") :].removesuffix(" NOT VALID")
            preds.append((f"({expr}) IS FALSE", _Refusal(state, refusal.message, None, refusal.constraint)))
    if not preds:
        return []
    cols = ", ".join(f"s.{quote_ident(c.name)} AS {quote_ident(c.target)}" for c in plan.columns)
    rows = f"(SELECT s.{quote_ident(ORDINAL)} AS eos_ord, {cols} FROM ({merge_dedup(plan, staging, unique)}) s"
    rows += f" WHERE NOT s.{quote_ident(DELETE_FLAG)}) x" if plan.deletes else ") x"
    found: list[tuple[list[int], _Refusal]] = []
    seen: set[int] = set()
    cur.execute(b"SAVEPOINT eos_screen")
    try:
        for pred, why in preds:
            ords = [int(r[0]) for r in cur.execute(f"SELECT eos_ord FROM {rows} WHERE {pred}".encode()).fetchall()]
            ords = [o for o in ords if o not in seen]
            seen.update(ords)
            if ords:
                found.append((ords, why))
    except psycopg.Error:  # an expression that does not apply to the staged types: leave it to the ranges
        cur.execute(b"ROLLBACK TO SAVEPOINT eos_screen")
        return []
    cur.execute(b"RELEASE SAVEPOINT eos_screen")
    return found


def _divert(
    cur: psycopg.Cursor,
    staging: str,
    plan: MergePlan,
    ordinals: list[int],
    why: _Refusal,
    letters: DeadLetters,
    *,
    logged: int = 0,
) -> int:
    """Move the staged rows ``ordinals`` into the dead-letter table (a row a replayed batch put there
    before stays as it is) and out of the staging table; returns how many."""
    fields = {
        "cls": "%(cls)s",
        "state": "%(state)s",
        "message": "%(message)s",
        "detail": "%(detail)s",
        "constraint": "%(constraint)s",
        "column": "%(column)s",
    }
    params = {
        "ords": ordinals,
        "cls": "data" if why.sqlstate.startswith("22") else "integrity",
        "state": why.sqlstate,
        "message": why.message,
        "detail": why.detail,
        "constraint": why.constraint,
        "column": why.column,
    }
    where = f"s.{quote_ident(ORDINAL)} = ANY(%(ords)s)"
    placed = _insert_letters(cur, staging, plan, letters, fields, params, where)
    cur.execute(f"DELETE FROM {staging} WHERE {quote_ident(ORDINAL)} = ANY(%s)".encode(), (ordinals,))
    _log(placed, letters, why.message, why.sqlstate, logged)
    return len(ordinals)


def _divert_unstorable(cur: psycopg.Cursor, staging: str, plan: MergePlan, letters: DeadLetters) -> int:
    """Move the rows staged with a refusal in ``WHY`` into the dead-letter table, each with its own
    refusal, and the values Postgres could not hold put back (escaped) into its ``row``."""
    w = f"(s.{quote_ident(WHY)}::jsonb)"
    fields = {
        "cls": "'data'",
        "state": f"{w} ->> 'sqlstate'",
        "message": f"{w} ->> 'message'",
        "detail": f"{w} ->> 'detail'",
        "constraint": "NULL",
        "column": f"{w} ->> 'column'",
    }
    where = f"s.{quote_ident(WHY)} IS NOT NULL"
    placed = _insert_letters(
        cur, staging, plan, letters, fields, {}, where, values=f"coalesce({w} -> 'values', '{{}}')"
    )
    gone = cur.execute(f"DELETE FROM {staging} s WHERE {where}".encode())
    count = max(gone.rowcount, 0)
    _log(placed, letters, "a value Postgres cannot take as sent (see the message)", "22", 0)
    return count


def _insert_letters(
    cur: psycopg.Cursor,
    staging: str,
    plan: MergePlan,
    letters: DeadLetters,
    fields: dict[str, str],
    params: dict[str, Any],
    where: str,
    *,
    values: str | None = None,
) -> list[tuple[int, int]]:
    """INSERT the staged rows ``where`` picks into the dead-letter table; ``fields`` are SQL for the
    refusal's columns, ``values`` SQL for a jsonb of values that replace the staged ones in ``row``."""
    names = {c.name: c.target for c in plan.columns}
    op = f"CASE WHEN s.{quote_ident(DELETE_FLAG)} THEN 'delete' ELSE 'upsert' END" if plan.deletes else "'upsert'"
    if not plan.key:
        op = "'insert'"
    row = (
        "(SELECT jsonb_object_agg(coalesce(%(names)s::jsonb ->> e.key, e.key), e.value) "
        f"FROM jsonb_each(to_jsonb(s.*) - '{ORDINAL}' - '{DELETE_FLAG}' - '{SOURCE}' - '{WHY}') e)"
    )
    if values is not None:
        row = f"({row} || {values})"
    ord_col = quote_ident(ORDINAL)
    if letters.partition is None:
        src = quote_ident(SOURCE)
        part, place = f"(s.{src} >> {PART_SHIFT})::int", f"(s.{src} & {(1 << PART_SHIFT) - 1})"
    else:
        part, place = "%(partition)s", f"s.{ord_col}"
    digest = (
        "md5(x.row::text)"
        if letters.attempt is None
        else f"md5(%(attempt)s || ':' || {part} || ':' || {place} || ':' || x.row::text)"
    )
    params = {
        **params,
        "names": json.dumps(names),
        "target": str(letters.target),
        "sink": letters.sink_id,
        "batch": -1 if letters.batch_id is None else letters.batch_id,
        "partition": letters.partition,
        "attempt": letters.attempt,
        "keys": [plan.column(k).target for k in plan.key],
        "version": plan.column(plan.version).target if plan.version else None,
    }
    f = fields
    sql = (
        f"INSERT INTO {letters.table.sql} (target, sink_id, batch_id, partition, ordinal, op, error_class, "
        "sqlstate, message, detail, constraint_name, column_name, key_columns, version_column, row, row_digest) "
        f"SELECT %(target)s, %(sink)s, %(batch)s, {part}, {place}, {op}, {f['cls']}, {f['state']}, {f['message']}, "
        f"{f['detail']}, {f['constraint']}, {f['column']}, %(keys)s, %(version)s, x.row, {digest} "
        f"FROM {staging} s CROSS JOIN LATERAL (SELECT {row} AS row) x "
        f"WHERE {where} ON CONFLICT DO NOTHING RETURNING partition, ordinal"
    )
    try:
        cur.execute(sql.encode(), params)
        return [(int(p), int(o)) for p, o in cur.fetchall()]  # each row's place, as the dead-letter table names it
    except psycopg.Error as exc:
        state = exc.sqlstate or ""
        if not state.startswith(("22", "23", "42")):
            raise  # not about the table's shape (a lost connection, a timeout): as any other error
        # the dead-letter table's own refusal must not read as the target's (nor take a batch back)
        raise FatalError(
            f"the dead-letter table {letters.table} (errors.table) refused the rows {letters.target} refused: "
            f"{exc.diag.message_primary or type(exc).__name__} (sqlstate {state}). It must have the columns "
            "spark-eos creates (docs/bad-rows.md) and no constraint of its own: fix it, or name a new table",
            option="errors.table",
            sqlstate=state,
        ) from None


def _log(placed: list[tuple[int, int]], letters: DeadLetters, message: str, sqlstate: str, logged: int) -> None:
    for partition, ordinal in sorted(placed)[: max(0, LOGGED - logged)]:
        log.warning(
            "%s refused row %d of partition %d (batch %s): %s (sqlstate %s); diverted to %s",
            letters.target,
            ordinal,
            partition,
            letters.batch_id,
            message,
            sqlstate,
            letters.table,
        )


@dataclass(frozen=True)
class ReplayResult:
    moved: int  # rows that left the dead letters: written, or superseded (counted in ``superseded`` too)
    refused: int  # rows the target refused again; they stay, with replay_error set
    kept: int = 0  # rows that would change a row no version orders them against; they stay (``force``)
    superseded: int = 0  # of ``moved``: rows a newer version or a later delete (tombstone) beat; not written


def replay(
    conn: psycopg.Connection,
    table: TableName,
    target: TableName,
    batch: int | None = None,
    *,
    force: bool = False,
) -> ReplayResult:
    """Move ``target``'s dead-letter rows (of ``batch``, or all) back into it, in one transaction: each
    row leaves the dead-letter table in the transaction in which it reaches the target. Rows go in the
    order they were refused, each by the rule the sink's own merge follows:

    - with a version column: the version-guarded merge, honouring the tombstone table
      (``<target>__eos_tombstones``): a row whose key holds a newer version, or was deleted with a
      newer version since, is superseded (it leaves the dead letters, the target keeps what it has);
    - without a version column nothing says whether the target's row for the key is older or newer
      than the refused one: an upsert goes in only when the target has no row for its key, a delete
      only removes a row with ``force``; otherwise the row stays (``kept``, its ``replay_error`` says
      why) unless ``force`` (the refused row then overwrites, or deletes, the target's);
    - an append's row (no key) is inserted.

    A row the target refuses again stays (its ``replay_error`` says why); the others move."""
    moved = refused = kept = superseded = 0
    with conn.transaction(), conn.cursor() as cur:
        where = "target = %s" + ("" if batch is None else " AND batch_id = %s")
        params: tuple[Any, ...] = (str(target),) if batch is None else (str(target), batch)
        rows = cur.execute(
            f"SELECT batch_id, row_digest, op, key_columns, version_column, row, "
            f"coalesce(strpos(detail, %s) > 0, false) FROM {table.sql} WHERE {where} "
            "ORDER BY batch_id, partition, ordinal FOR UPDATE".encode(),
            (ESCAPED_NOTE, *params),
        ).fetchall()
        types = _column_types(cur, target) if rows else {}
        tombstones = _tombstones(cur, target) if rows else None

        def note(batch_id: int, digest: str, why: str) -> None:
            cur.execute(
                f"UPDATE {table.sql} SET replay_error = %s WHERE target = %s AND batch_id = %s "
                "AND row_digest = %s".encode(),
                (why, str(target), batch_id, digest),
            )

        for batch_id, digest, op, keys, version, row, escaped in rows:
            if escaped:  # replayed as stored, the escaped text (\\x00, "NaN") would be written: never
                note(batch_id, digest, ESCAPED_KEPT)
                kept += 1
                continue
            cur.execute(b"SAVEPOINT eos_replay")
            try:
                outcome, why = _replay_row(
                    cur, target, op, list(keys), version, dict(row), types, tombstones, force=force
                )
            except psycopg.Error as exc:
                if not refusable(exc):
                    raise
                cur.execute(b"ROLLBACK TO SAVEPOINT eos_replay")
                note(batch_id, digest, (exc.diag.message_primary or str(exc)).strip())
                refused += 1
                continue
            if outcome == "kept":
                cur.execute(b"ROLLBACK TO SAVEPOINT eos_replay")
                note(batch_id, digest, why)
                kept += 1
                continue
            cur.execute(
                f"DELETE FROM {table.sql} WHERE target = %s AND batch_id = %s AND row_digest = %s".encode(),
                (str(target), batch_id, digest),
            )
            cur.execute(b"RELEASE SAVEPOINT eos_replay")
            moved += 1
            superseded += outcome == "superseded"
    return ReplayResult(moved, refused, kept, superseded)


ESCAPED_KEPT = (
    "its row holds a value Postgres cannot store, escaped (see detail); replayed as stored the escaped text "
    f"would be written: repair the value in row and remove '{ESCAPED_NOTE}' from detail, then replay"
)

_REPLAY_ROW = "pg_temp.eos_replay_row"


def _column_types(cur: psycopg.Cursor, target: TableName) -> dict[str, str]:
    rows = cur.execute(
        b"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
        b"AND attnum > 0 AND NOT attisdropped",
        (target.sql,),
    ).fetchall()
    return {str(n): str(t) for n, t in rows}


def _tombstones(cur: psycopg.Cursor, target: TableName) -> TableName | None:
    tomb = target.derived(TOMBSTONE_SUFFIX)
    row = cur.execute(b"SELECT to_regclass(%s) IS NOT NULL", (tomb.sql,)).fetchone()
    return tomb if row and row[0] else None


def _replay_row(
    cur: psycopg.Cursor,
    target: TableName,
    op: str,
    keys: list[str],
    version: str | None,
    row: dict[str, Any],
    types: dict[str, str],
    tombstones: TableName | None,
    *,
    force: bool,
) -> tuple[str, str]:
    """Replay one dead-letter row: ("moved" | "superseded" | "kept", why)."""
    columns = list(row)
    params = {"row": json.dumps(row)}
    rec = f"jsonb_populate_record(NULL::{target.sql}, %(row)s::jsonb)"
    cols = ", ".join(quote_ident(c) for c in columns)
    if op == "insert" or not keys:  # an append's row (postgres-2pc mode=append): no key, nothing to order
        cur.execute(f"INSERT INTO {target.sql} ({cols}) SELECT {cols} FROM {rec}".encode(), params)
        return "moved", ""
    match = " AND ".join(f"t.{quote_ident(k)} = r.{quote_ident(k)}" for k in keys)
    if version is None:
        held = cur.execute(
            f"SELECT 1 FROM {target.sql} t, {rec} r WHERE {match} FOR UPDATE OF t".encode(), params
        ).fetchone()
        if held is not None and not force:
            what = "delete it" if op == "delete" else "overwrite it"
            return "kept", (
                "kept: the target has a row with this key and no version column says which is newer; "
                f"replay-errors --force would {what}"
            )
        if op == "delete":
            if held is None:
                return "superseded", ""  # nothing to delete
            cur.execute(f"DELETE FROM {target.sql} t USING {rec} r WHERE {match}".encode(), params)
            return "moved", ""
        conflict = (
            on_conflict(keys, columns, None)
            if force
            else f"ON CONFLICT ({', '.join(map(quote_ident, keys))}) DO NOTHING"
        )
        cur.execute(f"INSERT INTO {target.sql} AS t ({cols}) SELECT {cols} FROM {rec} {conflict}".encode(), params)
        if cur.rowcount < 1:  # a row for the key came in meanwhile (a concurrent writer): not ours to overwrite
            return (
                "kept",
                "kept: the target got a row with this key while replaying; replay-errors --force overwrites it",
            )
        return "moved", ""
    # With a version column: the sink's own merge of this one row, tombstones included, so a row older
    # than the key's current version (a row or a tombstone) cannot overwrite or resurrect it.
    deletes = tombstones is not None
    if op == "delete" and not deletes:  # no tombstone table: the version-guarded delete alone
        v = quote_ident(version)
        cur.execute(
            f"DELETE FROM {target.sql} t USING {rec} r WHERE {match} AND (t.{v} IS NULL OR t.{v} < r.{v})".encode(),
            params,
        )
        return ("moved" if cur.rowcount > 0 else "superseded"), ""
    merge_cols = tuple(Column(c, c, types[c], "", True, types[c]) for c in columns if c in types)
    plan = MergePlan(target, merge_cols, tuple(keys), version, deletes)
    staged = ", ".join(quote_ident(c.name) for c in merge_cols)
    extra = f", {op == 'delete'} AS {quote_ident(DELETE_FLAG)}" if deletes else ""
    cur.execute(
        f"CREATE TEMP TABLE eos_replay_row ON COMMIT DROP AS SELECT {staged}, 0::bigint AS {quote_ident(ORDINAL)}"
        f"{extra} FROM {rec}".encode(),
        params,
    )
    counts = merge_staged(cur, _REPLAY_ROW, plan, 1, unique=True)
    cur.execute(f"DROP TABLE {_REPLAY_ROW}".encode())
    wrote = counts.upserted + counts.deleted + counts.tombstoned
    return ("moved" if wrote else "superseded"), ""


def per_batch(
    conn: psycopg.Connection, table: TableName, batches: list[int], target: str | None = None
) -> dict[int, int]:
    """Dead-letter rows per batch id among ``batches`` (of ``target`` only, when given)."""
    where = "batch_id = ANY(%s)" + ("" if target is None else " AND target = %s")
    params: tuple[Any, ...] = (batches,) if target is None else (batches, target)
    rows = conn.execute(f"SELECT batch_id, count(*) FROM {table.sql} WHERE {where} GROUP BY 1".encode(), params)
    return {int(b): int(n) for b, n in rows.fetchall()}


def summary(conn: psycopg.Connection, table: TableName) -> list[dict[str, Any]]:
    """Refused rows per target, batch and error (newest batches first)."""
    rows = conn.execute(
        f"SELECT target, batch_id, error_class, sqlstate, coalesce(constraint_name, column_name, ''), count(*), "
        f"count(replay_error), min(message) FROM {table.sql} GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2 DESC, 6 DESC".encode()
    ).fetchall()
    return [
        {
            "target": r[0],
            "batch": None if r[1] == -1 else r[1],
            "class": r[2],
            "sqlstate": r[3],
            "where": r[4] or None,
            "rows": r[5],
            "refused_again": r[6],
            "message": r[7],
        }
        for r in rows
    ]
