"""Merge a staged batch into the target: dedup per key, version-guarded upsert, deletes, tombstones.

Public API:

- ``MergePlan`` (frozen, picklable): target table, written columns, key, version, deletes. A plan
  without a key is an append: every staged row is inserted (``postgres-2pc`` mode=append routes its
  dead-letter path through it).
- ``MergePlan.staging_columns()``: the (name, pg type) columns a staging table needs: the written
  columns under their DataFrame names, then ``ORDINAL`` (bigint, input order within the task) and,
  when deletes are on, ``DELETE_FLAG`` (boolean).
- ``merge_statements(plan, staging, unique=False) -> list[(label, sql)]`` and
  ``merge_staged(cur, staging, plan, unique=False) -> MergeCounts``: run inside a transaction the
  caller owns (the upsert sink commits it; the two-phase sink prepares it). ``unique=True`` (the
  caller proved every staged key distinct, see ``KeyTracker``) skips the per-key dedup, a sort of
  the whole staging table.
- ``KeyTracker``: proves, as batches stream by, that a task's keys are all distinct (exactly: by
  the keys themselves for one integer column, else by 64-bit hashes, where a collision only costs
  the dedup), in 8 bytes per row up to ``MAX_TRACKED`` rows.
- ``tombstone_sql(plan) -> str`` / ``ensure_tombstones(conn, plan)``: the tombstone table.

Semantics (docs/postgres-upsert.md states them for users):

- Within a batch, the rows of one key collapse to one: the highest version, ties (and no version
  column) broken by the last in input order (``ORDINAL``), deterministically.
- Version guard: a row replaces the stored one only when the stored version is lower (or NULL).
  An equal version is a no-op: the stored row is not rewritten, so a replay writes nothing and of
  two different rows with one version the first one stored stays.
- Deletes (``delete.column`` true, or a tombstone row) remove the key under the same guard. With a
  version column every applied delete leaves a row (key, version) in ``<table>__eos_tombstones``;
  an upsert applies only when its version is above the tombstone's, and removes the tombstone. So a
  replayed, older upsert cannot resurrect a deleted key. Invariant: per key at most one of (row,
  tombstone) exists, and "the current version" of a key is the version of whichever exists.
- Concurrency: with tombstones, every statement first locks the batch's keys through the tombstone
  table's primary key (placeholder rows with a NULL version, removed at the end), in key order, so
  a concurrent delete and upsert of one key serialize instead of racing (READ COMMITTED gives each
  later statement a fresh snapshot). Without tombstones the target's unique index does that job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from sinks.postgres.connection import ddl_lock
from sinks.postgres.options import TableName, quote_ident
from sinks.postgres.types import Column

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = [
    "DELETE_FLAG",
    "MAX_TRACKED",
    "ORDINAL",
    "TOMBSTONE_SUFFIX",
    "KeyTracker",
    "MergeCounts",
    "MergePlan",
    "ensure_tombstones",
    "merge_dedup",
    "merge_staged",
    "merge_statements",
    "on_conflict",
    "tombstone_sql",
]

ORDINAL = "__eos_ord"
DELETE_FLAG = "__eos_del"
TOMBSTONE_SUFFIX = "__eos_tombstones"


@dataclass(frozen=True)
class MergeCounts:
    """What one merge did: rows inserted or updated, rows deleted, tombstones written, rows the
    target refused (diverted to the dead-letter table with errors.tolerance=all)."""

    staged: int = 0
    upserted: int = 0
    deleted: int = 0
    tombstoned: int = 0
    refused: int = 0

    def __add__(self, other: MergeCounts) -> MergeCounts:
        return MergeCounts(
            self.staged + other.staged,
            self.upserted + other.upserted,
            self.deleted + other.deleted,
            self.tombstoned + other.tombstoned,
            self.refused + other.refused,
        )


@dataclass(frozen=True)
class MergePlan:
    """How to merge: built on the driver from the checked table, pickled to every task."""

    target: TableName
    columns: tuple[Column, ...]  # written columns; Column.name = staging/DataFrame name, .target = table
    key: tuple[str, ...]  # DataFrame names of the key columns
    version: str | None = None  # DataFrame name of the version column
    deletes: bool = False

    def __post_init__(self) -> None:
        if not self.key and (self.version or self.deletes):
            raise ValueError("merge plan: a version or deletes need a key")
        names = {c.name for c in self.columns}
        missing = [k for k in (*self.key, *([self.version] if self.version else [])) if k not in names]
        if missing:
            raise ValueError(f"merge plan: key/version columns {missing} are not among the written columns")

    @property
    def tombstones(self) -> TableName | None:
        """The tombstone table: only with deletes and a version (without a version there is no guard)."""
        if self.deletes and self.version:
            return self.target.derived(TOMBSTONE_SUFFIX)
        return None

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def staging_columns(self) -> list[tuple[str, str]]:
        cols = [(c.name, c.pg_type) for c in self.columns]
        cols.append((ORDINAL, "bigint"))
        if self.deletes:
            cols.append((DELETE_FLAG, "boolean"))
        return cols


MAX_TRACKED = 8_000_000  # rows whose keys a task tracks (64 MB); beyond, the merge dedups


@dataclass
class KeyTracker:
    """Whether every key a task staged is distinct; fed each prepared batch (``see``) in order."""

    key: tuple[str, ...]
    rows: int = 0
    _parts: list[np.ndarray] = field(default_factory=list)
    _gave_up: bool = False

    def see(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self._gave_up:
            return
        if self.rows > MAX_TRACKED:
            self._gave_up, self._parts = True, []
            return
        self._parts.append(self._codes(batch))

    def _codes(self, batch: pa.RecordBatch) -> np.ndarray:
        import numpy as np
        import pyarrow as pa

        cols = [batch.column(batch.schema.get_field_index(k)) for k in self.key]
        if len(cols) == 1 and pa.types.is_integer(cols[0].type):
            return np.asarray(cols[0].cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        from pandas.util import hash_array

        codes = np.zeros(batch.num_rows, dtype=np.uint64)
        for col in cols:  # nulls were refused before: every key value is set
            values = col.to_numpy(zero_copy_only=False)
            codes = codes * np.uint64(1_000_003) + hash_array(np.asarray(values, dtype=object))
        return codes

    @property
    def unique(self) -> bool:
        """True only when it is proven: no key seen twice (a hash collision says False)."""
        import numpy as np

        if self._gave_up:
            return False
        if not self._parts:
            return True
        codes = np.concatenate(self._parts)
        return bool(np.unique(codes).size == codes.size)


def _q(name: str) -> str:
    return quote_ident(name)


def _expr(c: Column, alias: str = "d") -> str:
    """The staged value of ``c`` as it goes into the table (see ``Column.sql_value``)."""
    return c.sql_value(f"{alias}.{_q(c.name)}")


def _dedup(plan: MergePlan, staging: str, unique: bool = False) -> str:
    if unique or not plan.key:  # every key once, or an append: nothing to collapse
        return f"SELECT * FROM {staging}"
    keys = ", ".join(_q(k) for k in plan.key)
    order = [keys]
    if plan.version:
        order.append(f"{_q(plan.version)} DESC NULLS LAST")
    order.append(f"{_q(ORDINAL)} DESC")
    return f"SELECT DISTINCT ON ({keys}) * FROM {staging} ORDER BY {', '.join(order)}"


def merge_dedup(plan: MergePlan, staging: str, unique: bool = False) -> str:
    """The SELECT of the staged rows a merge writes: the newest row of each key (all rows when unique)."""
    return _dedup(plan, staging, unique)


def _key_match(plan: MergePlan, left: str, right: str = "d") -> str:
    return " AND ".join(f"{left}.{_q(plan.column(k).target)} = {_expr(plan.column(k), right)}" for k in plan.key)


def on_conflict(keys: list[str], columns: list[str], version: str | None) -> str:
    """``ON CONFLICT (keys) DO UPDATE`` of the other columns under the version guard (table column
    names; the target is aliased ``t``), or ``DO NOTHING`` when only keys are written."""
    sql = f"ON CONFLICT ({', '.join(_q(k) for k in keys)}) DO "
    updates = [c for c in columns if c not in keys]
    if not updates:
        return sql + "NOTHING"
    sql += "UPDATE SET " + ", ".join(f"{_q(c)} = EXCLUDED.{_q(c)}" for c in updates)
    if version:
        v = _q(version)
        sql += f" WHERE t.{v} IS NULL OR t.{v} < EXCLUDED.{v}"
    return sql


def _upsert(plan: MergePlan, staging: str, where: str = "", join: str = "", unique: bool = False) -> str:
    targets = ", ".join(_q(c.target) for c in plan.columns)
    values = ", ".join(_expr(c) for c in plan.columns)
    if not plan.key:  # an append
        return f"INSERT INTO {plan.target.sql} ({targets}) SELECT {values} FROM ({_dedup(plan, staging)}) d"
    conflict = on_conflict(
        [plan.column(k).target for k in plan.key],
        [c.target for c in plan.columns],
        plan.column(plan.version).target if plan.version else None,
    )
    return (
        f"INSERT INTO {plan.target.sql} AS t ({targets}) SELECT {values} FROM ({_dedup(plan, staging, unique)}) d{join}"
        f"{(' WHERE ' + where) if where else ''} {conflict}"
    )


def merge_statements(plan: MergePlan, staging: str, unique: bool = False) -> list[tuple[str, str]]:
    """The statements of one merge, in order, each labelled with the counter its rowcount feeds."""
    dedup = _dedup(plan, staging, unique)
    flag = f"d.{_q(DELETE_FLAG)}"
    if not plan.deletes:
        return [("upserted", _upsert(plan, staging, unique=unique))]
    if plan.version is None:
        return [
            ("deleted", f"DELETE FROM {plan.target.sql} t USING ({dedup}) d WHERE {flag} AND {_key_match(plan, 't')}"),
            ("upserted", _upsert(plan, staging, where=f"NOT {flag}", unique=unique)),
        ]
    tomb = plan.tombstones
    assert tomb is not None
    key_cols = [plan.column(k) for k in plan.key]
    vcol = plan.column(plan.version)
    tkeys = ", ".join(_q(c.target) for c in key_cols)
    tv = _q(vcol.target)
    dv = _expr(vcol)
    lock = (
        f"INSERT INTO {tomb.sql} AS tb ({tkeys}, {tv}) SELECT {', '.join(_expr(c) for c in key_cols)}, NULL "
        f"FROM ({dedup}) d ORDER BY {', '.join(_q(c.name) for c in key_cols)} "
        f"ON CONFLICT ({tkeys}) DO UPDATE SET {tv} = tb.{tv}"
    )
    tombstone = (
        f"UPDATE {tomb.sql} tb SET {tv} = {dv} FROM ({dedup}) d WHERE {flag} AND {_key_match(plan, 'tb')} "
        f"AND (tb.{tv} IS NULL OR tb.{tv} < {dv}) AND NOT EXISTS (SELECT 1 FROM {plan.target.sql} t "
        f"WHERE {_key_match(plan, 't')} AND t.{tv} >= {dv})"
    )
    delete = (
        f"DELETE FROM {plan.target.sql} t USING ({dedup}) d WHERE {flag} AND {_key_match(plan, 't')} "
        f"AND (t.{tv} IS NULL OR t.{tv} < {dv})"
    )
    upsert = _upsert(
        plan,
        staging,
        join=f" JOIN {tomb.sql} tb ON {_key_match(plan, 'tb')}",
        where=f"NOT {flag} AND (tb.{tv} IS NULL OR tb.{tv} < {dv})",
        unique=unique,
    )
    cleanup = (
        f"DELETE FROM {tomb.sql} tb USING ({dedup}) d WHERE {_key_match(plan, 'tb')} "
        f"AND (tb.{tv} IS NULL OR (NOT {flag} AND tb.{tv} < {dv}))"
    )
    return [("", lock), ("tombstoned", tombstone), ("deleted", delete), ("upserted", upsert), ("", cleanup)]


def merge_staged(
    cur: psycopg.Cursor, staging: str, plan: MergePlan, staged: int = 0, *, unique: bool = False
) -> MergeCounts:
    """Merge ``staging`` into the target inside the caller's transaction; return the counts.

    Deferred constraints are made immediate for the rest of the transaction: a violation then fails
    the statement that caused it (a refusal the caller can name or divert), not the COMMIT or PREPARE."""
    cur.execute(b"SET CONSTRAINTS ALL IMMEDIATE")
    counts = {"upserted": 0, "deleted": 0, "tombstoned": 0}
    for label, sql in merge_statements(plan, staging, unique):
        cur.execute(sql)  # built from quoted identifiers only
        if label:
            counts[label] += max(cur.rowcount, 0)
    return MergeCounts(staged=staged, **counts)


def tombstone_sql(plan: MergePlan) -> str | None:
    """CREATE TABLE IF NOT EXISTS for the tombstone table (None when the plan needs none)."""
    tomb = plan.tombstones
    if tomb is None or plan.version is None:
        return None
    key_cols = [plan.column(k) for k in plan.key]
    vcol = plan.column(plan.version)
    defs = [f"{_q(c.target)} {c.target_type or c.pg_type} NOT NULL" for c in key_cols]
    defs.append(f"{_q(vcol.target)} {vcol.target_type or vcol.pg_type}")  # NULL: a key lock placeholder
    pk = ", ".join(_q(c.target) for c in key_cols)
    return f"CREATE TABLE IF NOT EXISTS {tomb.sql} ({', '.join(defs)}, PRIMARY KEY ({pk}))"


def ensure_tombstones(conn: psycopg.Connection, plan: MergePlan) -> None:
    """Create the tombstone table when the plan needs one (driver side, before the first write)."""
    sql = tombstone_sql(plan)
    if sql is None:
        return
    tomb = plan.tombstones
    assert tomb is not None
    with ddl_lock(conn), conn.cursor() as cur:
        # only when missing: CREATE TABLE IF NOT EXISTS asks for CREATE on the schema even when it exists
        row = cur.execute("SELECT to_regclass(%s) IS NULL", (tomb.sql,)).fetchone()
        if row is not None and row[0]:
            cur.execute(sql)
    if not conn.autocommit:
        conn.commit()
