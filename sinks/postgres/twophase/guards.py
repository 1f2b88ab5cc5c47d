"""The guards of invariants I1 and I3 (see ``sinks.postgres.twophase``), shared by the task writer and
the committer: a decision met with another lineage, a rewound checkpoint, a batch taken back, a
superseded twin, and which SQLSTATEs take a batch back."""

from __future__ import annotations

import logging

import psycopg

from eos_core.checkpoint import Lineage, batch_lineage, display
from eos_core.errors import FatalError
from sinks.postgres.options import (
    quote_ident,
)
from sinks.postgres.refusal import REFUSED_CLASSES
from sinks.postgres.twophase.decisions import (
    Decision,
    ProtocolTables,
)
from sinks.postgres.twophase.options import FORMAT, TwoPhaseOptions
from sinks.postgres.twophase.plan import (
    DIRECT,
    STAGE_SQL,
    TASKS,
    TwoPhasePlan,
    discard_staged,
)

log = logging.getLogger("sinks.postgres.twophase")


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
    """I1: with later batches decided, an undecided batch n cannot belong to the sink's lineage; and a
    streaming query's batch n comes right after the sink's last decision (``check_none_lost``)."""
    if lineage is None:
        return  # batch jobs without a checkpoint: caller-given batch ids may come in any order
    sink_id = opts.sink_id
    last = tables.last_batch(conn, str(sink_id))
    check_none_lost(opts, batch_id, last)
    if last is not None and last > batch_id:
        raise LineageMismatch(
            f"{FORMAT} sink {sink_id!r}: this query's {lineage} in checkpoint {display(opts.checkpoint)!r}, but the sink has "
            f"already decided up to batch {last} and holds no decision for batch {batch_id} (older than "
            f"decisions.retain, or another lineage). {_REWIND_HELP}",
            sink_id=sink_id,
            batch_id=batch_id,
        )


def check_none_lost(opts: TwoPhaseOptions, batch_id: int, last: int | None) -> None:
    """A streaming query (Spark commits a micro-batch only after the sink's commit of it, and runs batch n
    only after committing n - 1) at batch n while the sink's decision log ends before n - 1: the database
    lost batches Spark's checkpoint says were committed (a failover to an asynchronous standby, a backup
    restored), refused before anything is written. Not for foreachBatch (``batch.id`` given), where a
    user's function may skip a batch, nor for a sink with no decision (a new sink id)."""
    if opts.batch_id is not None or last is None or last >= batch_id - 1:
        return
    first, end = last + 1, batch_id - 1
    lost = f"batch {first}" if first == end else f"batches {first}..{end}"
    raise LostBatches(
        f"{FORMAT} sink {opts.sink_id!r}: the query's checkpoint {display(opts.checkpoint)!r} committed up to batch "
        f"{end}, but the sink's decision log ({opts.eos_schema}.sink_batches) ends at batch {last}: the database lost "
        f"{lost}, which it had committed (a failover to a standby that had not received them, or a restore from an "
        f"older backup). Nothing was written. Their records: {_offsets(opts, first, end)}. To write them exactly "
        f"once, stop the query and replay from a savepoint of the checkpoint as of batch {last}: "
        f"`spark-eos savepoint create <checkpoint> <savepoint> --batch {last}`, then "
        "`spark-eos savepoint restore <savepoint> <new checkpoint>`, and run the query on the new checkpoint (the "
        "source must still hold those offsets). To accept the loss instead: `spark-eos sinks release --sink-id "
        f"{opts.sink_id}` (the query then goes on from batch {batch_id})",
        sink_id=opts.sink_id,
        batch_id=batch_id,
        lost=[first, end],
    )


def _offsets(opts: TwoPhaseOptions, first: int, end: int) -> str:
    """The source offsets of the lost batches, from the checkpoint's offset log when this process can read it."""
    where = f"offsets/{first}" + (f"..offsets/{end}" if end > first else "")
    if opts.checkpoint is None:
        return f"the checkpoint's {where}"
    try:  # first >= 1: it follows a decided batch
        start = batch_lineage(opts.checkpoint, first - 1).sources
        stop = batch_lineage(opts.checkpoint, end).sources
    except Exception:  # the checkpoint is not reachable from here (an executor): the files still say it
        return f"the checkpoint's {where}"
    return f"from {start} (offsets/{first - 1}) to {stop} ({where})"


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


def stage_of(decision: Decision, plan: TwoPhasePlan) -> str:
    """The staging table a decision names, checked to be one of ours before it goes into SQL."""
    if decision.stage is None:
        return plan.stage.sql  # decided by spark-eos 0.1: one staging table per sink and columns
    if decision.stage == DIRECT:
        return DIRECT
    shared = decision.stage.removeprefix(TASKS)
    m = STAGE_SQL.match(shared)
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
TAKE_BACK_CLASSES = REFUSED_CLASSES
TAKE_BACK_STATES = ("57014",)


class LineageMismatch(FatalError):
    """A decided batch number met with another checkpoint lineage (an older savepoint restored)."""


class LostBatches(FatalError):
    """The sink's decision log ends before the batches Spark's checkpoint committed (the database lost them)."""


def select_list(plan: TwoPhasePlan) -> str:
    return ", ".join(
        f"CAST({quote_ident(c.name)} AS {c.cast})" if c.cast else quote_ident(c.name) for c in plan.columns
    )
