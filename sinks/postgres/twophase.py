"""The ``postgres-2pc`` sink: tasks PREPARE their rows, the driver commits them with the batch.

Protocol (README "two-phase sink" has the diagram; DESIGN §6 the reasoning):

- task ``write`` of batch n, partition p: connect; refuse if another query owns the sink id; if
  batch n is decided, write nothing (a skip message). Otherwise, under the sink's advisory lock,
  resolve stale prepared gids (roll forward those a decision names, roll back the rest except the
  sibling tasks of this batch attempt); then in one transaction COPY the rows into the sink's
  staging table (tagged with the gid) plus a marker row in ``sink_parts``, and
  ``PREPARE TRANSACTION 'eos:<sink>:<n>:<p>:<nonce>:<task attempt>'``.
- driver ``commit(messages, n)``: under the lock, if no decision exists, check that every gid is
  still prepared and insert the decision (also claiming the sink for this query) in its own
  transaction; then COMMIT PREPARED each gid (a missing one proven by its marker), then publish:
  ONE transaction moves the batch's staged rows into the table (append: INSERT; upsert: the
  version-guarded merge; complete mode: replace) and marks the decision published, so readers
  see all of a batch or none of it. Then roll back stray gids. Every step is idempotent.
- driver ``abort(messages, n)``: roll back the batch's prepared gids unless a decision names them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
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
from connectors.errors import ConfigError, FatalError, RetriableError
from connectors.options import REQUIRED, Option, OptionSet
from sinks.postgres.connection import close_quietly, connect, ddl_lock, retrying, rollback_quietly
from sinks.postgres.copy import copy_arrow
from sinks.postgres.decisions import (
    DEFAULT_SCHEMA,
    ProtocolTables,
    check_max_prepared,
    list_prepared,
    sink_lock,
)
from sinks.postgres.gid import Gid, check_sink_id, new_nonce
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
from sinks.postgres.recovery import commit_prepared, resolve, warn_old_prepared
from sinks.postgres.types import Column, check_table
from sinks.postgres.upsert import UpsertPlanner, prepare_batches

__all__ = [
    "FORMAT",
    "TWOPC_OPTIONS",
    "Committer",
    "Postgres2pcDataSource",
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
    ignored=("path", "checkpointLocation", "queryName"),  # Spark passes the writer's own options along
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
        defs = ", ".join(f"{quote_ident(n)} {t}" for n, t in stage_columns)
        with ddl_lock(conn):
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {stage.sql} ({defs}, "  # type: ignore[arg-type]
                f"{_TAG_GID} text NOT NULL DEFAULT current_setting('eos.gid'), "
                f"{_TAG_PART} int NOT NULL DEFAULT current_setting('eos.part')::int)"
            )
        if merge is not None:
            ensure_tombstones(conn, merge)
    finally:
        close_quietly(conn)
    plan = TwoPhasePlan(opts.sink_id, opts.table, columns, stage, stage_columns, merge, replace)
    _SETUP_CACHE[key] = plan
    return plan


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
        # The constructor also runs in the driver process that calls commit(): only checks and
        # CREATE ... IF NOT EXISTS here, never a rollback (it would hit the batch being committed).
        self.plan = build_plan(self.opts, schema, replace=overwrite and streaming)
        # One nonce per writer built by the driver: every task of this batch attempt shares it, a
        # replay after a crash builds a new writer and gets a new one (verified: Spark builds the
        # stream writer once per micro-batch and pickles it to the tasks).
        self.nonce = new_nonce()

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
        tables = ProtocolTables(self.opts.eos_schema)
        copts = self.opts.connection

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
            if tables.decision(ctl, sink_id, batch_id) is not None:
                log.info(
                    "%s %s: batch %d already decided; partition %d writes nothing", FORMAT, sink_id, batch_id, partition
                )
                return TwoPhaseMessage(sink_id, batch_id, partition, attempt_no, None, 0, True, identity, run_id)
            # Recovery before the first write: stale prepared gids hold locks (and slots) that this
            # write could wait on forever. Streaming queries own every batch of the sink; batch jobs
            # with their own batch ids only touch their batch (another job may be mid-flight).
            resolve(
                ctl,
                tables,
                sink_id,
                keep_nonce=self.nonce,
                own=gid,
                only_batch=None if identity != BATCH_IDENTITY else batch_id,
            )
            batches, rows = self._stage_batches(iterator)
            if rows == 0:
                return TwoPhaseMessage(sink_id, batch_id, partition, attempt_no, None, 0, False, identity, run_id)

            def once() -> None:
                self._prepare(tables, gid, batches, rows, fctx)

            retrying(
                once,
                attempts=copts.retry_attempts,
                base_delay=copts.retry_backoff,
                max_delay=copts.retry_max_backoff,
                what=f"{FORMAT} {gid}",
            )
        finally:
            close_quietly(ctl)
        faults.point("sink.after_prepare", spec=self.opts.faults, **fctx)
        return TwoPhaseMessage(sink_id, batch_id, partition, attempt_no, str(gid), rows, False, identity, run_id)

    def _stage_batches(self, iterator: Iterator[pa.RecordBatch]) -> tuple[list[pa.RecordBatch], int]:
        plan = self.plan
        if plan.merge is not None:
            assert self.opts.upsert is not None
            return prepare_batches(iterator, plan.merge, self.opts.upsert)
        names = [c.name for c in plan.columns]
        out, rows = [], 0
        for batch in iterator:
            if batch.num_rows:
                out.append(batch.select(names))
                rows += batch.num_rows
        return out, rows

    def _prepare(
        self,
        tables: ProtocolTables,
        gid: Gid,
        batches: list[pa.RecordBatch],
        rows: int,
        fctx: Mapping[str, Any],
    ) -> None:
        text = str(gid)
        conn = connect(self.opts.connection, application_name=f"spark-eos {FORMAT} task")
        try:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (text,)).fetchone():
                conn.rollback()
                return  # an earlier try prepared it and only the reply was lost
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT set_config('eos.gid', %s, true), set_config('eos.part', %s, true)",
                    (text, str(gid.partition)),
                )
                copy_arrow(cur, self.plan.stage.sql, self.plan.stage_columns, batches)
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

    # -- commit / abort (driver, separate process, fresh writer) ---------------------------

    def _committer(self) -> Committer:
        return Committer(self.opts, self.plan, streaming_owner=self.streaming)


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


class Committer:
    """The driver side of one batch: decide, COMMIT PREPARED, publish, clean up; or abort."""

    def __init__(self, opts: TwoPhaseOptions, plan: TwoPhasePlan, *, streaming_owner: bool) -> None:
        self.opts = opts
        self.plan = plan
        self.tables = ProtocolTables(opts.eos_schema)
        self.streaming_owner = streaming_owner
        self.timings: dict[str, float] = {}

    def _connect(self) -> psycopg.Connection:
        return connect(self.opts.connection, autocommit=True, application_name=f"spark-eos {FORMAT} commit")

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
        # No task at all (an empty input with zero partitions): nothing to fence, and stray cleanup
        # stays within this batch since we cannot tell whether a streaming query owns the sink.
        identity = identities.pop() if identities else None
        owns_all = identity is not None and identity != BATCH_IDENTITY
        run_id = next((m.run_id for m in msgs if m.run_id), None)
        fctx = {"batch": batch_id}
        faults.point("sink.commit.before_decision", spec=self.opts.faults, **fctx)
        conn = retrying(
            self._connect,
            attempts=self.opts.connection.retry_attempts,
            base_delay=self.opts.connection.retry_backoff,
            max_delay=self.opts.connection.retry_max_backoff,
            what=f"{FORMAT} commit connect",
        )
        try:
            with sink_lock(conn, sink_id):
                decision = self.tables.decision(conn, sink_id, batch_id)
                if decision is None:
                    if any(m.skipped for m in msgs):
                        raise FatalError(
                            f"{FORMAT} {sink_id}: batch {batch_id}: tasks saw a decision that is gone now; the "
                            f"decision log ({self.opts.eos_schema}.sink_batches) was changed by hand"
                        )
                    gids = sorted(m.gid for m in msgs if m.gid)
                    prepared = {str(p.gid) for p in list_prepared(conn, sink_id)}
                    missing = [g for g in gids if g not in prepared]
                    if missing:
                        # Decide only what is still prepared: a gid rolled back by recovery (or a
                        # restarted server without it) must never be named by a decision.
                        raise RetriableError(
                            f"{FORMAT} {sink_id}: batch {batch_id}: prepared transaction(s) {missing} vanished before "
                            "the decision (rolled back by a concurrent recovery?); nothing was committed and the "
                            "batch will be replayed on restart"
                        )
                    with conn.transaction():
                        if identity is not None:
                            self.tables.check_owner(conn, sink_id, identity, claim=True, run_id=run_id)
                        self.tables.insert_decision(conn, sink_id, batch_id, gids, sum(m.rows for m in msgs), identity)
                    decided = tuple(gids)
                else:
                    decided = decision.gids
            self.timings["decide"] = time.perf_counter() - t0
            faults.point("sink.commit.after_decision", spec=self.opts.faults, **fctx)
            for k, gid in enumerate(decided, 1):
                _, conn2 = commit_prepared(
                    self._connect, self.tables, gid, attempts=self.opts.commit_attempts, conn=conn
                )
                conn = conn2 if conn2 is not None else conn
                faults.point("sink.commit.after_k", spec=self.opts.faults, k=k, **fctx)
            self.timings["commit_prepared"] = time.perf_counter() - t0
            conn = self._publish(conn, batch_id, decided)
            self.timings["publish"] = time.perf_counter() - t0
            # Strays: attempts that lost (task retries, zombies, crashed runs) of this batch and,
            # for a streaming query that owns every batch of the sink, of older batches.
            resolve(
                conn,
                self.tables,
                sink_id,
                only_batch=None if owns_all else batch_id,
                upto_batch=batch_id if owns_all else None,
            )
            if owns_all:
                self.tables.prune_markers(conn, sink_id, batch_id - 100)
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

    def _publish(self, conn: psycopg.Connection, batch_id: int, gids: tuple[str, ...]) -> psycopg.Connection:
        """Move the batch's staged rows into the table in ONE transaction; idempotent via published_at."""
        plan = self.plan

        def once() -> None:
            nonlocal conn
            if conn.closed or conn.broken:
                conn = self._connect()
            with conn.transaction():
                row = conn.execute(
                    sql.SQL("SELECT published_at FROM {} WHERE sink_id = %s AND batch_id = %s FOR UPDATE").format(
                        self.tables.batches
                    ),
                    (plan.sink_id, batch_id),
                ).fetchone()
                if row is None:
                    raise FatalError(f"{FORMAT} {plan.sink_id}: batch {batch_id}: decision vanished before publishing")
                if row[0] is not None:
                    return
                gid_list = sql.Literal(list(gids))
                with conn.cursor() as cur:
                    if plan.replace:
                        cur.execute(f"DELETE FROM {plan.target.sql}".encode())
                    if plan.merge is not None:
                        cols = ", ".join(quote_ident(n) for n, _ in plan.stage_columns if n != ORDINAL)
                        # Input order across partitions: partition first, then the task's ordinal.
                        view = (
                            f"CREATE TEMP VIEW eos_publish AS SELECT {cols}, "
                            f"(({_TAG_PART}::bigint << 40) + {quote_ident(ORDINAL)}) AS {quote_ident(ORDINAL)} "
                            f"FROM {plan.stage.sql} WHERE {_TAG_GID} = ANY("
                        )
                        cur.execute(sql.SQL(view) + gid_list + sql.SQL(")"))  # type: ignore[arg-type]
                        merge_staged(cur, "pg_temp.eos_publish", plan.merge)
                        cur.execute(b"DROP VIEW pg_temp.eos_publish")
                    else:
                        targets = ", ".join(quote_ident(c.target) for c in plan.columns)
                        exprs = ", ".join(
                            f"CAST({quote_ident(c.name)} AS {c.cast})" if c.cast else quote_ident(c.name)
                            for c in plan.columns
                        )
                        cur.execute(
                            sql.SQL(
                                f"INSERT INTO {plan.target.sql} ({targets}) SELECT {exprs} FROM {plan.stage.sql} "  # type: ignore[arg-type]
                                f"WHERE {_TAG_GID} = ANY("
                            )
                            + gid_list
                            + sql.SQL(")")
                        )
                    cur.execute(
                        sql.SQL(f"DELETE FROM {plan.stage.sql} WHERE {_TAG_GID} = ANY(") + gid_list + sql.SQL(")")
                    )  # type: ignore[arg-type]
                self.tables.mark_published(conn, plan.sink_id, batch_id)

        retrying(
            once,
            attempts=self.opts.connection.retry_attempts,
            base_delay=self.opts.connection.retry_backoff,
            max_delay=self.opts.connection.retry_max_backoff,
            what=f"{FORMAT} publish batch {batch_id}",
        )
        return conn

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
