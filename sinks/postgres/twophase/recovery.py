"""Resolving prepared transactions of a sink: commit what a decision names, roll back the rest."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from eos_core.errors import CommitUnknown, FatalError, RetriableError
from sinks.postgres.connection import classify, close_quietly
from sinks.postgres.twophase.decisions import Prepared, ProtocolTables, list_prepared, sink_lock

__all__ = [
    "Action",
    "commit_prepared",
    "plan_resolution",
    "resolve",
    "rollback_prepared",
    "warn_old_prepared",
]

log = logging.getLogger(__name__)

COMMIT = "commit"
ROLLBACK = "rollback"
KEEP = "keep"
_BUSY_SQLSTATE = "55000"  # "prepared transaction with identifier ... is busy": another session is finishing it
_MISSING_SQLSTATE = "42704"  # "prepared transaction with identifier ... does not exist"


@dataclass(frozen=True)
class Action:
    """What recovery does (or, in a dry run, would do) with one prepared gid, and why."""

    gid: str
    batch: int
    partition: int
    action: str  # commit | rollback | keep
    reason: str
    age_seconds: float = 0.0


def plan_resolution(
    conn: psycopg.Connection,
    tables: ProtocolTables,
    sink_id: str,
    *,
    keep_nonce: str | None = None,
    only_batch: int | None = None,
    upto_batch: int | None = None,
    keep_undecided: bool = False,
    stale_after: float | None = None,
) -> list[Action]:
    """Decide, for each prepared gid of the sink, commit / roll back / keep. Call under the sink lock.

    - a gid named by its batch's decision: commit (roll forward; the decision is durable);
    - a gid of a decided batch that the decision does not name: roll back (a failed or zombie
      attempt; it can never become part of the batch);
    - a gid of an undecided batch: roll back, unless it carries ``keep_nonce`` (a task of the same
      batch attempt, another attempt of the calling task included: with speculation Spark may
      accept either, and the commit rolls back the one it did not) or ``keep_undecided`` is set.
    ``only_batch``/``upto_batch`` restrict which batches are looked at; ``stale_after`` (seconds)
    adds, outside ``only_batch``, undecided gids older than that (batch jobs that died after
    PREPARE and were never run again: I4, every prepared transaction has a bounded life).
    """
    prepared = list_prepared(conn, sink_id)
    if only_batch is not None:
        prepared = [
            p
            for p in prepared
            if p.gid.batch == only_batch or (stale_after is not None and p.age_seconds > stale_after)
        ]
    if upto_batch is not None:
        prepared = [p for p in prepared if p.gid.batch <= upto_batch]
    decisions = tables.decisions(conn, sink_id, (p.gid.batch for p in prepared))
    actions = []
    for p in prepared:
        g = p.gid
        text = str(g)
        decision = decisions.get(g.batch)
        if decision is not None:
            if text in decision.gids:
                act, why = COMMIT, f"named by the decision of batch {g.batch}"
            else:
                act, why = ROLLBACK, f"batch {g.batch} is decided without it (failed or zombie attempt)"
        elif keep_nonce is not None and g.nonce == keep_nonce:
            act, why = KEEP, "a task of the running batch attempt"
        elif only_batch is not None and g.batch != only_batch:
            act, why = (
                ROLLBACK,
                (
                    f"batch {g.batch} is undecided and its transaction is {p.age_seconds:.0f}s old, past "
                    f"prepared.timeout ({stale_after:.0f}s): a batch job that died after PREPARE"
                ),
            )
        elif keep_undecided:
            act, why = KEEP, f"batch {g.batch} is not decided yet"
        else:
            act, why = ROLLBACK, f"batch {g.batch} is undecided and the attempt ({g.nonce}) is dead"
        actions.append(Action(text, g.batch, g.partition, act, why, p.age_seconds))
    return actions


def resolve(
    conn: psycopg.Connection,
    tables: ProtocolTables,
    sink_id: str,
    *,
    dry_run: bool = False,
    **filters: object,
) -> list[Action]:
    """Plan and (unless ``dry_run``) apply the resolution of the sink's prepared gids, under the sink lock.

    ``conn`` must be in autocommit mode (COMMIT/ROLLBACK PREPARED cannot run in a transaction block).
    """
    with sink_lock(conn, sink_id):
        actions = plan_resolution(conn, tables, sink_id, **filters)  # type: ignore[arg-type]
        if dry_run:
            return actions
        for a in actions:
            if a.action == COMMIT:
                _finish(conn, a.gid, commit=True)
                log.info("postgres-2pc %s: committed %s (%s)", sink_id, a.gid, a.reason)
            elif a.action == ROLLBACK:
                rollback_prepared(conn, a.gid)
                log.info("postgres-2pc %s: rolled back %s (%s)", sink_id, a.gid, a.reason)
    return actions


def rollback_prepared(conn: psycopg.Connection, gid: str) -> bool:
    """ROLLBACK PREPARED; False when the gid no longer exists (someone else finished it)."""
    return _finish(conn, gid, commit=False) == "done"


def _finish(c: psycopg.Connection, gid: str, *, commit: bool) -> str:
    verb = "COMMIT PREPARED" if commit else "ROLLBACK PREPARED"
    for _ in range(50):
        try:
            c.execute(f"{verb} {_literal(gid)}".encode())
            return "done"
        except psycopg.Error as exc:
            if exc.sqlstate == _MISSING_SQLSTATE:
                return "missing"
            if exc.sqlstate == _BUSY_SQLSTATE and "busy" in str(exc):
                time.sleep(0.1)
                continue
            raise
    raise RetriableError(f"postgres-2pc: prepared transaction {gid} stayed busy; another session is finishing it")


def _literal(text: str) -> str:
    # COMMIT/ROLLBACK PREPARED take a string literal, not a bind parameter; gids are [A-Za-z0-9:%._@+=/-].
    return "'" + text.replace("'", "''") + "'"


def commit_prepared(
    connect: Callable[[], psycopg.Connection],
    tables: ProtocolTables,
    gid: str,
    *,
    attempts: int = 5,
    backoff: float = 0.5,
    conn: psycopg.Connection | None = None,
) -> tuple[str, psycopg.Connection | None]:
    """COMMIT PREPARED ``gid`` of a decided batch; prove the outcome when it is not plainly 'done'.

    Returns ("committed" | "already committed", the connection to reuse). A dropped connection is
    retried on a new one (the gid is committed again if still prepared, else proven by its marker).
    A gid that is gone without a committed marker was rolled back outside the protocol: FatalError.
    If the outcome cannot be established within ``attempts``: CommitUnknown, never a guess.
    """
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            if conn is None or conn.closed or conn.broken:
                close_quietly(conn)
                conn = connect()
            outcome = _finish(conn, gid, commit=True)
            if outcome == "done":
                return "committed", conn
            # 42704: finished by someone else (an earlier commit() call, a task's roll-forward,
            # `sinks recover`, or our own COMMIT whose reply the network lost). The marker row was
            # written inside the prepared transaction: it exists iff the transaction committed.
            if tables.marker_exists(conn, gid):
                return "already committed", conn
            raise FatalError(
                f"postgres-2pc: prepared transaction {gid} is named by its batch's decision but was rolled back "
                "outside the protocol (no marker row): its rows are lost. Someone ran ROLLBACK PREPARED by hand or "
                "an unsupported tool did; restore the rows of this batch from the source",
                gid=gid,
            )
        except FatalError:
            raise
        except Exception as exc:
            err = classify(exc, f"COMMIT PREPARED {gid}")
            if not isinstance(err, RetriableError):
                raise err from exc
            last = exc
            log.warning("postgres-2pc: COMMIT PREPARED %s, try %d/%d failed: %s", gid, attempt, attempts, err)
            close_quietly(conn)
            conn = None
            time.sleep(backoff * attempt)
    raise CommitUnknown(
        f"postgres-2pc: cannot establish whether prepared transaction {gid} committed after {attempts} tries "
        f"(last error: {last}); the batch's decision is durable, so the next run (or `spark-eos sinks recover`) "
        "commits it; nothing was guessed",
        gid=gid,
    ) from last


def warn_old_prepared(prepared: list[Prepared], sink_id: str, threshold_seconds: float) -> list[Prepared]:
    """Log a warning for prepared transactions of the sink older than the threshold; return them."""
    old = [p for p in prepared if p.age_seconds > threshold_seconds]
    for p in old:
        log.warning(
            "postgres-2pc %s: prepared transaction %s is %.0fs old (threshold %.0fs); prepared transactions hold "
            "locks and block VACUUM. If no query of this sink is running, run `spark-eos sinks recover --sink-id %s`",
            sink_id,
            p.gid,
            p.age_seconds,
            threshold_seconds,
            sink_id,
        )
    return old
