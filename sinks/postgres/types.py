"""Spark -> Postgres type mapping, CREATE TABLE generation and the driver-side table check.

Public API:

- ``pg_type(spark_type) -> str``: the Postgres type a Spark type is staged (and created) as:
  boolean, smallint (byte, short), integer, bigint, real, double precision, numeric(p,s), text,
  bytea, date, timestamp with time zone (TimestampType), timestamp without time zone
  (TimestampNTZType), T[] for arrays of those, jsonb for structs, maps, variants and arrays of them.
- ``Column``: one DataFrame column and where it goes (``name``, ``target``, ``pg_type`` staged,
  ``target_type`` in the table, ``nullable``).
- ``plan_columns(schema, rename) -> list[Column]``.
- ``create_table_sql(table, columns, key) -> str``.
- ``check_table(conn, table, df_schema, key, columns_map, *, create=False, require_unique_key=True,
  version=None, extra=()) -> list[Column]``: the table exists (or is created), the key columns have a
  unique/primary-key constraint usable by ON CONFLICT, every DataFrame column maps to a table column
  of a compatible type; returns the columns with their table types filled in. Failures are
  ConfigErrors naming the table, the column and the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg
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
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_core.errors import ConfigError, RetriableError
from sinks.postgres.connection import ddl_lock
from sinks.postgres.options import TableName, quote_ident

log = logging.getLogger(__name__)

ALTER_LOCK_TIMEOUT = 60.0  # seconds schema.evolution=add-columns waits for the table's lock

__all__ = [
    "Column",
    "TableInfo",
    "base_type",
    "check_table",
    "compatible",
    "create_table_sql",
    "describe_table",
    "missing_columns",
    "pg_type",
    "plan_columns",
]

_SCALARS: dict[type, str] = {
    BooleanType: "boolean",
    ByteType: "smallint",
    ShortType: "smallint",
    IntegerType: "integer",
    LongType: "bigint",
    FloatType: "real",
    DoubleType: "double precision",
    StringType: "text",
    BinaryType: "bytea",
    DateType: "date",
    TimestampType: "timestamp with time zone",
    TimestampNTZType: "timestamp without time zone",
}
_JSON_TYPES = (StructType, MapType)

# The Postgres types (format_type spelling, without modifiers) a staged type may be written to:
# only widening or lossless conversions, so a mismatch is caught on the driver, not mid-batch.
_TEXTUAL = {
    "text",
    "character varying",
    "character",
    "name",
    "citext",
    "uuid",
    "json",
    "jsonb",
    "xml",
    "inet",
    "cidr",
    "macaddr",
}
_COMPATIBLE: dict[str, set[str]] = {
    "boolean": {"boolean"},
    "smallint": {"smallint", "integer", "bigint", "numeric", "real", "double precision"},
    "integer": {"integer", "bigint", "numeric", "double precision"},
    "bigint": {"bigint", "numeric"},
    "real": {"real", "double precision", "numeric"},
    "double precision": {"double precision", "numeric"},
    "numeric": {"numeric"},
    "text": _TEXTUAL,
    "bytea": {"bytea"},
    "date": {"date", "timestamp without time zone", "timestamp with time zone"},
    "timestamp with time zone": {"timestamp with time zone"},
    "timestamp without time zone": {"timestamp without time zone"},
    "jsonb": {"jsonb", "json"},
}


def pg_type(dt: DataType) -> str:
    """The Postgres type for a Spark type (see the module docstring)."""
    for cls, name in _SCALARS.items():
        if type(dt) is cls:
            return name
    if isinstance(dt, DecimalType):
        return f"numeric({dt.precision},{dt.scale})"
    if isinstance(dt, _JSON_TYPES):
        return "jsonb"
    if isinstance(dt, ArrayType):
        inner = pg_type(dt.elementType)
        if inner == "jsonb" or inner.endswith("[]"):
            return "jsonb"  # Postgres arrays are rectangular and untyped per dimension: nest as JSON
        return inner + "[]"
    if type(dt).__name__ == "VariantType":
        return "jsonb"
    raise ConfigError(
        f"postgres: Spark type {dt.simpleString()} has no Postgres mapping; cast the column in Spark "
        "(e.g. to string) before writing"
    )


def base_type(type_name: str) -> str:
    """format_type output without modifiers: 'numeric(10,2)' -> 'numeric', 'character varying(5)[]' kept as array."""
    is_array = type_name.endswith("[]")
    core = type_name[:-2] if is_array else type_name
    if "(" in core:
        head, _, rest = core.partition("(")
        tail = rest.partition(")")[2]
        core = (head + tail).strip()
    return core + ("[]" if is_array else "")


def _numeric_fits(staged: str, target: str) -> bool:
    """numeric(p,s) into numeric(P,S): no rounding (S >= s) and no overflow (P - S >= p - s)."""
    import re

    def typmod(text: str) -> tuple[int, int] | None:
        m = re.search(r"numeric\((\d+)(?:,(\d+))?\)", text.replace(" ", ""))
        return (int(m.group(1)), int(m.group(2) or 0)) if m else None

    src, dst = typmod(staged), typmod(target)
    if dst is None or src is None:
        return dst is None  # unconstrained numeric takes anything
    return dst[1] >= src[1] and dst[0] - dst[1] >= src[0] - src[1]


def compatible(staged: str, target: str, target_kind: str = "b") -> bool:
    """Whether a value staged as ``staged`` may be written to a column of type ``target``.

    ``target_kind`` is pg_type.typtype of the target: 'e' (enum) accepts text.
    """
    s, t = base_type(staged), base_type(target)
    if s == "numeric" and t == "numeric" and not _numeric_fits(staged, target):
        return False
    if s.endswith("[]"):
        if t in ("json", "jsonb"):
            return True
        return t.endswith("[]") and compatible(s[:-2], t[:-2])
    if s == "text" and target_kind == "e":
        return True
    return t in _COMPATIBLE.get(s, {s})


@dataclass(frozen=True)
class Column:
    """A DataFrame column staged as ``pg_type`` and written to table column ``target``."""

    name: str
    target: str
    pg_type: str
    spark_type: str  # simpleString, for messages
    nullable: bool = True
    target_type: str | None = None  # the table's type, filled by check_table

    @property
    def cast(self) -> str | None:
        """The explicit cast a staged value needs, or None when assignment conversion does it.

        Only text into types without an assignment cast from text (uuid, json, inet, enums, ...)
        is cast explicitly. Everything else (int into bigint, text into varchar(3), numeric into
        numeric(12,4)) is left to INSERT's assignment conversion, which raises on overflow
        instead of truncating as an explicit CAST to varchar(n) would.
        """
        if self.target_type is None:
            return None
        staged, target = base_type(self.pg_type), base_type(self.target_type)
        if staged == target or staged.endswith("[]"):
            return None
        if staged == "text" and target not in ("text", "character varying", "character", "name"):
            return self.target_type.split("(", 1)[0].strip() if "(" in self.target_type else self.target_type
        return None

    def sql_value(self, ref: str) -> str:
        """SQL for the staged value ``ref`` as it goes into the table column."""
        if self.target_type is not None and self.pg_type.endswith("[]"):
            target = base_type(self.target_type)
            if target in ("json", "jsonb"):
                return f"to_jsonb({ref})" + ("::json" if target == "json" else "")
        return f"CAST({ref} AS {self.cast})" if self.cast else ref


def plan_columns(schema: StructType, rename: Mapping[str, str] | None = None) -> list[Column]:
    """One Column per DataFrame field, renamed by ``rename`` (DataFrame name -> table name)."""
    rename = dict(rename or {})
    names = [f.name for f in schema.fields]
    unknown = sorted(set(rename) - set(names))
    if unknown:
        raise ConfigError(
            f"postgres: option 'columns' renames {', '.join(map(repr, unknown))}, not a DataFrame column; "
            f"DataFrame columns: {', '.join(names)}",
            option="columns",
        )
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"postgres: the DataFrame has duplicate column names {dup}; alias them before writing")
    cols = [
        Column(f.name, rename.get(f.name, f.name), pg_type(f.dataType), f.dataType.simpleString(), f.nullable)
        for f in schema.fields
    ]
    targets = [c.target for c in cols]
    if len(set(targets)) != len(targets):
        dup = sorted({t for t in targets if targets.count(t) > 1})
        raise ConfigError(
            f"postgres: option 'columns' maps two DataFrame columns to {dup}; map each to its own table column",
            option="columns",
        )
    return cols


def create_table_sql(table: TableName, columns: Sequence[Column], key: Sequence[str]) -> str:
    """CREATE TABLE IF NOT EXISTS with the columns' staged types and the key (if any) as primary key."""
    by_name = {c.name: c for c in columns}
    defs = [f"{quote_ident(c.target)} {c.pg_type}" + (" NOT NULL" if c.name in key else "") for c in columns]
    if key:
        defs.append(f"PRIMARY KEY ({', '.join(quote_ident(by_name[k].target) for k in key)})")
    return f"CREATE TABLE IF NOT EXISTS {table.sql} ({', '.join(defs)})"


@dataclass(frozen=True)
class TableInfo:
    """What the catalog says about a table."""

    schema: str
    name: str
    columns: dict[str, tuple[str, str, bool]]  # name -> (format_type, typtype, not null)
    unique_keys: list[tuple[str, ...]]  # column sets of unique indexes usable by ON CONFLICT
    persistence: str = "p"

    @property
    def table(self) -> TableName:
        return TableName(self.schema, self.name)


def describe_table(conn: psycopg.Connection, table: TableName) -> TableInfo | None:
    """The table's columns and unique keys, or None when it does not exist (search_path honoured)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)::oid", (table.sql,))
        row = cur.fetchone()
        oid = row[0] if row else None
        if oid is None:
            return None
        cur.execute(
            "SELECT n.nspname, c.relname, c.relpersistence FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = %s",
            (oid,),
        )
        schema, name, persistence = cur.fetchone()  # type: ignore[misc]
        cur.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typtype, a.attnotnull "
            "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (oid,),
        )
        columns = {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}
        # ON CONFLICT (cols) can use a unique index that is valid, not partial and on plain columns.
        cur.execute(
            "SELECT array(SELECT a.attname FROM unnest(i.indkey) k JOIN pg_attribute a "
            "ON a.attrelid = i.indrelid AND a.attnum = k) "
            "FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL "
            "AND i.indexprs IS NULL",
            (oid,),
        )
        keys = [tuple(r[0]) for r in cur.fetchall()]
    return TableInfo(schema, name, columns, keys, persistence)


def missing_columns(
    conn: psycopg.Connection,
    table: TableName,
    df_schema: StructType,
    columns_map: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
) -> list[str]:
    """The table columns ``check_table`` would add (schema.evolution=add-columns) for ``df_schema``:
    [] when the table has them all or does not exist yet. Read-only: it takes no lock."""
    info = describe_table(conn, table)
    if info is None:
        return []
    skip = set(skip)
    rename = {k: v for k, v in (columns_map or {}).items() if k not in skip}
    wanted = [rename.get(f.name, f.name) for f in df_schema.fields if f.name not in skip]
    return [t for t in wanted if _match_column(info, t) is None]


def _match_column(info: TableInfo, wanted: str) -> str | None:
    if wanted in info.columns:
        return wanted
    folded = [c for c in info.columns if c.lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


def _planned_columns(
    df_schema: StructType,
    key: Sequence[str],
    columns_map: Mapping[str, str] | None,
    skip: set[str],
    version: str | None,
) -> list[Column]:
    """The DataFrame's columns as they will be staged and written; the key and version must be among them."""
    df_names = [f.name for f in df_schema.fields]
    for role, col in [("key", k) for k in key] + ([("version", version)] if version else []):
        if col not in df_names:
            raise ConfigError(
                f"postgres: {role} column {col!r} (option '{role}') is not in the DataFrame; "
                f"DataFrame columns: {', '.join(df_names)}; fix the option or select the column",
                option=role,
                column=col,
            )
    fields = StructType([f for f in df_schema.fields if f.name not in skip])
    columns = plan_columns(fields, {k: v for k, v in (columns_map or {}).items() if k not in skip})
    for c in columns:
        if c.name in key and (c.pg_type == "jsonb" or c.pg_type.endswith("[]")):
            raise ConfigError(
                f"postgres: key column {c.name!r} has Spark type {c.spark_type}, which cannot be a key; "
                "use scalar key columns",
                option="key",
                column=c.name,
            )
    return columns


def _table_or_created(
    conn: psycopg.Connection, table: TableName, columns: list[Column], key: Sequence[str], create: bool
) -> TableInfo:
    """The table's description; with ``create``, the table is created from ``columns`` when missing."""
    info = describe_table(conn, table)
    if info is None:
        if not create:
            raise ConfigError(
                f"postgres: table {table} does not exist; create it"
                + (f" (with a primary key on {', '.join(key)})" if key else "")
                + " or set option table.create=true",
                option="table",
                table=str(table),
            )
        with ddl_lock(conn), conn.cursor() as cur:
            # only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when it exists
            if (
                table.schema
                and not cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (table.schema,)).fetchone()
            ):
                cur.execute(f"CREATE SCHEMA {quote_ident(table.schema)}")
            cur.execute(create_table_sql(table, columns, key))
        if not conn.autocommit:
            conn.commit()
        info = describe_table(conn, table)
        assert info is not None
    return info


def _resolved_columns(
    conn: psycopg.Connection, info: TableInfo, columns: list[Column], evolution: str
) -> tuple[TableInfo, list[Column]]:
    """Each planned column matched to the table's (added first under schema.evolution=add-columns),
    its type checked: (the table as it is now, the columns with their targets)."""
    name = f"{info.schema}.{info.name}"
    new_columns = [c for c in columns if _match_column(info, c.target) is None]
    if new_columns:
        info = _add_columns(conn, info, new_columns, columns, evolution)
    resolved: list[Column] = []
    for c in columns:
        found = _match_column(info, c.target)
        assert found is not None  # added above, or refused
        type_name, kind, _notnull = info.columns[found]
        if not compatible(c.pg_type, type_name, kind):
            raise ConfigError(
                f"postgres: table {name} column {found!r} has type {type_name}, but DataFrame column {c.name!r} is "
                f"{c.spark_type} (staged as {c.pg_type}); alter the column (ALTER TABLE {info.table.sql} ALTER COLUMN "
                f"{quote_ident(found)} TYPE {c.pg_type}) or cast the DataFrame column to a type that fits "
                "(option schema.evolution never changes a type)",
                table=name,
                column=found,
            )
        resolved.append(replace(c, target=found, target_type=type_name))
    return info, resolved


def _check_writes_required_and_key(
    conn: psycopg.Connection, info: TableInfo, resolved: list[Column], key: Sequence[str], require_unique_key: bool
) -> None:
    """Every NOT NULL column without a default is written, and (upserts) a unique key matches ``key``."""
    name = f"{info.schema}.{info.name}"
    written = {c.target for c in resolved}
    missing_required = [
        col
        for col, (_t, _k, notnull) in info.columns.items()
        if notnull and col not in written and not _has_default(conn, info, col)
    ]
    if missing_required:
        raise ConfigError(
            f"postgres: table {name} has NOT NULL column(s) {', '.join(missing_required)} without default that the "
            "DataFrame does not write; add them to the DataFrame or give them a default",
            table=name,
            column=missing_required[0],
        )
    if require_unique_key:
        key_targets = tuple(next(c.target for c in resolved if c.name == k) for k in key)
        if not any(set(uk) == set(key_targets) for uk in info.unique_keys):
            have = "; ".join("(" + ", ".join(k) + ")" for k in info.unique_keys) or "none"
            raise ConfigError(
                f"postgres: table {name} has no primary key or unique constraint on exactly ({', '.join(key_targets)}), "
                f"which INSERT ... ON CONFLICT needs (unique keys found: {have}); fix: ALTER TABLE {info.table.sql} "
                f"ADD PRIMARY KEY ({', '.join(quote_ident(k) for k in key_targets)}) (or a UNIQUE constraint), or "
                "change option 'key'",
                option="key",
                table=name,
                column=",".join(key_targets),
            )


def check_table(
    conn: psycopg.Connection,
    table: TableName,
    df_schema: StructType,
    key: Sequence[str],
    columns_map: Mapping[str, str] | None = None,
    *,
    create: bool = False,
    require_unique_key: bool = True,
    version: str | None = None,
    skip: Iterable[str] = (),
    evolution: str = "none",
) -> list[Column]:
    """Check (or create) ``table`` for writing ``df_schema``; return the planned columns.

    ``skip`` names DataFrame columns that are not written to the table (e.g. a delete flag).
    ``evolution`` (option ``schema.evolution``): ``none`` refuses DataFrame columns the table lacks,
    listing them all with the ``ALTER TABLE`` that would add them; ``add-columns`` adds them as
    nullable columns under the DDL lock (``IF NOT EXISTS``: writers starting at once agree). A type
    change is refused either way, with the statement to run; nothing is ever dropped or renamed.
    Runs on the driver before the first write; every failure is a ConfigError with the fix.
    """
    columns = _planned_columns(df_schema, key, columns_map, set(skip), version)
    info = _table_or_created(conn, table, columns, key, create)
    info, resolved = _resolved_columns(conn, info, columns, evolution)
    _check_writes_required_and_key(conn, info, resolved, key, require_unique_key)
    return resolved


def _add_columns(
    conn: psycopg.Connection, info: TableInfo, new: Sequence[Column], planned: Sequence[Column], evolution: str
) -> TableInfo:
    """Add the DataFrame's columns the table lacks (schema.evolution=add-columns) or refuse them all."""
    name = f"{info.schema}.{info.name}"
    statements = [f"ALTER TABLE {info.table.sql} ADD COLUMN {quote_ident(c.target)} {c.pg_type}" for c in new]
    listed = ", ".join(f"{c.target!r} ({c.spark_type})" for c in new)
    if evolution != "add-columns":
        written = {c.target.lower() for c in planned}
        unwritten = sorted(c for c in info.columns if c.lower() not in written)
        raise ConfigError(
            f"postgres: table {name} has no column for DataFrame column(s) {listed}"
            + (f" (table columns the DataFrame does not write: {', '.join(unwritten)})" if unwritten else "")
            + f"; add them ({'; '.join(statements)}), set option schema.evolution=add-columns to have the sink add "
            "them, drop them from the DataFrame, or rename them with option 'columns'",
            option="schema.evolution",
            table=name,
            column=new[0].target,
        )
    try:
        with ddl_lock(conn), conn.cursor() as cur:  # IF NOT EXISTS: a writer starting at once may add it first
            # ALTER TABLE waits for every transaction using the table; never forever
            cur.execute(f"SET LOCAL lock_timeout = '{int(ALTER_LOCK_TIMEOUT * 1000)}ms'")
            for c in new:
                cur.execute(
                    f"ALTER TABLE {info.table.sql} ADD COLUMN IF NOT EXISTS {quote_ident(c.target)} {c.pg_type}"
                )
    except psycopg.errors.LockNotAvailable:
        raise RetriableError(
            f"postgres: schema.evolution=add-columns could not add {listed} to {name}: another transaction has "
            f"held the table for {ALTER_LOCK_TIMEOUT:g}s (pg_locks shows it; prepared transactions of a "
            "postgres-2pc sink with visibility=partition hold it until their batch commits: `spark-eos sinks "
            "recover --sink-id ...` resolves them); nothing was written or altered, retry once it is released"
        ) from None
    if not conn.autocommit:
        conn.commit()
    log.info("postgres: schema.evolution=add-columns added %s to %s", listed, name)
    added = describe_table(conn, info.table)
    assert added is not None
    return added


def _has_default(conn: psycopg.Connection, info: TableInfo, column: str) -> bool:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attname = %s",
            (info.table.sql, column),
        )
        row = cur.fetchone()
    return bool(row and row[0])
