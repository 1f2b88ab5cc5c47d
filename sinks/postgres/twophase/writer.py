"""The task side of ``postgres-2pc``: meet the batch's decision, resolve stale gids, write the rows and
PREPARE (see the protocol in ``sinks.postgres.twophase``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pyspark.sql.types import StructType

from eos_core import faults
from eos_core.checkpoint import Lineage
from eos_core.errors import ConfigError, FatalError
from eos_core.spark_task import TaskIdentity
from eos_core.spark_task import task_identity as _task_context  # the protocol tests stand in for Spark here
from sinks.postgres import deadletter
from sinks.postgres.connection import RetryPolicy, close_quietly, connect, rollback_quietly
from sinks.postgres.copy import copy_arrow, create_staging, drop_staging
from sinks.postgres.merge import ORDINAL, KeyTracker, merge_staged
from sinks.postgres.options import (
    TableName,
    quote_ident,
)
from sinks.postgres.refusal import WHY, DataRefused, Screen, Unstaged, copy_value, describe
from sinks.postgres.staging import Replayable, prepared_rows
from sinks.postgres.twophase.decisions import (
    ProtocolTables,
    sink_lock,
)
from sinks.postgres.twophase.gid import Gid, new_nonce
from sinks.postgres.twophase.guards import (
    TAKE_BACK_CLASSES,
    TAKE_BACK_STATES,
    check_lineage,
    check_not_rewound,
    select_list,
    undecide,
)
from sinks.postgres.twophase.options import BATCH_IDENTITY, FORMAT, TwoPhaseOptions
from sinks.postgres.twophase.plan import (
    DIRECT,
    TwoPhaseMessage,
    TwoPhasePlan,
    build_plan,
    lineage_of,
    planned_lineage,
    stage_comment,
    task_table,
)
from sinks.postgres.twophase.recovery import resolve, rollback_prepared

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("sinks.postgres.twophase")


class TwoPhaseWriter:
    """Shared by the batch and the stream writer; holds only picklable state."""

    opts: TwoPhaseOptions
    plan: TwoPhasePlan
    nonce: str
    streaming: bool
    _keys: KeyTracker | None = None  # set in a task by _stage_batches (upsert mode): are its keys distinct?

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
        self.planned = planned_lineage(self.opts)

    def _lineage(self, batch_id: int) -> Lineage | None:
        return lineage_of(self.opts, self.planned, batch_id)

    # -- write (executor) ------------------------------------------------------------------

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:
        who: TaskIdentity = _task_context()
        partition, attempt_no, task_attempt = who.partition, who.attempt, who.task_attempt
        batch_id = self.opts.batch_id if self.opts.batch_id is not None else who.stream_batch
        if batch_id is None:
            raise FatalError(f"{FORMAT}: no batch id: Spark did not set streaming.sql.batchId for this task")
        identity = f"query:{who.query_id}" if who.query_id else BATCH_IDENTITY
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
                run_id=who.run_id,
                nonce=self.nonce,
                lineage=lineage.digest if lineage else None,
            )

        def ctl_connect() -> psycopg.Connection:
            return connect(copts, autocommit=True, application_name=f"spark-eos {FORMAT} task")

        retry = RetryPolicy.of(copts)
        ctl = retry.run(ctl_connect, f"{FORMAT} connect")
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

            rows = retry.run(once, f"{FORMAT} {gid}")
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

    def _stage_columns(self) -> list[tuple[str, str]]:
        """What a task stages: the plan's columns, and ``WHY`` when refused rows are diverted (a value
        Postgres cannot take as sent is staged with its refusal, for the diverting merge)."""
        columns = list(self.plan.stage_columns)
        if self.plan.divert is not None and all(n != WHY for n, _ in columns):
            columns.append((WHY, "text"))
        return columns

    def _screen(self, gid: Gid, *, direct: bool = False) -> Screen:
        """The check of every value before COPY (``refusal.Screen``): refused naming column and value, or
        staged with its refusal (errors.tolerance=all); ``direct``: a COPY into the table, which falls
        back to staging when a value must be diverted."""
        plan = self.plan
        where = f"{FORMAT} {plan.sink_id} into {plan.target} (batch {gid.batch}, partition {gid.partition})"
        on_found = "refuse" if plan.divert is None else "raise" if direct else "divert"
        version = plan.merge.version if plan.merge is not None else None
        return Screen(plan.columns, where=where, version=version, on_found=on_found)

    def _stage_batches(self, iterator: Iterator[pa.RecordBatch]) -> Replayable | None:
        """The task's rows, streamed into COPY as Spark yields them and re-iterable for a retried COPY
        (memory stays flat in the partition's size); None for a partition without rows."""
        plan = self.plan
        if plan.merge is not None:
            assert self.opts.upsert is not None
            self._keys = KeyTracker(plan.merge.key)
            prepared: Iterator[pa.RecordBatch] = prepared_rows(iterator, plan.merge, self.opts.upsert, self._keys)
        elif plan.divert is not None:  # an append diverting refused rows: each row carries its place
            prepared = _with_ordinals(iterator, [c.name for c in plan.columns])
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
                    rows = self._write_direct(cur, batches, gid)
                else:
                    table = task_table(self.plan.stage, text).sql
                    defs = ", ".join(f"{quote_ident(n)} {t}" for n, t in self.plan.stage_columns)
                    cur.execute(f"CREATE TABLE {table} ({defs})".encode())
                    cur.execute(
                        sql.SQL("COMMENT ON TABLE {} IS {}").format(
                            sql.SQL(table),
                            sql.Literal(f"{stage_comment(self.plan.sink_id)}: {text}"),
                        )
                    )
                    rows = copy_arrow(cur, table, self._stage_columns(), self._screen(gid)(batches))
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

    def _write_direct(self, cur: psycopg.Cursor, batches: Iterable[pa.RecordBatch], gid: Gid) -> int:
        """visibility=partition: the rows go into the table inside this (to be prepared) transaction;
        returns how many the task was given (the written ones and any refused, as visibility=batch counts
        them: ``sinks status`` shows the refused ones beside them).

        Refusals by the table surface here, before PREPARE and so before any decision (I2). With
        errors.tolerance=all the rows refused go to the dead-letter table in this transaction instead."""
        plan = self.plan
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(self.opts.lock_timeout * 1000))}ms",))
        # deferred constraints are checked by each statement here, where a refusal can be named or diverted;
        # at PREPARE they would fail the whole task, outside the search
        cur.execute(b"SET CONSTRAINTS ALL IMMEDIATE")
        try:
            if plan.copy_direct:
                if plan.divert is not None:
                    cur.execute(b"SAVEPOINT eos_copy")
                try:
                    return copy_arrow(
                        cur,
                        plan.target.sql,
                        [(c.name, c.pg_type) for c in plan.columns],
                        self._screen(gid, direct=True)(batches),
                        targets=[c.target for c in plan.columns],
                    )
                except Unstaged:  # a value the COPY cannot take, to be diverted: through staging below
                    cur.execute(b"ROLLBACK TO SAVEPOINT eos_copy")
                except psycopg.Error as exc:
                    if plan.divert is None or not deadletter.refusable(exc):
                        raise
                    cur.execute(b"ROLLBACK TO SAVEPOINT eos_copy")  # the refused rows are found below
            return self._write_staged(cur, batches, gid)
        except psycopg.Error as exc:
            self._explain_direct_failure(exc, batches)
            raise

    def _write_staged(self, cur: psycopg.Cursor, batches: Iterable[pa.RecordBatch], gid: Gid) -> int:
        """visibility=partition through a staging table of this transaction: widening, casts, the upsert
        merge, or refused rows to divert; returns the rows the task was given."""
        plan = self.plan
        # Widening, casts, the merge or refused rows: through a staging table of this transaction
        # only (Postgres refuses PREPARE after touching a temporary table, so an unlogged one,
        # dropped before PREPARE).
        columns = self._stage_columns()
        staging = create_staging(cur, TableName(self.opts.eos_schema, "x"), columns, temporary=False)
        rows = copy_arrow(cur, staging, columns, self._screen(gid)(batches))
        unique = self._keys is not None and self._keys.unique
        if plan.divert is not None:
            letters = deadletter.DeadLetters(
                self.opts.errors.table,  # type: ignore[arg-type]  # set whenever divert is
                plan.target,
                gid.batch,
                gid.partition,
                attempt=str(gid),
                sink_id=plan.sink_id,
            )
            where = f"{FORMAT} {plan.sink_id} into {plan.target} (batch {gid.batch}, partition {gid.partition})"
            errors = self.opts.errors
            deadletter.merge_diverting(
                cur,
                staging,
                plan.divert,
                rows,
                letters,
                unique=unique,
                limit=lambda n: errors.check(n, rows, where, partial=True),  # after each diversion
            )
        elif plan.merge is not None:
            merge_staged(cur, staging, plan.merge, unique=unique)
        else:
            targets = ", ".join(quote_ident(c.target) for c in plan.columns)
            cur.execute(f"INSERT INTO {plan.target.sql} ({targets}) SELECT {select_list(plan)} FROM {staging}".encode())
        drop_staging(cur, staging)
        return rows

    def _explain_direct_failure(self, exc: psycopg.Error, batches: Iterable[pa.RecordBatch]) -> None:
        """A failure of the direct write as the error a user can act on: a lock held past lock.timeout (a
        sibling's prepared transaction), or a value the table refuses (DataRefused, naming it); else nothing."""
        plan = self.plan
        state = exc.sqlstate or ""
        if state == "55P03":
            raise FatalError(
                f"{FORMAT} {plan.sink_id}: rows of {plan.target.sql} stayed locked for lock.timeout "
                f"({self.opts.lock_timeout:g}s) with visibility=partition. A sibling task of this batch holds the "
                "same key, or the same value of another unique column, in its prepared transaction (it lets go "
                "only when the batch commits; errors.tolerance cannot divert such a row): partition the "
                "DataFrame by that column (df.repartition(*key)) so each value is written by one task, or use "
                "visibility=batch; otherwise another session holds the rows",
                sqlstate=state,
            ) from exc
        if state.startswith(TAKE_BACK_CLASSES) or state in TAKE_BACK_STATES:
            names = {c.target if plan.copy_direct else c.name: c.name for c in plan.columns}
            sent = copy_value(exc, batches, names)
            raise DataRefused(
                f"{FORMAT} {plan.sink_id}: {describe(exc, target=plan.target, sent=sent)}. Nothing of the batch "
                "was written; "
                "fix the query (filter or repair the rows) or the table, and restart from the same checkpoint",
                sink_id=plan.sink_id,
                sqlstate=state,
            ) from exc


def _with_ordinals(batches: Iterable[pa.RecordBatch], names: list[str]) -> Iterator[pa.RecordBatch]:
    """The written columns and each row's place in the task (``ORDINAL``), batch by batch."""
    import numpy as np
    import pyarrow as pa

    ordinal = 0
    for batch in batches:
        if batch.num_rows:
            arrays = [*batch.select(names).columns, pa.array(np.arange(ordinal, ordinal + batch.num_rows))]
            ordinal += batch.num_rows
            yield pa.RecordBatch.from_arrays(arrays, names=[*names, ORDINAL])


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
