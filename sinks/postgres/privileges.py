"""What the Postgres sinks need of their role, per option set, and the check each runs at start.

- ``upsert_grants(opts)`` / ``twophase_grants(opts)``: the privileges (``eos_core.privileges.PgGrant``) of
  ``postgres-upsert`` and ``postgres-2pc`` with these options; docs/security.md is generated from them and
  ``spark-eos doctor`` checks a role against them.
- ``refuse_missing(conn, grants, context=...)``: the role's missing ones, asked of Postgres
  (``has_*_privilege``), as one ConfigError naming each with its GRANT, before the sink writes anything.

A role that is neither a superuser nor an owner works with exactly these: the sinks create nothing that
exists already (no ``CREATE ... IF NOT EXISTS`` on an existing schema or table: Postgres checks the CREATE
privilege before it looks), and what they would create (the 2PC sink's protocol schema and tables, a
tombstone or dead-letter table, the target with ``table.create=true``) an admin may create beforehand
instead: the grant to create it is needed only while it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eos_core.errors import ConfigError
from eos_core.privileges import PgGrant, describe_missing, grant_command
from sinks.postgres.options import TableName, UpsertOptions

if TYPE_CHECKING:
    import psycopg

    from sinks.postgres.twophase.options import TwoPhaseOptions

__all__ = ["missing_grants", "refuse_missing", "twophase_grants", "upsert_grants"]

PROTOCOL_TABLES = ("sink_batches", "sink_parts", "sink_owners")


def _schema(table: TableName) -> str:
    return table.schema or "public"


def _qualified(table: TableName) -> str:
    return f"{_schema(table)}.{table.name}"


def _table_needs(opts: UpsertOptions | TwoPhaseOptions, table: TableName, *, merge: bool) -> list[PgGrant]:
    """The target and what comes with it: its schema, creating it, altering it, the tombstones, dead letters."""
    name, schema = _qualified(table), _schema(table)
    grants = [
        PgGrant("database", None, "CONNECT", "log in"),
        PgGrant("schema", schema, "USAGE", f"reach table {name}"),
        PgGrant("table", name, "INSERT", "write the rows"),
    ]
    if merge:
        grants += [
            PgGrant("table", name, "SELECT", "the merge reads the key and version of the rows it replaces"),
            PgGrant("table", name, "UPDATE", "replace a key's row (ON CONFLICT DO UPDATE)"),
        ]
        deletes = bool(opts.delete_column or opts.delete_tombstones)
        if deletes:
            grants.append(PgGrant("table", name, "DELETE", "delete a key (option delete.column or a tombstone)"))
        if deletes and opts.version:
            tomb = _qualified(table.derived("__eos_tombstones"))
            grants += [
                PgGrant("table", tomb, p, "remember deleted keys' versions (deletes with a version)")
                for p in ("SELECT", "INSERT", "UPDATE", "DELETE")
            ]
            grants.append(
                PgGrant(
                    "schema",
                    schema,
                    "CREATE",
                    f"create the tombstone table {tomb} at the first start",
                    unless=("table", tomb),
                )
            )
    if opts.table_create:
        grants.append(
            PgGrant("schema", schema, "CREATE", f"create table {name} (table.create=true)", unless=("table", name))
        )
    if opts.schema_evolution == "add-columns":
        grants.append(PgGrant("table", name, "OWNER", "add the DataFrame's new columns (schema.evolution=add-columns)"))
    errors = opts.errors.table
    if errors is not None:
        letters = _qualified(errors)
        grants += [
            PgGrant("schema", _schema(errors), "USAGE", f"reach the dead-letter table {letters}"),
            PgGrant("table", letters, "INSERT", "divert refused rows (errors.tolerance=all)"),
            PgGrant("table", letters, "SELECT", "find a batch's diverted rows again on a replay"),
            PgGrant(
                "schema",
                _schema(errors),
                "CREATE",
                f"create the dead-letter table {letters} at the first start",
                unless=("table", letters),
            ),
            PgGrant("database", None, "TEMPORARY", "screen a refused row's values in a temporary table"),
        ]
    return grants


def upsert_grants(opts: UpsertOptions) -> list[PgGrant]:
    """``postgres-upsert``: the target's INSERT, SELECT and UPDATE (DELETE with deletes), TEMPORARY on the
    database (each task stages its rows in a temporary table by binary COPY before the merge)."""
    grants = _table_needs(opts, opts.table, merge=True)
    grants.insert(1, PgGrant("database", None, "TEMPORARY", "stage each task's rows in a temporary table"))
    return _unique(grants)


def twophase_grants(opts: TwoPhaseOptions, *, complete: bool = False) -> list[PgGrant]:
    """``postgres-2pc``: the target's (append: INSERT; upsert: as ``postgres-upsert``; complete output mode:
    DELETE too), the protocol tables' SELECT, INSERT, UPDATE, DELETE in ``eos.schema``, and with
    visibility=batch CREATE on that schema (each task stages in a table of its own, prepared with its rows)
    and TEMPORARY on the database (the publish reads the staged rows through a temporary view). ``complete``:
    the query's output mode is complete."""
    eos = opts.eos_schema
    grants = _table_needs(opts, opts.table, merge=opts.mode == "upsert")
    grants += [
        PgGrant("schema", eos, "USAGE", "reach the protocol tables (decisions, markers, owners)"),
        PgGrant(
            "database",
            None,
            "CREATE",
            f"create the protocol schema {eos} at the first start",
            unless=("schema", eos),
            create=f"CREATE SCHEMA {eos};",
        ),
    ]
    for table in PROTOCOL_TABLES:
        qualified = f"{eos}.{table}"
        grants += [PgGrant("table", qualified, p, "the protocol's decisions, markers and owners") for p in _RW]
        grants.append(
            PgGrant(
                "schema",
                eos,
                "CREATE",
                f"create the protocol table {qualified} at the first start",
                unless=("table", qualified),
            )
        )
    if opts.staged:
        grants += [
            PgGrant("schema", eos, "CREATE", "each task stages its rows in a table of its own (visibility=batch)"),
            PgGrant("database", None, "TEMPORARY", "the publish reads the staged rows through a temporary view"),
        ]
    if complete:
        grants.append(
            PgGrant("table", _qualified(opts.table), "DELETE", "complete output mode replaces the table's rows")
        )
    return _unique(grants)


_RW = ("SELECT", "INSERT", "UPDATE", "DELETE")


def _unique(grants: Sequence[PgGrant]) -> list[PgGrant]:
    """Each (object, name, privilege) once: the first reason, an unconditional need over a conditional one."""
    out: dict[tuple[str, str | None, str], PgGrant] = {}
    for g in grants:
        key = (g.object, g.name, g.privilege)
        if key not in out or (out[key].unless is not None and g.unless is None):
            out[key] = g
    return list(out.values())


def _regclass(name: str) -> str:
    from psycopg import sql

    return sql.Identifier(*name.split(".", 1)).as_string(None)


def _held(grant: PgGrant) -> tuple[str, list[str]]:
    """A boolean SQL expression (and its parameters): the session's role holds ``grant``, or needs not ask for
    it (its object does not exist yet, or its ``unless`` object does). One round trip asks them all."""
    name, priv = grant.name or "", grant.privilege
    if grant.object == "database":
        expr, args = "has_database_privilege(current_database(), %s)", [priv]
    elif grant.object == "schema":
        expr, args = (
            "coalesce(has_schema_privilege((SELECT oid FROM pg_namespace WHERE nspname = %s), %s), true)",
            [
                name,
                priv,
            ],
        )
    elif priv == "OWNER":
        expr = "coalesce((SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass(%s)), true)"
        args = [_regclass(name)]
    else:
        kind = "sequence" if grant.object == "sequence" else "table"
        expr, args = f"coalesce(has_{kind}_privilege(to_regclass(%s), %s), true)", [_regclass(name), priv]
    if grant.unless is not None:
        kind, other = grant.unless
        if kind == "schema":
            expr, args = f"(EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s) OR {expr})", [other, *args]
        else:
            expr, args = f"(to_regclass(%s) IS NOT NULL OR {expr})", [_regclass(other), *args]
    return expr, args


def missing_grants(conn: psycopg.Connection, grants: Sequence[PgGrant]) -> list[PgGrant]:
    """The grants the session's role lacks: one on an object that does not exist yet is not asked (the sink
    creates it, and owns it, with a CREATE it is asked for; or a check of its own refuses the missing object),
    nor one whose ``unless`` object exists."""
    # first the database and the schemas: a table's name is not even looked up in a schema without USAGE
    first = [g for g in grants if g.object in ("database", "schema")]
    missing = _ask(conn, first)
    unusable = {g.name for g in missing if g.object == "schema" and g.privilege == "USAGE"}
    rest = [g for g in grants if g not in first and _schema_of(g.name or "") not in unusable]
    missing += _ask(conn, [g for g in rest if g.unless is None or _schema_of(g.unless[1]) not in unusable])
    return [g for g in grants if g in missing]


def _schema_of(name: str) -> str:
    return name.split(".", 1)[0] if "." in name else "public"


def _ask(conn: psycopg.Connection, grants: Sequence[PgGrant]) -> list[PgGrant]:
    if not grants:
        return []
    parts = [_held(g) for g in grants]
    row = conn.execute(
        "SELECT ARRAY[" + ", ".join(e for e, _ in parts) + "]", [a for _, args in parts for a in args]
    ).fetchone()
    if not conn.autocommit:
        conn.commit()
    assert row is not None
    return [g for g, held in zip(grants, row[0], strict=True) if not held]


def refuse_missing(conn: psycopg.Connection, grants: Sequence[PgGrant], *, context: str) -> None:
    """A ConfigError naming every grant the session's role lacks, why, and the GRANT (or the statement that
    creates what it would create); nothing when it holds them all."""
    missing = missing_grants(conn, grants)
    if not missing:
        return
    role, database = conn.execute("SELECT current_user, current_database()").fetchone()  # type: ignore[misc]
    if not conn.autocommit:
        conn.commit()
    commands = [grant_command(g, role, database) for g in missing]
    commands += [f"(or, as an admin: {g.create})" for g in missing if g.create]
    raise ConfigError(
        describe_missing(f"role {role!r}", grants=missing, context=context, fix=commands),
        option="dsn",
        role=role,
    )
