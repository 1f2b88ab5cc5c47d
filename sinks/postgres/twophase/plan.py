"""The plan of a ``postgres-2pc`` write, built once on the driver and pickled to every task: target
columns, merge plan, staging names, and the commit message a task returns (``TwoPhaseMessage``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import (
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from eos_core.checkpoint import Lineage, batch_lineage
from eos_core.checkpoint import planned_lineage as checkpoint_lineage
from eos_core.errors import ConfigError, FatalError
from sinks.postgres import deadletter
from sinks.postgres.connection import close_quietly, setup_connect
from sinks.postgres.merge import ORDINAL, MergePlan, ensure_tombstones
from sinks.postgres.options import (
    TableName,
)
from sinks.postgres.privileges import refuse_missing, twophase_grants
from sinks.postgres.refusal import WHY
from sinks.postgres.staging import UpsertPlanner
from sinks.postgres.twophase.decisions import (
    ProtocolTables,
    check_max_prepared,
)
from sinks.postgres.twophase.gid import parse_gid
from sinks.postgres.twophase.options import FORMAT, TwoPhaseOptions
from sinks.postgres.twophase.recovery import resolve
from sinks.postgres.types import Column, base_type, check_table, missing_columns


@dataclass(frozen=True)
class TwoPhasePlan:
    """What the tasks and the committer need, built once on the driver (picklable)."""

    sink_id: str
    target: TableName
    columns: tuple[Column, ...]  # written columns (name = DataFrame/staging, target = table column)
    stage: TableName  # the sink's staging table in the eos schema
    stage_columns: tuple[tuple[str, str], ...]  # what tasks COPY (without the gid/partition tags)
    merge: MergePlan | None  # upsert mode
    replace: bool  # complete mode: each batch replaces the table's contents
    direct: bool = False  # visibility=partition: tasks write into the table, no staging, no publish
    copy_direct: bool = False  # direct append whose staged types are the table's: COPY into the table
    divert: MergePlan | None = None  # errors.tolerance=all: the merge that diverts refused rows (append: no key)

    @property
    def stage_token(self) -> str:
        """What a decision records as the place of its rows (I3)."""
        return DIRECT if self.direct else TASKS + self.stage.sql


STAGE_SQL = re.compile(r'^"((?:[^"]|"")+)"\."(stage_[0-9a-f]{20})"$')
DIRECT = "direct"  # a decision whose rows went straight into the table (visibility=partition)
TASKS = "tasks:"  # + the column set's table prefix: each gid staged its rows in a table of its own


def task_table(prefix: TableName, gid: str) -> TableName:
    """The staging table of one task attempt: created, filled and prepared in the task's transaction,
    so a rolled-back gid takes its table with it; dropped by the publish that moves its rows."""
    return TableName(prefix.schema, f"{prefix.name}_{hashlib.sha1(gid.encode()).hexdigest()[:12]}")


def _prefix(token: str) -> TableName:
    """The table prefix of a (checked) ``tasks:"schema"."stage_<hash>"`` token."""
    m = STAGE_SQL.match(token.removeprefix(TASKS))
    assert m is not None, token
    return TableName(m.group(1).replace('""', '"'), m.group(2))


def staged_relation(token: str, gids: Sequence[str]) -> str | None:
    """SQL for the batch's staged rows with their partition (``eos_part``), or None without rows."""
    if not gids:
        return None
    if token.startswith(TASKS):
        prefix = _prefix(token)
        parts = []
        for g in gids:
            parsed = parse_gid(g)
            if parsed is None:
                raise FatalError(
                    f"{FORMAT}: {g!r} in a decision is not a gid of this sink; the decision log was changed by hand"
                )
            parts.append(f"SELECT *, {parsed.partition}::int AS {TAG_PART} FROM {task_table(prefix, g).sql}")
        return "(" + " UNION ALL ".join(parts) + ")"
    literal = ", ".join("'" + g.replace("'", "''") + "'" for g in gids)
    return f"(SELECT * FROM {token} WHERE {TAG_GID} = ANY(ARRAY[{literal}]))"  # a shared table of spark-eos 0.1


def staged_present(conn: psycopg.Connection, token: str, gids: Sequence[str]) -> dict[str, bool]:
    """For each gid of a decision staged under ``token``: do its staged rows exist (its own table, or
    its rows in a shared table of spark-eos 0.1)? Read-only. A gid still prepared holds its table
    inside its transaction, where no other session sees it: ask only about committed gids."""
    if token.startswith(TASKS):
        prefix = _prefix(token)
        found = {}
        for g in gids:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (task_table(prefix, g).sql,)).fetchone()
            found[g] = bool(row and row[0])
        return found
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (token,)).fetchone()
    if not (row and row[0]):
        return dict.fromkeys(gids, False)
    rows = conn.execute(
        sql.SQL(f"SELECT DISTINCT {TAG_GID} FROM {token} WHERE {TAG_GID} = ANY(%s)"),
        (list(gids),),
    ).fetchall()
    there = {str(r[0]) for r in rows}
    return {g: g in there for g in gids}


def discard_staged(conn: psycopg.Connection, token: str, gids: Sequence[str]) -> None:
    """Remove the batch's staged rows (inside the caller's transaction): drop its tables, or delete
    its rows from a shared table of spark-eos 0.1."""
    if not gids:
        return
    if token.startswith(TASKS):
        names = ", ".join(task_table(_prefix(token), g).sql for g in gids)
        conn.execute(f"DROP TABLE IF EXISTS {names}".encode())
    else:
        conn.execute(sql.SQL(f"DELETE FROM {token} WHERE {TAG_GID} = ANY(%s)"), (list(gids),))


@dataclass(frozen=True)
class TwoPhaseMessage(WriterCommitMessage):
    """One task's outcome: its prepared gid (None when it had no rows or the batch was decided)."""

    sink_id: str
    batch_id: int
    partition: int
    attempt: int
    gid: str | None
    rows: int
    skipped: bool
    identity: str
    run_id: str | None
    nonce: str = ""  # the batch attempt (shared by the tasks of one writer)
    lineage: str | None = None  # digest of offsets/<batch> as the task saw it


# ---------------------------------------------------------------------------------------------
# driver-side setup (runs in the planning worker AND in the commit process: never destructive)


_SETUP_CACHE: dict[tuple[Any, ...], TwoPhasePlan] = {}
TAG_GID = "eos_gid"
TAG_PART = "eos_part"


def _stage_name(schema: str, sink_id: str, columns: tuple[tuple[str, str], ...]) -> TableName:
    digest = hashlib.sha1(repr((sink_id, columns)).encode()).hexdigest()[:20]
    return TableName(schema, f"stage_{digest}")


def build_plan(opts: TwoPhaseOptions, schema: StructType, *, replace: bool) -> TwoPhasePlan:
    """Check the server and the table, create the protocol and staging tables; cached per process."""
    assert opts.sink_id is not None
    key = (opts, schema.json(), replace)
    cached = _SETUP_CACHE.get(key)
    if cached is not None:
        return cached
    tables = ProtocolTables(opts.eos_schema)
    conn = setup_connect(opts.connection, f"spark-eos {FORMAT} setup")
    try:
        refuse_missing(conn, twophase_grants(opts, complete=replace), context=f"{FORMAT} {opts.sink_id}")
        check_max_prepared(conn, where=f" (sink {opts.sink_id!r})")
        tables.ensure(conn)
        _check_protocol_schema_off_path(conn, opts)
        if opts.direct and opts.schema_evolution == "add-columns":
            # a decided batch's prepared transactions hold the table (their rows are in it) until they
            # commit, and ALTER TABLE waits for them: roll decided batches forward first (a decision is
            # final, so this is always right); undecided ones are left to the batch that owns them
            resolve(conn, tables, opts.sink_id, keep_undecided=True)
            if _alters(conn, opts, schema):
                # ... unless the query's columns changed: the ALTER TABLE would wait on them until it gives
                # up, on every restart. No task of the attempt this writer starts has prepared yet (its
                # nonce is made below), so an undecided gid is a dead attempt's (a crash between PREPARE
                # and the decision): rolled back under the sink lock, which the protocol allows (I4). A
                # commit process builds this plan too, but its columns exist by then: it alters nothing.
                streaming = opts.batch_id is None
                resolve(
                    conn,
                    tables,
                    opts.sink_id,
                    only_batch=None if streaming else opts.batch_id,
                    stale_after=None if streaming else opts.prepared_timeout,
                )
        merge: MergePlan | None = None
        if opts.upsert is not None:
            merge = UpsertPlanner(opts.upsert, schema, temporary_staging=False).plan()
            columns = tuple(merge.columns)
            stage_columns = tuple(merge.staging_columns())
        else:
            columns = tuple(_check_append_table(conn, opts, schema))
            stage_columns = tuple((c.name, c.pg_type) for c in columns)
            if opts.errors.divert:  # each row's place: what the dead-letter search ranges over
                stage_columns += ((ORDINAL, "bigint"),)
        if opts.errors.divert:  # a value Postgres cannot take as sent is staged with its refusal (refusal.Screen)
            stage_columns += ((WHY, "text"),)
        stage = _stage_name(opts.eos_schema, opts.sink_id, stage_columns)
        direct = opts.direct  # tasks create their own staging tables
        if merge is not None:
            ensure_tombstones(conn, merge)
        divert = None
        if opts.errors.table is not None:
            deadletter.ensure_table(conn, opts.errors.table)
            divert = merge if merge is not None else MergePlan(opts.table, columns, ())
    finally:
        close_quietly(conn)
    if direct and replace:
        raise ConfigError(
            f"{FORMAT} {opts.sink_id}: complete output mode replaces the whole table with each batch, which needs "
            "one publish per batch: use visibility=batch (the default) with complete mode",
            option="visibility",
        )
    copy_direct = direct and merge is None and all(_same_binary(c) for c in columns)
    plan = TwoPhasePlan(
        opts.sink_id,
        opts.table,
        columns,
        stage,
        stage_columns,
        merge,
        replace,
        direct=direct,
        copy_direct=copy_direct,
        divert=divert,
    )
    _SETUP_CACHE[key] = plan
    return plan


_TEXT_TARGETS = ("text", "character varying", "character")


def _same_binary(c: Column) -> bool:
    """Binary COPY of the staged type is valid input for the table's column (text into varchar(n) is:
    its receive function checks the length); widening (int into bigint) and casts are not."""
    if c.target_type is None or c.cast is not None:
        return False
    staged, target = base_type(c.pg_type), base_type(c.target_type)
    return staged == target or (staged == "text" and target in _TEXT_TARGETS)


def _check_protocol_schema_off_path(conn: psycopg.Connection, opts: TwoPhaseOptions) -> None:
    """Refuse an unqualified table when the protocol schema is on the session's search path.

    Postgres' default search path is ``"$user", public``: for a role named like ``eos.schema`` the
    protocol schema comes first once the sink has created it, so an unqualified ``CREATE TABLE t``
    of the user's own DDL lands in it, and the sink then resolves ``t`` there instead of the table
    it wrote before: earlier rows would seem to vanish (found 2026-11-23 with the role ``eos``)."""
    if opts.table.schema is not None:
        return
    row = conn.execute(
        "SELECT %s = ANY(current_schemas(false)), current_user, current_setting('search_path')", (opts.eos_schema,)
    ).fetchone()
    if row and row[0]:
        raise ConfigError(
            f"{FORMAT} {opts.sink_id}: the protocol schema {opts.eos_schema!r} (option 'eos.schema') is on the "
            f"search path of role {row[1]!r} (search_path = {row[2]}), so the unqualified table {opts.table.name!r} "
            "could resolve into it. Qualify the table (option 'table', e.g. public."
            f"{opts.table.name}), or set 'eos.schema' to a schema that is not on the search path "
            "(e.g. spark_eos), or change the role's search_path (ALTER ROLE ... SET search_path = public)",
            option="eos.schema",
        )


def _alters(conn: psycopg.Connection, opts: TwoPhaseOptions, schema: StructType) -> bool:
    """Whether checking the table will add columns to it (schema.evolution=add-columns)."""
    skip = [opts.upsert.delete_column] if opts.upsert is not None and opts.upsert.delete_column else []
    rename = dict(opts.upsert.rename if opts.upsert is not None else opts.rename)
    return bool(missing_columns(conn, opts.table, schema, rename, skip))


def _check_append_table(conn: psycopg.Connection, opts: TwoPhaseOptions, schema: StructType) -> list[Column]:
    """Append mode: no key, so the table needs no unique constraint (created without one)."""
    return check_table(
        conn,
        opts.table,
        schema,
        (),
        dict(opts.rename),
        create=opts.table_create,
        require_unique_key=False,
        evolution=opts.schema_evolution,
    )


# ---------------------------------------------------------------------------------------------
# the task side


STAGE_COMMENT = "spark-eos staging of sink "


def stage_comment(sink_id: str) -> str:
    """The comment on the sink's staging tables; a task's own table adds ``": <gid>"``."""
    return f"{STAGE_COMMENT}{sink_id}"


def stage_owner(description: str) -> tuple[str, str | None] | None:
    """Whose staging table a comment names, exactly: (sink id, gid) for a task's own table, (sink id,
    None) for a shared table of spark-eos 0.1, None for a comment of something else.

    Sink ids may contain ``": "``, so the sink is never found by a prefix of the comment (the staging
    tables of sink ``orders: eu`` would pass for ``orders``'s): a gid holds no space (its sink id is
    escaped), so the comment's last ``": "`` ends the sink id, and the gid after it must name that sink."""
    if not description.startswith(STAGE_COMMENT):
        return None
    rest = description[len(STAGE_COMMENT) :]
    head, sep, tail = rest.rpartition(": ")
    gid = parse_gid(tail) if sep else None
    if gid is not None and gid.sink_id == head:
        return head, tail
    return rest, None


def planned_lineage(opts: TwoPhaseOptions) -> Lineage | None:
    """What Spark planned for the batch the driver is building a writer for (``offsets/<n>``, the
    query): the batch's identity a decision binds to (I1). None without a checkpoint (foreachBatch
    without one); a ConfigError when the location has no ``offsets/``."""
    if opts.checkpoint is None:
        return None
    return checkpoint_lineage(opts.checkpoint, opts.batch_id, context=f"{FORMAT} {opts.sink_id}")


def lineage_of(opts: TwoPhaseOptions, planned: Lineage | None, batch_id: int) -> Lineage | None:
    """Batch ``batch_id``'s lineage: ``planned`` when it is that batch, else read from the checkpoint."""
    if planned is not None and planned.batch == batch_id:
        return planned
    if opts.checkpoint is None:
        return None
    return batch_lineage(opts.checkpoint, batch_id)
