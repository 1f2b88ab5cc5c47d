"""The ``postgres-2pc`` sink: tasks PREPARE their rows, the driver commits them with the batch.

Protocol (README "two-phase sink" and "Lifecycle" have the diagram and the operator's view):

- task ``write`` of batch n, partition p: refuse if another query owns the sink id; under the
  sink's advisory lock, meet the decision of batch n if there is one (skip it, refuse it, or take
  it back: see I1, I3), then resolve stale prepared gids (roll forward those a decision names, roll
  back dead attempts', keep every attempt of this batch attempt); then in one transaction write the
  rows and a marker row in ``sink_parts`` and ``PREPARE TRANSACTION
  'eos:<sink>:<n>:<p>:<nonce>:<task attempt>'``. ``visibility=batch`` writes into a staging table of
  the task attempt's own, created in that transaction; ``visibility=partition`` writes into the
  table itself.
- driver ``commit(messages, n)``: under the lock, if no decision exists, check that every gid is
  still prepared and insert the decision (claiming the sink for this query) in its own
  transaction; COMMIT PREPARED each gid (a missing one proven by its marker); for
  ``visibility=batch`` publish: ONE transaction moves the staged rows into the table (append:
  INSERT; upsert: the version-guarded merge; complete mode: replace), drops the staging tables and
  marks the decision published. Then roll back stray gids. Every step is idempotent.
- driver ``abort(messages, n)``: roll back the batch's prepared gids unless a decision names them.

Invariants (DESIGN §6; the code and tests that keep each one cite its number):

- I1 A decision binds a batch number to the batch's lineage in its checkpoint (a digest of what
  Spark planned in ``offsets/n``): a decided number met with another lineage, or an undecided one
  below the last decided batch, is refused before anything is written, never skipped.
- I2 Nothing the data can cause fails after the decision: a refusal by the table surfaces in the
  task (``visibility=partition``) or, at publish, takes the batch back with no trace (nothing was
  visible); a fixed query restarted from the checkpoint writes the batch anew.
- I3 The decision says where the batch's rows are (its staging token); a replay with other columns
  takes an unpublished batch back and writes it with the columns it has now; a direct batch
  (rows possibly visible) is always rolled forward.
- I4 Every prepared transaction has a bounded life and an owner who resolves it: the next task
  or commit of the sink (streaming), the next job past ``prepared.timeout`` (batch jobs), a losing
  twin itself right after its PREPARE, ``spark-eos sinks recover`` by hand.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from connectors import faults
from connectors.checkpoint import Lineage, batch_lineage, display, last_planned
from connectors.errors import ConfigError, FatalError, RetriableError
from connectors.options import REQUIRED, Option, OptionSet
from sinks.postgres.connection import close_quietly, connect, retrying, rollback_quietly
from sinks.postgres.copy import copy_arrow, create_staging, drop_staging
from sinks.postgres.decisions import (
    DEFAULT_SCHEMA,
    Decision,
    ProtocolTables,
    check_max_prepared,
    list_prepared,
    sink_lock,
)
from sinks.postgres.gid import Gid, check_sink_id, new_nonce, parse_gid
from sinks.postgres.merge import ORDINAL, MergePlan, ensure_tombstones, merge_staged
from sinks.postgres.options import (
    CONNECTION_OPTIONS,
    FAULTS_OPTION,
    ConnectionOptions,
    TableName,
    UpsertOptions,
    parse_table_name,
    quote_ident,
)
from sinks.postgres.recovery import commit_prepared, resolve, rollback_prepared, warn_old_prepared
from sinks.postgres.refusal import DataRefused, copy_value, describe
from sinks.postgres.types import Column, base_type, check_table
from sinks.postgres.upsert import Replayable, UpsertPlanner, prepared_rows

__all__ = [
    "FORMAT",
    "TWOPC_OPTIONS",
    "Committer",
    "DataRefused",
    "LineageMismatch",
    "Postgres2pcDataSource",
    "Superseded",
    "TwoPhaseBatchWriter",
    "TwoPhaseMessage",
    "TwoPhaseOptions",
    "TwoPhasePlan",
    "TwoPhaseStreamWriter",
    "twopc_batch",
]

FORMAT = "postgres-2pc"
BATCH_IDENTITY = "batch-jobs"  # owner identity of df.write with caller-given batch ids
log = logging.getLogger(__name__)

TWOPC_OPTIONS = OptionSet(
    FORMAT,
    (
        *CONNECTION_OPTIONS,
        Option("table", "str", REQUIRED, "target table, optionally schema-qualified"),
        Option(
            "sink.id",
            "str",
            None,
            "name of this sink in the decision log and in every gid; REQUIRED for streaming; unique per query, stable across its restarts",
        ),
        Option(
            "batch.id",
            "int",
            None,
            "batch writes (df.write): the caller's batch number; re-running the same batch id is a no-op",
            min=0,
        ),
        Option(
            "mode",
            "choice",
            "append",
            "append: insert the rows; upsert: version-guarded upsert by key (options of postgres-upsert)",
            choices=("append", "upsert"),
        ),
        Option("key", "list", (), "upsert mode: key columns (the table needs a unique/primary key on them)"),
        Option("version", "str", None, "upsert mode: version column; a row replaces only a lower version"),
        Option("delete.column", "str", None, "upsert mode: boolean column, true deletes the key"),
        Option(
            "delete.tombstones", "bool", False, "upsert mode: rows whose non-key columns are all null delete the key"
        ),
        Option("columns", "json", None, "JSON object renaming DataFrame columns to table columns"),
        Option(
            "table.create",
            "bool",
            False,
            "create the table from the DataFrame schema when missing (upsert: key as primary key)",
        ),
        Option(
            "eos.schema",
            "str",
            DEFAULT_SCHEMA,
            "schema of the protocol tables (sink_batches, sink_parts, sink_owners, staging)",
        ),
        Option(
            "visibility",
            "choice",
            "batch",
            "batch: a batch appears in one transaction (tasks stage, the driver publishes); partition: each task "
            "writes straight into the table inside its prepared transaction and its rows appear as its COMMIT "
            "PREPARED runs (no staging, no publish: Flink's XA sink)",
            choices=("batch", "partition"),
        ),
        Option(
            "lock.timeout",
            "duration",
            60.0,
            "visibility=partition: how long a task waits for a row lock in the table (a sibling's prepared "
            "transaction holding the same key never lets go before the batch commits)",
            min=0.001,
        ),
        Option(
            "checkpointLocation",
            "str",
            None,
            "the query's checkpoint location (Spark passes writeStream.option('checkpointLocation') to the sink; "
            "with twopc_batch pass it yourself): each decision is bound to what the query planned in "
            "offsets/<batch>, so a restored older savepoint is refused instead of skipped. Required for streaming",
        ),
        Option(
            "decisions.retain",
            "int",
            10000,
            "published decisions kept per sink (the newest always stays); a checkpoint restored from further back is refused",
            min=1,
        ),
        Option(
            "prepared.timeout",
            "duration",
            3600.0,
            "batch jobs: an undecided prepared transaction of another batch older than this belongs to a dead job and "
            "is rolled back by the next job of the sink (keep it above your longest job's write time)",
            min=1,
        ),
        Option(
            "prepared.warn.age",
            "duration",
            300.0,
            "log a warning when a prepared transaction of the sink is older than this",
            min=0,
        ),
        Option(
            "commit.attempts",
            "int",
            5,
            "tries of each COMMIT PREPARED on connection loss before CommitUnknown",
            min=1,
            max=100,
        ),
        FAULTS_OPTION,
    ),
    ignored=("path", "queryName"),  # Spark passes the writer's own options along
)


@dataclass(frozen=True)
class TwoPhaseOptions:
    """Parsed options of ``postgres-2pc``."""

    connection: ConnectionOptions
    table: TableName
    sink_id: str | None
    batch_id: int | None
    mode: str
    upsert: UpsertOptions | None
    rename: tuple[tuple[str, str], ...]
    table_create: bool
    eos_schema: str
    warn_age: float
    commit_attempts: int
    faults: str | None
    checkpoint: str | None = None
    retain: int = 10000
    prepared_timeout: float = 3600.0
    visibility: str = "batch"
    lock_timeout: float = 60.0

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> TwoPhaseOptions:
        values = TWOPC_OPTIONS.parse(dict(raw))
        sink_id = values.get("sink_id")
        if sink_id is not None:
            check_sink_id(sink_id)
        mode = values["mode"]
        upsert = None
        if mode == "upsert":
            if not values.get("key"):
                raise ConfigError(f"{FORMAT}: mode=upsert needs option 'key' (the key columns)", option="key")
            upsert = UpsertOptions.from_values(values, FORMAT)
        else:
            for opt, attr in (("key", "key"), ("version", "version"), ("delete.column", "delete_column")):
                if values.get(attr):
                    raise ConfigError(
                        f"{FORMAT}: option '{opt}' only applies to mode=upsert (mode is append)", option=opt
                    )
        columns = values.get("columns") or {}
        if not isinstance(columns, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in columns.items()
        ):
            raise ConfigError(
                f"{FORMAT}: option 'columns' must be a JSON object of strings, got {columns!r}", option="columns"
            )
        conn_fields = {
            "dsn",
            "host",
            "port",
            "dbname",
            "user",
            "password",
            "connect_timeout",
            "statement_timeout",
            "retry_attempts",
            "retry_backoff",
            "retry_max_backoff",
        }
        return cls(
            connection=ConnectionOptions(**{k: v for k, v in values.items() if k in conn_fields}),
            table=parse_table_name(values["table"]),
            sink_id=sink_id,
            batch_id=values.get("batch_id"),
            mode=mode,
            upsert=upsert,
            rename=tuple(sorted(columns.items())),
            table_create=bool(values["table_create"]),
            eos_schema=values["eos_schema"],
            warn_age=float(values["prepared_warn_age"]),
            commit_attempts=int(values["commit_attempts"]),
            faults=values.get("faults"),
            checkpoint=values.get("checkpoint_location"),
            retain=int(values["decisions_retain"]),
            prepared_timeout=float(values["prepared_timeout"]),
            visibility=values["visibility"],
            lock_timeout=float(values["lock_timeout"]),
        )


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

    @property
    def stage_token(self) -> str:
        """What a decision records as the place of its rows (I3)."""
        return DIRECT if self.direct else TASKS + self.stage.sql


DIRECT = "direct"  # a decision whose rows went straight into the table (visibility=partition)
TASKS = "tasks:"  # + the column set's table prefix: each gid staged its rows in a table of its own


def task_table(prefix: TableName, gid: str) -> TableName:
    """The staging table of one task attempt: created, filled and prepared in the task's transaction,
    so a rolled-back gid takes its table with it; dropped by the publish that moves its rows."""
    return TableName(prefix.schema, f"{prefix.name}_{hashlib.sha1(gid.encode()).hexdigest()[:12]}")


def _prefix(token: str) -> TableName:
    """The table prefix of a (checked) ``tasks:"schema"."stage_<hash>"`` token."""
    m = _STAGE_SQL.match(token.removeprefix(TASKS))
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
            parts.append(f"SELECT *, {parsed.partition}::int AS {_TAG_PART} FROM {task_table(prefix, g).sql}")
        return "(" + " UNION ALL ".join(parts) + ")"
    literal = ", ".join("'" + g.replace("'", "''") + "'" for g in gids)
    return f"(SELECT * FROM {token} WHERE {_TAG_GID} = ANY(ARRAY[{literal}]))"  # a shared table of spark-eos 0.1


def discard_staged(conn: psycopg.Connection, token: str, gids: Sequence[str]) -> None:
    """Remove the batch's staged rows (inside the caller's transaction): drop its tables, or delete
    its rows from a shared table of spark-eos 0.1."""
    if not gids:
        return
    if token.startswith(TASKS):
        names = ", ".join(task_table(_prefix(token), g).sql for g in gids)
        conn.execute(f"DROP TABLE IF EXISTS {names}".encode())
    else:
        conn.execute(sql.SQL(f"DELETE FROM {token} WHERE {_TAG_GID} = ANY(%s)"), (list(gids),))  # type: ignore[arg-type]


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
_TAG_GID = "eos_gid"
_TAG_PART = "eos_part"


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
    conn = connect(opts.connection, autocommit=True, application_name=f"spark-eos {FORMAT} setup")
    try:
        check_max_prepared(conn, where=f" (sink {opts.sink_id!r})")
        tables.ensure(conn)
        _check_protocol_schema_off_path(conn, opts)
        merge: MergePlan | None = None
        if opts.upsert is not None:
            merge = UpsertPlanner(opts.upsert, schema, temporary_staging=False).plan()
            columns = tuple(merge.columns)
            stage_columns = tuple(merge.staging_columns())
        else:
            columns = tuple(_check_append_table(conn, opts, schema))
            stage_columns = tuple((c.name, c.pg_type) for c in columns)
        stage = _stage_name(opts.eos_schema, opts.sink_id, stage_columns)
        direct = opts.visibility == "partition"  # tasks create their own staging tables
        if merge is not None:
            ensure_tombstones(conn, merge)
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
        opts.sink_id, opts.table, columns, stage, stage_columns, merge, replace, direct=direct, copy_direct=copy_direct
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


def _check_append_table(conn: psycopg.Connection, opts: TwoPhaseOptions, schema: StructType) -> list[Column]:
    """Append mode: no key, so the table needs no unique constraint (created without one)."""
    return check_table(
        conn, opts.table, schema, (), dict(opts.rename), create=opts.table_create, require_unique_key=False
    )


# ---------------------------------------------------------------------------------------------
# the task side


def _task_context() -> tuple[int, int, int, int | None, str | None, str | None]:
    """(partition, attempt number, task attempt id, streaming batch id, query id, run id)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # outside Spark (unit tests): one partition, first attempt
        return 0, 0, 0, None, None, None
    raw = ctx.getLocalProperty("streaming.sql.batchId")
    return (
        ctx.partitionId(),
        ctx.attemptNumber(),
        ctx.taskAttemptId(),
        int(raw) if raw not in (None, "") else None,
        ctx.getLocalProperty("sql.streaming.queryId") or None,
        ctx.getLocalProperty("spark.jobGroup.id") or None,  # Spark's run id of the streaming query
    )


class _TwoPhaseWriter:
    """Shared by the batch and the stream writer; holds only picklable state."""

    opts: TwoPhaseOptions
    plan: TwoPhasePlan
    nonce: str
    streaming: bool

    def _setup(self, options: Mapping[str, str], schema: StructType, *, streaming: bool, overwrite: bool) -> None:
        self.opts = TwoPhaseOptions.from_options(options)
        self.streaming = streaming
        if self.opts.sink_id is None:
            raise ConfigError(
                f"{FORMAT}: option 'sink.id' is required: a name unique to this query and stable across its "
                "restarts, e.g. .option('sink.id', 'orders-to-pg'); it keys the decision log",
                option="sink.id",
            )
        if streaming and self.opts.batch_id is not None:
            raise ConfigError(
                f"{FORMAT}: option 'batch.id' is for batch writes only; a streaming query uses Spark's batch ids",
                option="batch.id",
            )
        if not streaming and self.opts.batch_id is None:
            raise ConfigError(
                f"{FORMAT}: batch writes need option 'batch.id' (your job's run number: re-running the same "
                "batch id is a no-op), e.g. .option('batch.id', 20240601); in foreachBatch use twopc_batch(...)",
                option="batch.id",
            )
        if streaming and self.opts.checkpoint is None:
            raise ConfigError(
                f"{FORMAT} {self.opts.sink_id}: the sink needs the query's checkpoint location to bind each decision "
                "to the batch Spark planned (offsets/<batch>); pass it as a writer option: "
                "writeStream.option('checkpointLocation', '/path/to/checkpoint') (spark.sql.streaming."
                "checkpointLocation alone does not reach the sink)",
                option="checkpointLocation",
            )
        # The constructor also runs in the driver process that calls commit(): only checks and
        # CREATE ... IF NOT EXISTS here, never a rollback (it would hit the batch being committed).
        self.plan = build_plan(self.opts, schema, replace=overwrite and streaming)
        # One nonce per writer built by the driver: every task of this batch attempt shares it, a
        # replay after a crash builds a new writer and gets a new one (verified: Spark builds the
        # stream writer once per micro-batch and pickles it to the tasks).
        self.nonce = new_nonce()
        # Spark builds the writer after writing offsets/<n> for the batch it runs: read that
        # batch's lineage here, on the driver, so tasks need not read the checkpoint themselves.
        self.planned: Lineage | None = None
        if self.opts.checkpoint is not None:
            batch = self.opts.batch_id if self.opts.batch_id is not None else last_planned(self.opts.checkpoint)
            if batch is None:
                raise ConfigError(
                    f"{FORMAT} {self.opts.sink_id}: no offsets/ under the checkpoint location "
                    f"{display(self.opts.checkpoint)!r} (option 'checkpointLocation'), although Spark plans each "
                    "batch there before it builds the sink's writer: this is not the location Spark uses, or the "
                    "sink cannot reach it from Python. A path without a scheme is read as a local path; Spark "
                    "resolves it against fs.defaultFS (HDFS on YARN), so give the full URI (hdfs://..., s3a://...)",
                    option="checkpointLocation",
                )
            self.planned = batch_lineage(self.opts.checkpoint, batch)

    def _lineage(self, batch_id: int) -> Lineage | None:
        if self.planned is not None and self.planned.batch == batch_id:
            return self.planned
        if self.opts.checkpoint is None:
            return None
        return batch_lineage(self.opts.checkpoint, batch_id)

    # -- write (executor) ------------------------------------------------------------------

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:
        partition, attempt_no, task_attempt, stream_batch, query_id, run_id = _task_context()
        batch_id = self.opts.batch_id if self.opts.batch_id is not None else stream_batch
        if batch_id is None:
            raise FatalError(f"{FORMAT}: no batch id: Spark did not set streaming.sql.batchId for this task")
        identity = f"query:{query_id}" if query_id else BATCH_IDENTITY
        sink_id = self.plan.sink_id
        gid = Gid(sink_id, batch_id, partition, self.nonce, task_attempt)
        fctx = {"batch": batch_id, "partition": partition, "attempt": attempt_no, "task": task_attempt}
        faults.point("sink.before_write", spec=self.opts.faults, **fctx)
        lineage = self._lineage(batch_id)
        tables = ProtocolTables(self.opts.eos_schema)
        copts = self.opts.connection

        def message(gid_text: str | None, rows: int, skipped: bool) -> TwoPhaseMessage:
            return TwoPhaseMessage(
                sink_id=sink_id,
                batch_id=batch_id,
                partition=partition,
                attempt=attempt_no,
                gid=gid_text,
                rows=rows,
                skipped=skipped,
                identity=identity,
                run_id=run_id,
                nonce=self.nonce,
                lineage=lineage.digest if lineage else None,
            )

        def ctl_connect() -> psycopg.Connection:
            return connect(copts, autocommit=True, application_name=f"spark-eos {FORMAT} task")

        ctl = retrying(
            ctl_connect,
            attempts=copts.retry_attempts,
            base_delay=copts.retry_backoff,
            max_delay=copts.retry_max_backoff,
            what=f"{FORMAT} connect",
        )
        try:
            tables.check_owner(ctl, sink_id, identity, claim=False)
            with sink_lock(ctl, sink_id):
                if self._meets_decision(ctl, tables, batch_id, lineage):
                    log.info(
                        "%s %s: batch %d already written; partition %d writes nothing",
                        FORMAT,
                        sink_id,
                        batch_id,
                        partition,
                    )
                    return message(None, 0, True)
                # Recovery before the first write: stale prepared gids hold locks (and slots) that
                # this write could wait on forever. Streaming queries own every batch of the sink;
                # batch jobs with their own batch ids only touch their batch (another job may be
                # mid-flight) and other batches' gids older than prepared.timeout (a dead job's, I4).
                # Gids of this batch attempt stay, other task attempts of this partition included:
                # with speculation, Spark may yet accept either attempt (the commit drops the other).
                resolve(
                    ctl,
                    tables,
                    sink_id,
                    keep_nonce=self.nonce,
                    only_batch=None if identity != BATCH_IDENTITY else batch_id,
                    stale_after=self.opts.prepared_timeout if identity == BATCH_IDENTITY else None,
                )
            batches = self._stage_batches(iterator)
            if batches is None:
                return message(None, 0, False)

            def once() -> int:
                return self._prepare(tables, gid, batches, fctx)

            rows = retrying(
                once,
                attempts=copts.retry_attempts,
                base_delay=copts.retry_backoff,
                max_delay=copts.retry_max_backoff,
                what=f"{FORMAT} {gid}",
            )
            # A twin that lost (speculation, a retried task's slow predecessor) can PREPARE after
            # the commit's last cleanup: roll it back now rather than leave it to the next batch (I4).
            with sink_lock(ctl, sink_id):
                decision = tables.decision(ctl, sink_id, batch_id)
                if decision is not None and str(gid) not in decision.gids:
                    rollback_prepared(ctl, str(gid))
                    return message(None, 0, True)
        finally:
            close_quietly(ctl)
        faults.point("sink.after_prepare", spec=self.opts.faults, **fctx)
        return message(str(gid), rows, False)

    def _meets_decision(
        self, conn: psycopg.Connection, tables: ProtocolTables, batch_id: int, lineage: Lineage | None
    ) -> bool:
        """Under the sink lock, before writing: True when the batch is decided (skip: the commit
        rolls the decision forward, publishing what it names).

        A decision of another lineage is refused (I1). An unpublished decision whose rows wait in
        a staging table of other columns (the query's schema changed, I3) is taken back, since
        nothing of it is visible, and this attempt writes the batch with the columns it has now."""
        sink_id = self.plan.sink_id
        decision = tables.decision(conn, sink_id, batch_id)
        if decision is None:
            check_not_rewound(conn, tables, self.opts, batch_id, lineage)
            return False
        check_lineage(self.opts, decision, lineage)
        if (
            decision.published
            or decision.stage in (None, DIRECT, self.plan.stage_token, self.plan.stage.sql)
            or decision.nonce == self.nonce
        ):
            return True  # roll forward (rows of a direct decision may be visible already: never taken back)
        if undecide(conn, tables, decision, self.plan):
            log.warning(
                "%s %s: batch %d was decided with other columns (staged in %s) and never published; took it back "
                "(nothing of it was visible) and writing it again with the query's current columns",
                FORMAT,
                sink_id,
                batch_id,
                decision.stage,
            )
            return False
        return True  # published meanwhile by the earlier attempt's committer

    def _stage_batches(self, iterator: Iterator[pa.RecordBatch]) -> Replayable | None:
        """The task's rows, streamed into COPY as Spark yields them and re-iterable for a retried COPY
        (memory stays flat in the partition's size); None for a partition without rows."""
        plan = self.plan
        if plan.merge is not None:
            assert self.opts.upsert is not None
            prepared: Iterator[pa.RecordBatch] = prepared_rows(iterator, plan.merge, self.opts.upsert)
        else:
            names = [c.name for c in plan.columns]
            prepared = (b.select(names) for b in iterator if b.num_rows)
        first = next(prepared, None)
        return None if first is None else Replayable(itertools.chain((first,), prepared))

    def _prepare(
        self,
        tables: ProtocolTables,
        gid: Gid,
        batches: Iterable[pa.RecordBatch],
        fctx: Mapping[str, Any],
    ) -> int:
        """One try: write the task's rows and its marker, PREPARE; returns the row count."""
        text = str(gid)
        conn = connect(self.opts.connection, application_name=f"spark-eos {FORMAT} task")
        try:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (text,)).fetchone():
                conn.rollback()
                # An earlier try prepared it and only the reply was lost; its marker (with the
                # count) is invisible until the commit, so count what that try sent.
                return sum(b.num_rows for b in batches)
            with conn.cursor() as cur:
                if self.plan.direct:
                    rows = self._write_direct(cur, batches)
                else:
                    table = task_table(self.plan.stage, text).sql
                    defs = ", ".join(f"{quote_ident(n)} {t}" for n, t in self.plan.stage_columns)
                    cur.execute(f"CREATE TABLE {table} ({defs})".encode())
                    cur.execute(
                        sql.SQL("COMMENT ON TABLE {} IS {}").format(
                            sql.SQL(table),  # type: ignore[arg-type]
                            sql.Literal(f"{_stage_comment(self.plan.sink_id)}: {text}"),
                        )
                    )
                    rows = copy_arrow(cur, table, self.plan.stage_columns, batches)
                tables.insert_marker(conn, gid, rows)
            faults.point("sink.after_write", spec=self.opts.faults, **fctx)
            try:
                conn.execute(f"PREPARE TRANSACTION '{text}'".encode())
            except psycopg.Error as exc:
                _explain_prepare_failure(exc, conn)
                raise
        except BaseException:
            rollback_quietly(conn)
            raise
        finally:
            close_quietly(conn)
        return rows

    def _write_direct(self, cur: psycopg.Cursor, batches: Iterable[pa.RecordBatch]) -> int:
        """visibility=partition: the rows go into the table inside this (to be prepared) transaction.

        Refusals by the table surface here, before PREPARE and so before any decision (I2)."""
        plan = self.plan
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(self.opts.lock_timeout * 1000))}ms",))
        try:
            if plan.copy_direct:
                return copy_arrow(
                    cur,
                    plan.target.sql,
                    [(c.name, c.pg_type) for c in plan.columns],
                    batches,
                    targets=[c.target for c in plan.columns],
                )
            # Widening, casts or the merge: through a staging table of this transaction only
            # (Postgres refuses PREPARE after touching a temporary table, so an unlogged one,
            # dropped before PREPARE).
            staging = create_staging(cur, TableName(self.opts.eos_schema, "x"), plan.stage_columns, temporary=False)
            rows = copy_arrow(cur, staging, plan.stage_columns, batches)
            if plan.merge is not None:
                merge_staged(cur, staging, plan.merge)
            else:
                targets = ", ".join(quote_ident(c.target) for c in plan.columns)
                cur.execute(
                    f"INSERT INTO {plan.target.sql} ({targets}) SELECT {_select_list(plan)} FROM {staging}".encode()
                )
            drop_staging(cur, staging)
            return rows
        except psycopg.Error as exc:
            state = exc.sqlstate or ""
            if state == "55P03":
                raise FatalError(
                    f"{FORMAT} {plan.sink_id}: rows of {plan.target.sql} stayed locked for lock.timeout "
                    f"({self.opts.lock_timeout:g}s) with visibility=partition. A sibling task of this batch holds the "
                    "same key in its prepared transaction (it lets go only when the batch commits): partition the "
                    "DataFrame by the key (df.repartition(*key)) so each key is written by one task, or use "
                    "visibility=batch; otherwise another session holds the rows",
                    sqlstate=state,
                ) from exc
            if state.startswith(_TAKE_BACK_CLASSES) or state in _TAKE_BACK_STATES:
                names = {c.target if plan.copy_direct else c.name: c.name for c in plan.columns}
                sent = copy_value(exc, batches, names)
                raise DataRefused(
                    f"{FORMAT} {plan.sink_id}: {describe(exc, target=plan.target, sent=sent)}. Nothing of the batch "
                    "was written; "
                    "fix the query (filter or repair the rows) or the table, and restart from the same checkpoint",
                    sink_id=plan.sink_id,
                    sqlstate=state,
                ) from exc
            raise

    # -- commit / abort (driver, separate process, fresh writer) ---------------------------

    def _committer(self) -> Committer:
        return Committer(self)


def _explain_prepare_failure(exc: psycopg.Error, conn: psycopg.Connection) -> None:
    text = str(exc)
    if "maximum number of prepared transactions" in text or "prepared transactions are disabled" in text:
        raise ConfigError(
            f"{FORMAT}: PREPARE TRANSACTION failed: {text.strip()}. More writer tasks prepare at once than the "
            "server's max_prepared_transactions allows: raise max_prepared_transactions (postgresql.conf or "
            "`-c max_prepared_transactions=64`; needs a restart) to at least the number of concurrent writer "
            "tasks, or write with fewer partitions",
            option="max_prepared_transactions",
        ) from exc


def check_lineage(opts: TwoPhaseOptions, decision: Decision, lineage: Lineage | None) -> None:
    """I1: a decided batch number met with another lineage is refused, never skipped."""
    if lineage is None or decision.lineage is None or decision.lineage == lineage.digest:
        if lineage is not None and decision.lineage is None:
            log.warning(
                "%s %s: batch %d was decided by spark-eos 0.1, which recorded no lineage; taking it as this one",
                FORMAT,
                decision.sink_id,
                decision.batch_id,
            )
        return
    raise LineageMismatch(
        f"{FORMAT} sink {decision.sink_id!r}: this query's {lineage} in checkpoint {display(opts.checkpoint)!r}, but the "
        f"sink decided batch {decision.batch_id} of another lineage ({decision.lineage[:12]}, checkpoint "
        f"{decision.checkpoint!r}, decided {decision.decided_at}). {_REWIND_HELP}",
        sink_id=decision.sink_id,
        batch_id=decision.batch_id,
    )


def check_not_rewound(
    conn: psycopg.Connection, tables: ProtocolTables, opts: TwoPhaseOptions, batch_id: int, lineage: Lineage | None
) -> None:
    """I1: with later batches decided, an undecided batch n cannot belong to the sink's lineage."""
    if lineage is None:
        return  # batch jobs without a checkpoint: caller-given batch ids may come in any order
    sink_id = opts.sink_id
    last = tables.last_batch(conn, str(sink_id))
    if last is not None and last > batch_id:
        raise LineageMismatch(
            f"{FORMAT} sink {sink_id!r}: this query's {lineage} in checkpoint {display(opts.checkpoint)!r}, but the sink has "
            f"already decided up to batch {last} and holds no decision for batch {batch_id} (older than "
            f"decisions.retain, or another lineage). {_REWIND_HELP}",
            sink_id=sink_id,
            batch_id=batch_id,
        )


_REWIND_HELP = (
    "The query was restored from an older savepoint, or its checkpoint was replaced, after the sink had moved "
    "on; writing would skip or duplicate records, so nothing was written. Choose one: (1) restore the latest "
    "savepoint (or the checkpoint the sink followed) instead; (2) keep this checkpoint and give the query a "
    "fresh sink: a new 'sink.id' and a new or emptied table; (3) rewind the sink: delete from the table the rows "
    "of the batches after the savepoint, then `spark-eos sinks release --sink-id <id>` (the next run writes "
    "those batches again)"
)


def undecide(conn: psycopg.Connection, tables: ProtocolTables, decision: Decision, plan: TwoPhasePlan) -> bool:
    """Take back an unpublished decision with its staged rows and markers (one transaction); its gids
    still prepared are rolled back by the caller's recovery. False: it was published meanwhile."""
    token = stage_of(decision, plan)
    if token == DIRECT:
        raise FatalError(f"{FORMAT} {decision.sink_id}: batch {decision.batch_id}: a direct batch is never taken back")
    return tables.undecide(conn, decision, lambda gids: discard_staged(conn, token, gids))


_STAGE_SQL = re.compile(r'^"((?:[^"]|"")+)"\."(stage_[0-9a-f]{20})"$')


def stage_of(decision: Decision, plan: TwoPhasePlan) -> str:
    """The staging table a decision names, checked to be one of ours before it goes into SQL."""
    if decision.stage is None:
        return plan.stage.sql  # decided by spark-eos 0.1: one staging table per sink and columns
    if decision.stage == DIRECT:
        return DIRECT
    shared = decision.stage.removeprefix(TASKS)
    m = _STAGE_SQL.match(shared)
    if m is None or m.group(1).replace('""', '"') != plan.stage.schema:
        raise FatalError(
            f"{FORMAT} {decision.sink_id}: batch {decision.batch_id}: the decision names {decision.stage!r} as its "
            f"staging table, which is not a staging table of schema {plan.stage.schema!r}; "
            f"{plan.stage.schema}.sink_batches was changed by hand",
            sink_id=decision.sink_id,
        )
    return decision.stage


class Superseded(FatalError):
    """Another attempt of the batch took over its decision (a zombie driver or task, two jobs with one
    batch id): this committer stands down without touching what the other attempt decided."""


# Refusals the data (or its size) causes: class 22 data exceptions, class 23 integrity violations,
# 57014 a statement canceled (statement_timeout). Only these take a decided batch back; other
# failures (a dropped table, revoked rights, a full disk, a read-only standby) keep the decision,
# and the next run publishes it once the environment is fixed.
_TAKE_BACK_CLASSES = ("22", "23")
_TAKE_BACK_STATES = ("57014",)


class LineageMismatch(FatalError):
    """A decided batch number met with another checkpoint lineage (an older savepoint restored)."""


def _select_list(plan: TwoPhasePlan) -> str:
    return ", ".join(
        f"CAST({quote_ident(c.name)} AS {c.cast})" if c.cast else quote_ident(c.name) for c in plan.columns
    )


class Committer:
    """The driver side of one batch: decide, COMMIT PREPARED, publish, clean up; or abort."""

    def __init__(self, writer: _TwoPhaseWriter) -> None:
        self.writer = writer
        self.opts = writer.opts
        self.plan = writer.plan
        self.tables = ProtocolTables(writer.opts.eos_schema)
        self.timings: dict[str, float] = {}

    def _connect(self) -> psycopg.Connection:
        return connect(self.opts.connection, autocommit=True, application_name=f"spark-eos {FORMAT} commit")

    def _retrying(self, fn: Callable[[], Any], what: str) -> Any:
        c = self.opts.connection
        return retrying(
            fn, attempts=c.retry_attempts, base_delay=c.retry_backoff, max_delay=c.retry_max_backoff, what=what
        )

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        t0 = time.perf_counter()
        sink_id = self.plan.sink_id
        msgs = [m for m in messages if isinstance(m, TwoPhaseMessage)]
        if len(msgs) != len(messages):
            raise FatalError(
                f"{FORMAT} {sink_id}: batch {batch_id}: commit() got messages of another sink or None: {messages!r}"
            )
        wrong = [m for m in msgs if m.batch_id != batch_id or m.sink_id != sink_id]
        if wrong:
            raise FatalError(f"{FORMAT} {sink_id}: batch {batch_id}: messages of another batch/sink: {wrong!r}")
        identities = {m.identity for m in msgs}
        if len(identities) > 1:
            raise FatalError(f"{FORMAT} {sink_id}: batch {batch_id}: tasks of different writers: {sorted(identities)}")
        lineage = self.writer._lineage(batch_id)
        seen = {m.lineage for m in msgs if m.lineage} - {lineage.digest if lineage else None}
        if seen:
            raise FatalError(
                f"{FORMAT} {sink_id}: batch {batch_id}: tasks saw offsets/{batch_id} as {sorted(seen)}, the driver as "
                f"{lineage}; the checkpoint changed while the batch ran"
            )
        # No task at all (an empty input with zero partitions): nothing to fence, and stray cleanup
        # stays within this batch since we cannot tell whether a streaming query owns the sink.
        identity = identities.pop() if identities else None
        owns_all = identity is not None and identity != BATCH_IDENTITY
        run_id = next((m.run_id for m in msgs if m.run_id), None)
        nonce = next((m.nonce for m in msgs if m.nonce), self.writer.nonce)
        fctx = {"batch": batch_id}
        faults.point("sink.commit.before_decision", spec=self.opts.faults, **fctx)
        conn = self._retrying(self._connect, f"{FORMAT} commit connect")
        try:
            with sink_lock(conn, sink_id):
                decision = self.tables.decision(conn, sink_id, batch_id)
                if decision is None:
                    decided = self._decide(conn, batch_id, msgs, identity, run_id, nonce, lineage)
                    stage = self.plan.stage_token
                else:
                    try:
                        check_lineage(self.opts, decision, lineage)
                    except LineageMismatch:
                        resolve(conn, self.tables, sink_id, only_batch=batch_id)  # this attempt's gids
                        raise
                    stage = stage_of(decision, self.plan)
                    if not decision.published and stage not in (DIRECT, self.plan.stage_token, self.plan.stage.sql):
                        # Staged under the query's previous columns and no task of this attempt
                        # took it back (a batch with no tasks): nothing is visible, take it back.
                        undecide(conn, self.tables, decision, self.plan)
                        resolve(conn, self.tables, sink_id, only_batch=batch_id)
                        raise RetriableError(
                            f"{FORMAT} {sink_id}: batch {batch_id} was staged under the query's previous columns "
                            f"({stage}); it was taken back (nothing of it was visible): restart the query to "
                            "write it with the current ones"
                        )
                    decided = decision.gids
            self.timings["decide"] = time.perf_counter() - t0
            faults.point("sink.commit.after_decision", spec=self.opts.faults, **fctx)
            for k, gid in enumerate(decided, 1):
                try:
                    _, conn2 = commit_prepared(
                        self._connect, self.tables, gid, attempts=self.opts.commit_attempts, conn=conn
                    )
                except FatalError:
                    self._check_still_ours(batch_id, decided)  # taken back by another attempt: say so
                    raise
                conn = conn2 if conn2 is not None else conn
                faults.point("sink.commit.after_k", spec=self.opts.faults, k=k, **fctx)
            self.timings["commit_prepared"] = time.perf_counter() - t0
            if stage == DIRECT:  # the rows became visible with their COMMIT PREPARED
                self.tables.mark_published(conn, sink_id, batch_id)
            else:
                conn = self._publish(conn, batch_id, decided, stage)
            self.timings["publish"] = time.perf_counter() - t0
            # Strays: attempts that lost (task retries, speculative twins, zombies, crashed runs) of
            # this batch and, for a streaming query that owns every batch of the sink, of older batches.
            resolve(
                conn,
                self.tables,
                sink_id,
                only_batch=None if owns_all else batch_id,
                upto_batch=batch_id if owns_all else None,
                stale_after=None if owns_all else self.opts.prepared_timeout,
            )
            if owns_all:
                self.tables.prune_markers(conn, sink_id, batch_id - 100)
                self.tables.prune_decisions(conn, sink_id, batch_id - self.opts.retain)
            drop_empty_stages(conn, self.tables, sink_id)
            warn_old_prepared(list_prepared(conn, sink_id), sink_id, self.opts.warn_age)
        finally:
            close_quietly(conn)
        self.timings["total"] = time.perf_counter() - t0
        _record_timings(sink_id, batch_id, len(decided), self.timings)
        log.info(
            "%s %s: batch %d committed (%d gids) in %.3fs",
            FORMAT,
            sink_id,
            batch_id,
            len(decided),
            self.timings["total"],
        )
        faults.point("sink.after_commit", spec=self.opts.faults, **fctx)

    def _decide(
        self,
        conn: psycopg.Connection,
        batch_id: int,
        msgs: list[TwoPhaseMessage],
        identity: str | None,
        run_id: str | None,
        nonce: str,
        lineage: Lineage | None,
    ) -> tuple[str, ...]:
        """Write the decision (own transaction, under the sink lock): the point of no return."""
        sink_id = self.plan.sink_id
        if any(m.skipped for m in msgs):
            raise FatalError(
                f"{FORMAT} {sink_id}: batch {batch_id}: tasks saw a decision that is gone now; the "
                f"decision log ({self.opts.eos_schema}.sink_batches) was changed by hand"
            )
        check_not_rewound(conn, self.tables, self.opts, batch_id, lineage)
        gids = sorted(m.gid for m in msgs if m.gid)
        prepared = {str(p.gid) for p in list_prepared(conn, sink_id)}
        missing = [g for g in gids if g not in prepared]
        if missing:
            # Decide only what is still prepared: a gid rolled back by recovery (or a restarted
            # server without it) must never be named by a decision.
            raise RetriableError(
                f"{FORMAT} {sink_id}: batch {batch_id}: prepared transaction(s) {missing} vanished before "
                "the decision (rolled back by a concurrent recovery?); nothing was committed and the "
                "batch will be replayed on restart"
            )
        with conn.transaction():
            if identity is not None:
                self.tables.check_owner(conn, sink_id, identity, claim=True, run_id=run_id)
            self.tables.insert_decision(
                conn,
                sink_id,
                batch_id,
                gids,
                sum(m.rows for m in msgs),
                identity,
                lineage=lineage.digest if lineage else None,
                nonce=nonce,
                stage=self.plan.stage_token,
                checkpoint=display(self.opts.checkpoint),
            )
        return tuple(gids)

    def _publish(
        self, conn: psycopg.Connection, batch_id: int, gids: tuple[str, ...], stage: str
    ) -> psycopg.Connection:
        """Move the batch's staged rows into the table in ONE transaction; idempotent via published_at.

        A refusal by the target (I2: types, lengths, NOT NULL, CHECK, keys, a timeout) takes the
        decision back with its staged rows (nothing was visible), so a fixed query gets past it."""
        plan = self.plan

        def once() -> None:
            nonlocal conn
            if conn.closed or conn.broken:
                conn = self._connect()
            with conn.transaction():
                decision = self.tables.decision(conn, plan.sink_id, batch_id, for_update=True)
                if decision is None or tuple(decision.gids) != tuple(gids):
                    raise self._superseded(batch_id, decision)
                if decision.published:
                    return
                staged = staged_relation(stage, gids)
                with conn.cursor() as cur:
                    if plan.replace:
                        cur.execute(f"DELETE FROM {plan.target.sql}".encode())
                    if staged is not None and plan.merge is not None:
                        cols = ", ".join(quote_ident(n) for n, _ in plan.stage_columns if n != ORDINAL)
                        # Input order across partitions: partition first, then the task's ordinal.
                        cur.execute(
                            f"CREATE TEMP VIEW eos_publish AS SELECT {cols}, "
                            f"(({_TAG_PART}::bigint << 40) + {quote_ident(ORDINAL)}) AS {quote_ident(ORDINAL)} "
                            f"FROM {staged} s".encode()
                        )
                        merge_staged(cur, "pg_temp.eos_publish", plan.merge)
                        cur.execute(b"DROP VIEW pg_temp.eos_publish")
                    elif staged is not None:
                        targets = ", ".join(quote_ident(c.target) for c in plan.columns)
                        cur.execute(
                            f"INSERT INTO {plan.target.sql} ({targets}) SELECT {_select_list(plan)} FROM {staged} s".encode()
                        )
                    discard_staged(conn, stage, gids)  # one DROP TABLE per task, not a DELETE per row
                self.tables.mark_published(conn, plan.sink_id, batch_id)

        try:
            self._retrying(once, f"{FORMAT} publish batch {batch_id}")
        except (RetriableError, Superseded):
            raise  # out of reach (the decision stays, the next run publishes), or not ours any more
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
            state = getattr(cause, "sqlstate", None) or ""
            if not (state.startswith(_TAKE_BACK_CLASSES) or state in _TAKE_BACK_STATES):
                raise FatalError(
                    f"{FORMAT} {plan.sink_id}: batch {batch_id}: publishing into {plan.target.sql} failed: {exc}. The "
                    "batch stays decided (its rows wait in staging); fix the cause and restart the query: its next "
                    "run publishes the batch",
                    sink_id=plan.sink_id,
                    batch_id=batch_id,
                    sqlstate=state or None,
                ) from exc
            raise self._refused(batch_id, gids, stage, cause) from exc
        return conn

    def _superseded(self, batch_id: int, decision: Decision | None) -> Superseded:
        now = "no decision any more" if decision is None else f"a decision of attempt {decision.nonce}"
        return Superseded(
            f"{FORMAT} {self.plan.sink_id}: batch {batch_id} was taken over by another attempt ({now}) while this "
            "committer ran (a second driver or job on the same batch); this one stands down and changes nothing. "
            "The query replays the batch on restart",
            sink_id=self.plan.sink_id,
            batch_id=batch_id,
        )

    def _check_still_ours(self, batch_id: int, gids: tuple[str, ...]) -> None:
        conn = self._retrying(self._connect, f"{FORMAT} commit check")
        try:
            decision = self.tables.decision(conn, self.plan.sink_id, batch_id)
        finally:
            close_quietly(conn)
        if decision is None or tuple(decision.gids) != tuple(gids):
            raise self._superseded(batch_id, decision)

    def _refused(self, batch_id: int, gids: tuple[str, ...], stage: str, cause: BaseException) -> FatalError:
        """The target refused the batch's rows: describe the refusal, then take the batch back (I2)."""
        plan = self.plan
        if isinstance(cause, psycopg.Error):
            what = describe(
                cause,
                target=plan.target,
                connect=self._connect,
                columns=[(c.name, c.target) for c in plan.columns],
                staged=sql.SQL(f"{staged_relation(stage, gids) or '(SELECT 1 WHERE false)'} s"),  # type: ignore[arg-type]
                where=sql.SQL("true"),
            )
        else:
            what = f"publishing into {plan.target.sql} failed: {cause}"
        conn = self._retrying(self._connect, f"{FORMAT} take back batch {batch_id}")
        try:
            with sink_lock(conn, plan.sink_id):
                decision = self.tables.decision(conn, plan.sink_id, batch_id)
                if decision is None or tuple(decision.gids) != tuple(gids):
                    return self._superseded(batch_id, decision)
                taken_back = undecide(conn, self.tables, decision, plan)
                resolve(conn, self.tables, plan.sink_id, only_batch=batch_id)
        finally:
            close_quietly(conn)
        if not taken_back:
            return FatalError(f"{FORMAT} {plan.sink_id}: batch {batch_id}: {what}")
        return DataRefused(
            f"{FORMAT} {plan.sink_id}: batch {batch_id}: {what}. Nothing of the batch was written (it was taken back); "
            "fix the query (filter or repair the rows) or the table, and restart from the same checkpoint: the batch is "
            "written anew",
            sink_id=plan.sink_id,
            batch_id=batch_id,
            sqlstate=getattr(cause, "sqlstate", None),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        """Roll back the batch's prepared gids unless a decision names them (Spark also calls abort
        after a commit() that failed, possibly after the decision was written)."""
        sink_id = self.plan.sink_id
        conn = None
        try:
            conn = self._connect()
            with sink_lock(conn, sink_id):
                decision = self.tables.decision(conn, sink_id, batch_id)
            if decision is not None:
                log.warning(
                    "%s %s: abort of batch %d after its decision: keeping its gids; the replay of the batch on "
                    "restart (or `spark-eos sinks recover`) commits them",
                    FORMAT,
                    sink_id,
                    batch_id,
                )
                return
            # Messages of failed tasks are None: roll back by batch, not only the listed gids.
            resolve(conn, self.tables, sink_id, only_batch=batch_id)
        except Exception as exc:  # abort is best effort: the query is failing already
            log.warning("%s %s: abort of batch %d could not finish (recovery will): %s", FORMAT, sink_id, batch_id, exc)
        finally:
            close_quietly(conn)


def drop_empty_stages(conn: psycopg.Connection, tables: ProtocolTables, sink_id: str) -> list[str]:
    """Bounded growth: drop the sink's staging tables that no unpublished decision needs: per-task
    tables left by an attempt that was taken over (a zombie's late COMMIT PREPARED), and shared
    tables of spark-eos 0.1 once empty. A table still in use is skipped, never waited on."""
    comment = _stage_comment(sink_id)
    rows = conn.execute(
        "SELECT c.relname, d.description FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_description d ON d.objoid = c.oid AND d.objsubid = 0 "
        "WHERE n.nspname = %s AND (d.description = %s OR starts_with(d.description, %s))",
        (tables.schema, comment, comment + ": "),
    ).fetchall()
    if not rows:
        return []
    pending = conn.execute(
        sql.SQL("SELECT stage, gids FROM {} WHERE sink_id = %s AND published_at IS NULL").format(tables.batches),
        (sink_id,),
    ).fetchall()
    needed_gids = {g for _, gids in pending for g in gids}
    needed_tables = {str(stage) for stage, _ in pending}
    dropped = []
    for relname, description in rows:
        name = TableName(tables.schema, str(relname)).sql  # as decisions store it
        gid = str(description)[len(comment) + 2 :] if description != comment else None
        if (gid is not None and gid in needed_gids) or (gid is None and name in needed_tables):
            continue
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '200ms'")
                if gid is None and conn.execute(f"SELECT 1 FROM {name} LIMIT 1".encode()).fetchone() is not None:  # type: ignore[arg-type]
                    continue  # a shared table of 0.1 with rows of an attempt still prepared
                conn.execute(f"DROP TABLE {name}".encode())
                dropped.append(name)
        except psycopg.Error as exc:
            log.info("%s %s: staging table %s not dropped now: %s", FORMAT, sink_id, name, exc)
    return dropped


def _stage_comment(sink_id: str) -> str:
    return f"spark-eos staging of sink {sink_id}"


def _record_timings(sink_id: str, batch_id: int, gids: int, timings: Mapping[str, float]) -> None:
    # Diagnostics for bench/twophase.py: commit() runs in a Python process Spark starts, so the
    # per-batch latency leaves it through a file named by EOS_2PC_TIMINGS (unset: nothing happens).
    path = os.environ.get("EOS_2PC_TIMINGS")
    if not path:
        return
    entry = {"sink_id": sink_id, "batch": batch_id, "gids": gids, **{k: round(v, 6) for k, v in timings.items()}}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


# ---------------------------------------------------------------------------------------------
# Spark classes


class TwoPhaseBatchWriter(_TwoPhaseWriter, DataSourceArrowWriter):
    """``df.write.format("postgres-2pc")`` with ``sink.id`` and ``batch.id``."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool = False) -> None:
        self._setup(options, schema, streaming=False, overwrite=overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:  # type: ignore[override]
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        assert self.opts.batch_id is not None
        self._committer().commit(messages, self.opts.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        assert self.opts.batch_id is not None
        self._committer().abort(messages, self.opts.batch_id)


class TwoPhaseStreamWriter(_TwoPhaseWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("postgres-2pc")`` (append and complete output modes)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool = False) -> None:
        self._setup(options, schema, streaming=True, overwrite=overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:  # type: ignore[override]
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._committer().commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._committer().abort(messages, batchId)


class Postgres2pcDataSource(DataSource):
    """Format ``postgres-2pc``: rows become visible exactly once, when their batch commits."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> TwoPhaseBatchWriter:
        if overwrite:
            raise ConfigError(
                f"{FORMAT}: save mode 'overwrite' is not supported for batch writes; use mode('append')", option="mode"
            )
        return TwoPhaseBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        # Complete output mode arrives as overwrite=True: each batch replaces the table atomically.
        return TwoPhaseStreamWriter(self.options, schema, overwrite)


def twopc_batch(**options: Any) -> Callable[[Any, int], None]:
    """A ``foreachBatch(df, batch_id)`` function writing each micro-batch through the two-phase sink.

    ``sink.id`` is required (pass dotted names as ``**{"sink.id": "orders"}`` or ``sink_id=``); the
    micro-batch id becomes ``batch.id``, so a batch replayed after a crash is written exactly once.
    """
    raw = {_dotted(k): _option_text(v) for k, v in options.items()}
    if "batch.id" in {k.lower() for k in raw}:
        raise ConfigError(
            f"{FORMAT}: twopc_batch sets 'batch.id' from the micro-batch id; do not pass it", option="batch.id"
        )
    opts = TwoPhaseOptions.from_options(raw)
    if opts.sink_id is None:
        raise ConfigError(f"{FORMAT}: twopc_batch needs option 'sink.id' (unique per query)", option="sink.id")
    if opts.checkpoint is None:
        raise ConfigError(
            f"{FORMAT}: twopc_batch needs option 'checkpointLocation', the streaming query's own checkpoint "
            "location (the one given to writeStream), so that each micro-batch's decision is bound to the offsets "
            "Spark planned for it and a restored older checkpoint is refused instead of skipped",
            option="checkpointLocation",
        )

    def write_batch(df: Any, batch_id: int) -> None:
        df.sparkSession.dataSource.register(Postgres2pcDataSource)
        partitions = df.rdd.getNumPartitions()
        conn = connect(opts.connection, autocommit=True, application_name=f"spark-eos {FORMAT} check")
        try:
            check_max_prepared(conn, partitions, where=f" (sink {opts.sink_id!r})")
        finally:
            close_quietly(conn)
        df.write.format(FORMAT).options(**raw).option("batch.id", str(batch_id)).mode("append").save()

    write_batch.__name__ = f"twopc_batch[{opts.sink_id}]"
    return write_batch


_DOTTED = {
    "sink_id": "sink.id",
    "table_create": "table.create",
    "eos_schema": "eos.schema",
    "delete_column": "delete.column",
    "delete_tombstones": "delete.tombstones",
    "prepared_warn_age": "prepared.warn.age",
    "commit_attempts": "commit.attempts",
    "checkpoint_location": "checkpointLocation",
    "decisions_retain": "decisions.retain",
    "prepared_timeout": "prepared.timeout",
}


def _dotted(key: str) -> str:
    return _DOTTED.get(key, key)


def _option_text(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
