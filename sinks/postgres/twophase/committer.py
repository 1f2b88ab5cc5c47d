"""The driver side of ``postgres-2pc``: decide, COMMIT PREPARED, publish, abort (``Committer``)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import (
    WriterCommitMessage,
)

from eos_core import faults
from eos_core.checkpoint import Lineage, display
from eos_core.errors import FatalError, RetriableError
from sinks.postgres.connection import RetryPolicy, close_quietly, connect
from sinks.postgres.deadletter import PART_SHIFT, DeadLetters, merge_diverting
from sinks.postgres.merge import ORDINAL, merge_staged
from sinks.postgres.options import (
    TableName,
    quote_ident,
)
from sinks.postgres.refusal import DataRefused, describe
from sinks.postgres.twophase.decisions import (
    Decision,
    ProtocolTables,
    list_prepared,
    sink_lock,
)
from sinks.postgres.twophase.guards import (
    TAKE_BACK_CLASSES,
    TAKE_BACK_STATES,
    LineageMismatch,
    Superseded,
    check_lineage,
    check_not_rewound,
    select_list,
    stage_of,
    undecide,
)
from sinks.postgres.twophase.options import BATCH_IDENTITY, FORMAT, TwoPhaseOptions
from sinks.postgres.twophase.plan import (
    DIRECT,
    STAGE_COMMENT,
    TAG_PART,
    TwoPhaseMessage,
    TwoPhasePlan,
    discard_staged,
    lineage_of,
    stage_owner,
    staged_present,
    staged_relation,
)
from sinks.postgres.twophase.recovery import commit_prepared, resolve, warn_old_prepared

log = logging.getLogger("sinks.postgres.twophase")


class Committer:
    """The driver side of one batch: decide, COMMIT PREPARED, publish, clean up; or abort."""

    def __init__(self, opts: TwoPhaseOptions, plan: TwoPhasePlan, nonce: str, planned: Lineage | None) -> None:
        """``opts`` and ``plan`` as the driver built them for the batch, ``nonce`` that writer's (a
        batch whose tasks all skipped carries none), ``planned`` its lineage (``plan.planned_lineage``)."""
        self.opts = opts
        self.plan = plan
        self.nonce = nonce
        self.planned = planned
        self.tables = ProtocolTables(opts.eos_schema)
        self.timings: dict[str, float] = {}

    def _connect(self) -> psycopg.Connection:
        return connect(self.opts.connection, autocommit=True, application_name=f"spark-eos {FORMAT} commit")

    def _retrying(self, fn: Callable[[], Any], what: str) -> Any:
        return RetryPolicy.of(self.opts.connection).run(fn, what)

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        """notifyCheckpointComplete(n): decide (or meet the decision), COMMIT PREPARED each gid,
        publish, clean up strays; every step safe to repeat after a crash anywhere in it."""
        t0 = time.perf_counter()
        sink_id = self.plan.sink_id
        msgs, identity, lineage = self._checked_messages(messages, batch_id)
        owns_all = identity is not None and identity != BATCH_IDENTITY
        fctx = {"batch": batch_id}
        faults.point("sink.commit.before_decision", spec=self.opts.faults, **fctx)
        conn = self._retrying(self._connect, f"{FORMAT} commit connect")
        try:
            with sink_lock(conn, sink_id):
                decision = self.tables.decision(conn, sink_id, batch_id)
                if decision is None:
                    run_id = next((m.run_id for m in msgs if m.run_id), None)
                    nonce = next((m.nonce for m in msgs if m.nonce), self.nonce)
                    decided = self._decide(conn, batch_id, msgs, identity, run_id, nonce, lineage)
                    stage = self.plan.stage_token
                else:
                    stage = self._meet_decision(conn, decision, batch_id, lineage)
                    decided = decision.gids
            self.timings["decide"] = time.perf_counter() - t0
            faults.point("sink.commit.after_decision", spec=self.opts.faults, **fctx)
            # A published decision's gids are all finished (committed before the publish, or their loss
            # accepted by `sinks resolve-lost --finish`): nothing to commit, the replay only cleans up.
            if decision is None or not decision.published:
                conn = self._commit_each(conn, batch_id, decided)
            self.timings["commit_prepared"] = time.perf_counter() - t0
            if stage == DIRECT:  # the rows became visible with their COMMIT PREPARED
                self.tables.mark_published(conn, sink_id, batch_id)
            else:
                conn = self._publish(conn, batch_id, decided, stage)
            self.timings["publish"] = time.perf_counter() - t0
            self._clean_up(conn, batch_id, owns_all)
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

    def _checked_messages(
        self, messages: list[WriterCommitMessage | None], batch_id: int
    ) -> tuple[list[TwoPhaseMessage], str | None, Lineage | None]:
        """The tasks' messages, all of this sink, batch, writer and lineage: (messages, the writer's
        identity or None when no task ran, the batch's lineage); a FatalError for anything else."""
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
        lineage = lineage_of(self.opts, self.planned, batch_id)
        seen = {m.lineage for m in msgs if m.lineage} - {lineage.digest if lineage else None}
        if seen:
            raise FatalError(
                f"{FORMAT} {sink_id}: batch {batch_id}: tasks saw offsets/{batch_id} as {sorted(seen)}, the driver as "
                f"{lineage}; the checkpoint changed while the batch ran"
            )
        # No task at all (an empty input with zero partitions): nothing to fence, and stray cleanup
        # stays within this batch since we cannot tell whether a streaming query owns the sink.
        return msgs, (identities.pop() if identities else None), lineage

    def _meet_decision(
        self, conn: psycopg.Connection, decision: Decision, batch_id: int, lineage: Lineage | None
    ) -> str:
        """A replay meets batch ``batch_id``'s decision: refuse another lineage (I1), take back a batch
        staged under the query's previous columns; else the stage its rows are in (I3)."""
        sink_id = self.plan.sink_id
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
        return stage

    def _commit_each(self, conn: psycopg.Connection, batch_id: int, decided: tuple[str, ...]) -> psycopg.Connection:
        """COMMIT PREPARED each decided gid (one already committed is proven by its marker)."""
        for k, gid in enumerate(decided, 1):
            try:
                _, conn2 = commit_prepared(
                    self._connect, self.tables, gid, attempts=self.opts.commit_attempts, conn=conn
                )
            except FatalError:
                self._check_still_ours(batch_id, decided)  # taken back by another attempt: say so
                raise
            conn = conn2 if conn2 is not None else conn
            faults.point("sink.commit.after_k", spec=self.opts.faults, k=k, batch=batch_id)
        return conn

    def _clean_up(self, conn: psycopg.Connection, batch_id: int, owns_all: bool) -> None:
        """Strays: attempts that lost (task retries, speculative twins, zombies, crashed runs) of this
        batch and, for a streaming query that owns every batch of the sink, of older batches; old
        markers and decisions; this sink's empty staging tables; a warning for old prepared gids."""
        sink_id = self.plan.sink_id
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
                    merge = plan.divert or plan.merge
                    if staged is not None and merge is not None:
                        cols = ", ".join(quote_ident(n) for n, _ in plan.stage_columns if n != ORDINAL)
                        # Input order across partitions: partition first, then the task's ordinal.
                        cur.execute(
                            f"CREATE TEMP VIEW eos_publish AS SELECT {cols}, "
                            f"(({TAG_PART}::bigint << {PART_SHIFT}) + {quote_ident(ORDINAL)}) AS "
                            f"{quote_ident(ORDINAL)} FROM {staged} s".encode()
                        )
                        if plan.divert is not None:
                            self._publish_diverting(cur, decision)
                        else:
                            merge_staged(cur, "pg_temp.eos_publish", merge)
                        cur.execute(b"DROP VIEW pg_temp.eos_publish")
                    elif staged is not None:
                        targets = ", ".join(quote_ident(c.target) for c in plan.columns)
                        cur.execute(
                            f"INSERT INTO {plan.target.sql} ({targets}) SELECT {select_list(plan)} FROM {staged} s".encode()
                        )
                    discard_staged(conn, stage, gids)  # one DROP TABLE per task, not a DELETE per row
                self.tables.mark_published(conn, plan.sink_id, batch_id)

        try:
            self._retrying(once, f"{FORMAT} publish batch {batch_id}")
        except (RetriableError, Superseded):
            raise  # out of reach (the decision stays, the next run publishes), or not ours any more
        except TooManyRefused as exc:
            raise self._refused(batch_id, gids, stage, exc) from exc
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
            state = getattr(cause, "sqlstate", None) or ""
            if not (state.startswith(TAKE_BACK_CLASSES) or state in TAKE_BACK_STATES):
                if state == "42P01":  # undefined table: the target, or the batch's staged rows?
                    self._check_staged(batch_id, gids, stage)
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

    def _check_staged(self, batch_id: int, gids: tuple[str, ...], stage: str) -> None:
        """A decided batch whose staged rows are gone (a staging table dropped by hand) can never be
        published: say so, and how to get past it, instead of "restart the query" forever."""
        conn = self._retrying(self._connect, f"{FORMAT} publish check")
        try:
            present = staged_present(conn, stage, gids)
        finally:
            close_quietly(conn)
        lost = sorted(g for g, there in present.items() if not there)
        if not lost:
            return
        sink_id = self.plan.sink_id
        raise FatalError(
            f"{FORMAT} {sink_id}: batch {batch_id} is decided but the staged rows of {len(lost)} of its "
            f"{len(gids)} transactions are gone (their staging tables in schema {self.opts.eos_schema!r} were "
            f"dropped: {', '.join(lost[:3])}{' ...' if len(lost) > 3 else ''}), so it can never be published. "
            f"Nothing of it is visible. Take it back (the query then writes the batch anew from its source): "
            f"`spark-eos sinks resolve-lost --sink-id {sink_id} --eos-schema {self.opts.eos_schema} --batch "
            f"{batch_id} --take-back --yes`; or accept the loss: `... --finish --yes` (docs/lifecycle.md)",
            sink_id=sink_id,
            batch_id=batch_id,
        )

    def _publish_diverting(self, cur: psycopg.Cursor, decision: Decision) -> None:
        """errors.tolerance=all: publish ``pg_temp.eos_publish``; rows the target refuses go to the
        dead-letter table in this (the publish's) transaction. More than errors.max: TooManyRefused."""
        plan, errors = self.plan, self.opts.errors
        assert plan.divert is not None and errors.table is not None
        letters = DeadLetters(
            errors.table,
            plan.target,
            decision.batch_id,
            None,
            attempt=f"publish:{decision.nonce}",
            sink_id=plan.sink_id,
        )
        where = f"batch {decision.batch_id} into {plan.target}"

        def too_many(refused: int) -> None:  # checked after each diversion: the search stops at the limit
            try:
                errors.check(refused, decision.rows, where, unit="batch", partial=True)
            except FatalError as exc:
                raise TooManyRefused(str(exc), option="errors.max") from None

        counts = merge_diverting(
            cur, "pg_temp.eos_publish", plan.divert, decision.rows, letters, materialize=True, limit=too_many
        )
        if counts.refused:
            log.warning(
                "%s %s: batch %d: the target refused %d of %d rows; they are in %s",
                FORMAT,
                plan.sink_id,
                decision.batch_id,
                counts.refused,
                decision.rows,
                errors.table,
            )

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
                staged=sql.SQL(f"{staged_relation(stage, gids) or '(SELECT 1 WHERE false)'} s"),
                where=sql.SQL("true"),
            )
        elif isinstance(cause, TooManyRefused):
            what = str(cause).removesuffix(".")
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


class TooManyRefused(FatalError):
    """A publish diverted more rows than errors.max allows: the batch is taken back, nothing visible."""


def drop_empty_stages(conn: psycopg.Connection, tables: ProtocolTables, sink_id: str) -> list[str]:
    """Bounded growth: drop the sink's staging tables that no unpublished decision needs: per-task
    tables left by an attempt that was taken over (a zombie's late COMMIT PREPARED), and shared
    tables of spark-eos 0.1 once empty. A table still in use is skipped, never waited on."""
    found = conn.execute(
        "SELECT c.relname, d.description FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_description d ON d.objoid = c.oid AND d.objsubid = 0 AND d.classoid = 'pg_class'::regclass "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND starts_with(d.description, %s)",
        (tables.schema, STAGE_COMMENT),
    ).fetchall()
    rows = []  # this sink's tables only: the exact sink id parsed from the comment, never a prefix of it
    for relname, description in found:
        owner = stage_owner(str(description))
        if owner is not None and owner[0] == sink_id:
            rows.append((relname, owner[1]))
    if not rows:
        return []
    pending = conn.execute(
        sql.SQL("SELECT stage, gids FROM {} WHERE sink_id = %s AND published_at IS NULL").format(tables.batches),
        (sink_id,),
    ).fetchall()
    needed_gids = {g for _, gids in pending for g in gids}
    needed_tables = {str(stage) for stage, _ in pending}
    dropped = []
    for relname, gid in rows:
        name = TableName(tables.schema, str(relname)).sql  # as decisions store it
        if (gid is not None and gid in needed_gids) or (gid is None and name in needed_tables):
            continue
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '200ms'")
                if gid is None and conn.execute(f"SELECT 1 FROM {name} LIMIT 1".encode()).fetchone() is not None:
                    continue  # a shared table of 0.1 with rows of an attempt still prepared
                conn.execute(f"DROP TABLE {name}".encode())
                dropped.append(name)
        except psycopg.Error as exc:
            log.info("%s %s: staging table %s not dropped now: %s", FORMAT, sink_id, name, exc)
    return dropped


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
