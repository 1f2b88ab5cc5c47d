"""The ``postgres-upsert`` writers: idempotent, version-guarded upserts and deletes.

Public API (from ``sinks.postgres``):

- ``PostgresUpsertDataSource`` (format ``postgres-upsert``, in ``sinks.postgres.datasources``): ``df.write``
  (batch) and ``df.writeStream`` (append and complete modes), through this module's writers.
- ``upsert_batch(**options)`` (``sinks.postgres.adapters``): a ``foreachBatch(df, batch_id)`` function for
  update mode (aggregations), which Python streaming sinks refuse.
- ``UpsertCommitMessage``: what each task reports (picklable).

What a task stages (the planner, the prepared rows, the replayable buffer) is ``staging``'s,
shared with the two-phase sink's upsert mode.

Each task, in ONE transaction: CREATE TEMP staging, binary COPY of its Arrow batches as Spark
yields them (a copy kept for a retry: memory up to 64 MiB, then a local file), merge (dedup unless
every key is distinct, INSERT ... ON CONFLICT ... WHERE version guard, deletes, tombstones), COMMIT.
When the first keys of the task are new (and no deletes, casts or rules are involved), the rows are
first COPYed straight into the table under a savepoint (``copy_new_keys``: one write per row); a key
present or repeated, or a refused value, rolls that back and the rows take the staged merge.
Retriable failures rerun the whole transaction with bounded backoff. A crash after COMMIT and
before Spark's commit log replays the batch, which the version guard (or plain key equality)
turns into a no-op: that is the exactly-once argument of this sink.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from eos_core import faults
from eos_core.spark_task import task_identity
from sinks.postgres import deadletter
from sinks.postgres.connection import RetryPolicy, close_quietly, connect, rollback_quietly
from sinks.postgres.copy import copy_arrow, create_staging
from sinks.postgres.formats import UPSERT
from sinks.postgres.merge import (
    KeyTracker,
    MergeCounts,
    MergePlan,
    merge_staged,
)
from sinks.postgres.options import UpsertOptions, quote_ident
from sinks.postgres.refusal import WHY, Screen, Unstaged
from sinks.postgres.staging import Replayable, UpsertPlanner, prepared_rows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "FAULT_POINTS",
    "FORMAT",
    "UpsertBatchWriter",
    "UpsertCommitMessage",
    "UpsertStreamWriter",
]

FAULT_POINTS = faults.Points(
    (
        "sink.before_write",  # a task before its first row
        "sink.after_write",  # a task's rows merged, before its commit
        "sink.after_commit",  # the driver's commit of the batch, before Spark's commits/n
    ),
    hold="sink.before_write",
)
"""The fault points ``postgres-upsert`` fires, in the order one batch meets them (``eos_core.faults``)."""

FORMAT = UPSERT
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpsertCommitMessage(WriterCommitMessage):
    """One task's outcome; its transaction is already committed when Spark receives this."""

    partition: int
    attempt: int
    batch_id: int | None
    staged: int
    upserted: int
    deleted: int
    tombstoned: int
    tries: int
    refused: int = 0  # rows diverted to errors.table (errors.tolerance=all)


class _UpsertWriterMixin:
    """The task side shared by the batch and the stream writer."""

    opts: UpsertOptions
    plan: MergePlan

    def _setup(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = UpsertOptions.from_options(dict(options))
        self.plan = UpsertPlanner(self.opts, schema).plan()

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> UpsertCommitMessage:
        who = task_identity()
        partition, attempt, batch_id = who.partition, who.attempt, who.stream_batch
        ctx = {"batch": batch_id, "partition": partition, "attempt": attempt}
        faults.point("sink.before_write", spec=self.opts.faults, **ctx)
        keys = KeyTracker(self.plan.key)
        prepared = prepared_rows(iterator, self.plan, self.opts, keys)
        first = next(prepared, None)  # a partition without rows neither connects nor writes
        batches = Replayable(itertools.chain((first,), prepared)) if first is not None else None
        tries = 0

        def once() -> MergeCounts:
            nonlocal tries
            tries += 1
            if batches is None:
                return MergeCounts()
            return write_transaction(
                self.opts,
                self.plan,
                batches,
                fault_context=ctx,
                keys=keys,
                partition=partition,
                batch_id=batch_id,
                probe=first,
            )

        counts = RetryPolicy.of(self.opts.connection).run(
            once, f"{FORMAT} into {self.plan.target} (partition {partition}, batch {batch_id})"
        )
        return UpsertCommitMessage(
            partition=partition,
            attempt=attempt,
            batch_id=batch_id,
            staged=counts.staged,
            upserted=counts.upserted,
            deleted=counts.deleted,
            tombstoned=counts.tombstoned,
            tries=tries,
            refused=counts.refused,
        )


def write_transaction(
    opts: UpsertOptions,
    plan: MergePlan,
    batches: Iterable[pa.RecordBatch],
    *,
    fault_context: Mapping[str, Any] | None = None,
    keys: KeyTracker | None = None,
    partition: int = 0,
    batch_id: int | None = None,
    probe: pa.RecordBatch | None = None,
) -> MergeCounts:
    """One try: connect, stage (COPY as the batches come), merge, commit. Any failure rolls back and
    propagates unchanged; ``batches`` is iterated once per try (a ``Replayable`` for retries).
    ``keys``, fed by ``prepared_rows``, lets the merge skip its dedup when every key is distinct.
    With ``errors.tolerance=all`` refused rows go to ``errors.table`` in this transaction.

    ``probe`` (the task's first prepared batch): when none of its keys is in the table yet, the rows
    are first COPYed straight into the table (``copy_new_keys``: one write per row); a key already
    there, a key twice in the task, or any value the table refuses rolls that back to a savepoint
    and the rows take the staged merge below, which decides, dedups and diverts as always."""
    divert = opts.errors.table is not None
    columns = plan.staging_columns() + ([(WHY, "text")] if divert else [])
    where = f"{FORMAT} into {plan.target} (partition {partition})"
    # values Postgres cannot take as sent (NUL, NaN in JSON, ...) or would change (a name cut, a NaN
    # version, ...): refused here, naming column and value, or staged with their refusal to be diverted
    screen = Screen(plan.columns, where=where, version=plan.version, on_found="divert" if divert else "refuse")
    conn = connect(opts.connection, application_name=f"spark-eos {FORMAT}")
    try:
        with conn.cursor() as cur:
            cur.execute(b"SET CONSTRAINTS ALL IMMEDIATE")  # deferred ones are checked by the merge, not COMMIT
            if probe is not None and direct_copy(cur, plan, probe):
                direct = Screen(
                    plan.columns, where=where, version=plan.version, on_found="raise" if divert else "refuse"
                )
                rows = copy_new_keys(cur, plan, direct, batches)
                if rows is not None:
                    faults.point("sink.after_write", spec=opts.faults, **dict(fault_context or {}))
                    conn.commit()
                    return MergeCounts(staged=rows, upserted=rows)
            staging = create_staging(cur, plan.target, columns)
            staged = copy_arrow(cur, staging, columns, screen(batches))
            unique = keys is not None and keys.unique
            if opts.errors.table is None:
                counts = merge_staged(cur, staging, plan, staged, unique=unique)
            else:
                letters = deadletter.DeadLetters(opts.errors.table, plan.target, batch_id, partition)
                counts = deadletter.merge_diverting(
                    cur,
                    staging,
                    plan,
                    staged,
                    letters,
                    unique=unique,
                    limit=lambda n: opts.errors.check(n, staged, where, partial=True),  # after each diversion
                )
        faults.point("sink.after_write", spec=opts.faults, **dict(fault_context or {}))
        conn.commit()
        return counts
    except BaseException:
        rollback_quietly(conn)
        raise
    finally:
        close_quietly(conn)


PROBE_KEYS = 10_000
"""Keys of the first batch looked up before a direct COPY (one index probe each, about 10 ms)."""


def direct_copy(cur: psycopg.Cursor, plan: MergePlan, probe: pa.RecordBatch) -> bool:
    """Whether to try ``copy_new_keys``: an upsert without deletes whose staged columns are the table's
    binary types (no widening, no cast), into a table without rules (COPY ignores them), none of
    ``probe``'s first keys present (one key column; with several, an empty table)."""
    from sinks.postgres.twophase.plan import _same_binary  # the same test postgres-2pc's direct COPY makes

    if plan.deletes or not plan.key or not all(_same_binary(c) for c in plan.columns):
        return False
    rules = cur.execute("SELECT relhasrules FROM pg_class WHERE oid = %s::regclass", (plan.target.sql,)).fetchone()
    if rules is None or rules[0]:
        return False
    if len(plan.key) == 1:
        key = plan.column(plan.key[0])
        values = probe.column(probe.schema.get_field_index(key.name)).slice(0, PROBE_KEYS).to_pylist()
        found = cur.execute(
            f"SELECT EXISTS (SELECT 1 FROM {plan.target.sql} WHERE {quote_ident(key.target)} = ANY(%s))",
            (values,),
        ).fetchone()
    else:
        found = cur.execute(f"SELECT EXISTS (SELECT 1 FROM {plan.target.sql})").fetchone()
    return found is not None and not found[0]


def copy_new_keys(
    cur: psycopg.Cursor, plan: MergePlan, screen: Screen, batches: Iterable[pa.RecordBatch]
) -> int | None:
    """COPY the rows straight into the target (their keys new: inserting them is what the merge would
    do); the row count, or None when the COPY was rolled back to its savepoint (a key present or
    repeated, a refused value): then the caller merges from staging as usual."""
    cur.execute(b"SAVEPOINT eos_direct")
    try:
        rows = copy_arrow(
            cur,
            plan.target.sql,
            [(c.name, c.pg_type) for c in plan.columns],
            screen(batches),
            targets=[c.target for c in plan.columns],
        )
    except Unstaged:  # a value to divert (errors.tolerance=all): the staged merge diverts it
        cur.execute(b"ROLLBACK TO SAVEPOINT eos_direct")
        return None
    except psycopg.Error as exc:
        if not deadletter.refusable(exc):  # a lost connection, a timeout: the retry runs the transaction again
            raise
        cur.execute(b"ROLLBACK TO SAVEPOINT eos_direct")
        return None
    cur.execute(b"RELEASE SAVEPOINT eos_direct")
    return rows


def _log_commit(messages: Iterable[WriterCommitMessage | None], batch_id: int | None, table: object) -> MergeCounts:
    total = MergeCounts()
    for m in messages:
        if isinstance(m, UpsertCommitMessage):
            total = total + MergeCounts(m.staged, m.upserted, m.deleted, m.tombstoned, m.refused)
    log.info(
        "%s %s batch %s: %d staged, %d upserted, %d deleted, %d tombstoned, %d refused",
        FORMAT,
        table,
        batch_id,
        total.staged,
        total.upserted,
        total.deleted,
        total.tombstoned,
        total.refused,
    )
    return total


class UpsertBatchWriter(_UpsertWriterMixin, DataSourceArrowWriter):
    """``df.write.format("postgres-upsert")``: each task commits its own transaction."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self._setup(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> UpsertCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(messages, None, self.plan.target)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Tasks that finished are committed; a rerun of the job is a no-op for them (idempotent).
        log.warning("%s %s: job aborted; finished tasks stay committed, rerunning is safe", FORMAT, self.plan.target)


class UpsertStreamWriter(_UpsertWriterMixin, DataSourceStreamArrowWriter):
    """``df.writeStream.format("postgres-upsert")`` (append/complete): replays are no-ops."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        # Also runs in the separate driver process that calls commit/abort: the checks are
        # read-only (or idempotent CREATE ... IF NOT EXISTS), so running them again is harmless.
        self._setup(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> UpsertCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(messages, batchId, self.plan.target)
        # The window the sink's idempotence covers: every task committed, Spark's commits/n not yet.
        faults.point("sink.after_commit", spec=self.opts.faults, batch=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "%s %s batch %s aborted; its replay is a no-op for tasks that committed", FORMAT, self.plan.target, batchId
        )
