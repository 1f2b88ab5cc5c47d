"""The operations behind ``spark-eos sinks`` (``connectors.commands.sinks``, the command line): a two-phase
sink's status, recovery of its in-doubt transactions, release, resolution of a lost batch, retirement and
pruning of its decision log; the dead letters' summary and their replay.

``sink_status`` shows the owner of the sink id, the last decided batches and every in-doubt (prepared)
gid with its age and what recovery would do with it; with an errors table each batch's dead-letter rows.
``recover`` resolves in-doubt gids by the decision log (commit what a decision names, roll back the rest);
a dry run unless ``apply``. ``release`` forgets which query owns the sink id (only when that query is gone
for good). ``resolve_lost`` gets past a decided batch whose staged rows are gone: take it back, or accept
the loss. ``retire`` ends a sink id for good: rolls back its undecided prepared gids, forgets its
decisions, markers and owner, drops its staging tables. ``prune`` forgets old published decisions
(batch jobs keep every decision otherwise). ``error_summary`` counts the rows a sink diverted to its
dead-letter table (``errors.tolerance=all``) per target, batch and error; ``replay_errors`` moves them
back into the target once it was fixed, each row leaving the dead-letter table in the transaction in
which it reaches the target.

None of them creates or drops a schema or a protocol table: pointed at a schema that has no protocol
tables, or that knows nothing of the sink while prepared transactions of it exist, an operation is
refused (ConfigError), naming the schema that does know the sink when the database has one (I3, I4: a
recovery by the wrong decision log would roll back decided batches).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from eos_core.errors import ConfigError, FatalError
from sinks.postgres import deadletter
from sinks.postgres.connection import connect
from sinks.postgres.options import ConnectionOptions, parse_table_name
from sinks.postgres.twophase.decisions import (
    DEFAULT_SCHEMA,
    Decision,
    ProtocolTables,
    list_prepared,
    max_prepared_transactions,
    schemas_knowing,
    sink_lock,
)
from sinks.postgres.twophase.gid import sink_prefix
from sinks.postgres.twophase.recovery import ROLLBACK, Action, resolve

EXIT_CONFIG = 64
"""Exit code of a bad argument (a malformed --dsn, an unknown --sink-id), as every spark-eos command."""

__all__ = [
    "EXIT_CONFIG",
    "error_summary",
    "prune",
    "recover",
    "release",
    "replay_errors",
    "resolve_lost",
    "retire",
    "sink_status",
]


def _connect(dsn: str) -> psycopg.Connection:
    """Connect with ``dsn``; a bad one is a ConfigError naming 'dsn', an unreachable server a RetriableError."""
    return connect(ConnectionOptions(dsn=dsn), autocommit=True, application_name="spark-eos sinks")


def _where(conn: psycopg.Connection, sink_id: str, schema: str) -> str:
    """Where the sink's protocol tables are, for a command pointed at ``schema``: the fix to print."""
    knowing, unreadable = schemas_knowing(conn, sink_id)
    others = [k for k in knowing if k != schema]
    if others:
        pass_it = " or ".join(f"--eos-schema {k}" for k in others)
        return f"the decisions of sink {sink_id!r} are in schema {', '.join(map(repr, others))}: pass {pass_it}"
    text = f"no schema of this database knows sink {sink_id!r}"
    if unreadable:
        text += f" (schema(s) {', '.join(map(repr, unreadable))} could not be read by this role)"
    return text


def _protocol(conn: psycopg.Connection, sink_id: str, schema: str) -> ProtocolTables:
    """The protocol tables in ``schema`` (the option eos.schema), checked without creating anything."""
    tables = ProtocolTables(schema)
    if not tables.present(conn):
        raise FatalError(
            f"schema {schema!r} (--eos-schema) has no spark-eos protocol tables (sink_batches, sink_parts, "
            f"sink_owners); {_where(conn, sink_id, schema)}. Nothing was changed",
            sink_id=sink_id,
        )
    if not tables.current(conn):
        raise FatalError(
            f"the protocol tables in schema {schema!r} are of an older spark-eos (no lineage columns): run the "
            "sink once with this version (it adds them), then repeat; nothing was changed",
            sink_id=sink_id,
        )
    return tables


def _check_known(
    conn: psycopg.Connection,
    tables: ProtocolTables,
    sink_id: str,
    actions: list[Action],
    *,
    never_decided: bool = False,
) -> None:
    """Refuse to roll back a gid by a decision log that does not know its sink or its batch.

    Pointed at the wrong schema (the default ``eos`` for a sink of ``eos.schema=other``, a typo), every
    prepared gid of the sink looks undecided, and recovery would roll back decided batches: their rows
    would be lost. Refused when the schema knows nothing of the sink while gids of it are prepared
    (unless ``never_decided``: a sink whose first batch crashed before its decision, which no schema
    can know), and when another schema decided a batch this one would roll back."""
    if not actions:
        return
    knowing, unreadable = schemas_knowing(conn, sink_id)
    others = [k for k in knowing if k != tables.schema]
    if tables.schema not in knowing and (others or unreadable or not never_decided):
        hint = (
            ""
            if others or unreadable
            else (
                ". If the sink never decided a batch (its first batch crashed before the decision), its "
                "prepared transactions are undecided everywhere: --never-decided rolls them back"
            )
        )
        raise FatalError(
            f"schema {tables.schema!r} (--eos-schema) knows nothing of sink {sink_id!r} (no decision, marker or "
            f"owner) although {len(actions)} prepared transaction(s) of it exist: by this schema every one of them "
            f"would look undecided and be rolled back, decided batches too; {_where(conn, sink_id, tables.schema)}"
            f"{hint}. Nothing was changed",
            sink_id=sink_id,
        )
    rollbacks = [a.batch for a in actions if a.action == ROLLBACK]
    for other in others:  # the sink moved schemas (eos.schema changed): a batch decided there is not ours to undo
        decided = ProtocolTables(other).decided_batches(conn, sink_id, rollbacks)
        if decided:
            raise FatalError(
                f"schema {other!r} holds decisions of sink {sink_id!r} for batch(es) {sorted(decided)}, which "
                f"schema {tables.schema!r} would roll back as undecided: pass --eos-schema {other}. Nothing was "
                "changed",
                sink_id=sink_id,
            )


def _unknown_sink(conn: psycopg.Connection, tables: ProtocolTables, sink_id: str) -> str:
    """Why a ``--sink-id`` that nothing in the database knows is refused, with the ids that exist."""
    import difflib

    rows = conn.execute(
        sql.SQL("SELECT sink_id FROM {} UNION SELECT sink_id FROM {} UNION SELECT sink_id FROM {} ORDER BY 1").format(
            tables.batches, tables.parts, tables.owners
        )
    ).fetchall()
    ids = [str(r[0]) for r in rows]
    close = difflib.get_close_matches(sink_id, ids, n=1)
    return (
        f"no sink {sink_id!r} in this database: no schema knows it (no decision, marker or owner) and no prepared "
        "transaction of it exists; check --sink-id (the query's sink.id option)"
        + (f": did you mean {close[0]!r}?" if close else "")
        + (f" Sinks in schema {tables.schema!r}: {', '.join(ids[:20])}{' ...' if len(ids) > 20 else ''}" if ids else "")
    )


def sink_status(
    dsn: str,
    sink_id: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    limit: int = 10,
    errors_table: str | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """The sink's owner, last decisions and in-doubt gids (with the action recovery would take);
    with ``errors_table`` (the sink's errors.table) each decided batch's dead-letter rows (of
    ``target`` only, when the table is shared by several sinks)."""
    with _connect(dsn) as conn:
        tables = _protocol(conn, sink_id, schema)
        owner = tables.owner(conn, sink_id)
        decisions = tables.recent(conn, sink_id, limit)
        refused: dict[int, int] | None = None
        if errors_table is not None:
            letters = parse_table_name(errors_table, option="--errors-table")
            refused = deadletter.per_batch(conn, letters, [d.batch_id for d in decisions], target)
        prepared = {str(p.gid): p for p in list_prepared(conn, sink_id)}
        plan = resolve(conn, tables, sink_id, dry_run=True)
        known = tables.knows(conn, sink_id)
        if not known and not prepared and not plan and not schemas_knowing(conn, sink_id)[0]:
            raise ConfigError(_unknown_sink(conn, tables, sink_id), option="--sink-id")
        return {
            "sink_id": sink_id,
            "eos_schema": tables.schema,
            "gid_prefix": sink_prefix(sink_id),
            "known": known,
            "hint": None if known else _where(conn, sink_id, tables.schema),
            "owner": None
            if owner is None
            else {"identity": owner.identity, "run_id": owner.run_id, "claimed_at": str(owner.claimed_at)},
            "last_batch": tables.last_batch(conn, sink_id),
            "max_prepared_transactions": max_prepared_transactions(conn),
            "decisions": [
                {
                    "batch": d.batch_id,
                    "gids": len(d.gids),
                    "rows": d.rows,
                    "decided_at": str(d.decided_at),
                    "published": d.published_at is not None,
                    "lineage": d.lineage,
                    "checkpoint": d.checkpoint,
                    "staged_in": d.stage,
                    **({} if refused is None else {"dead_letters": refused.get(d.batch_id, 0)}),
                }
                for d in decisions
            ],
            "in_doubt": [
                {
                    "gid": a.gid,
                    "batch": a.batch,
                    "partition": a.partition,
                    "age_seconds": round(a.age_seconds, 1),
                    "prepared_at": str(prepared[a.gid].prepared_at) if a.gid in prepared else None,
                    "recovery": a.action,
                    "why": a.reason,
                }
                for a in plan
            ],
        }


def recover(
    dsn: str, sink_id: str, *, schema: str = DEFAULT_SCHEMA, apply: bool = False, never_decided: bool = False
) -> list[dict[str, Any]]:
    """Resolve the sink's in-doubt gids by the decision log; only a plan unless ``apply``.

    Refused, with nothing changed, when ``schema`` has no protocol tables or does not know the sink
    (see ``_check_known``); ``never_decided`` lets it roll back the gids of a sink no schema knows."""
    with _connect(dsn) as conn:
        tables = _protocol(conn, sink_id, schema)
        with sink_lock(conn, sink_id):
            actions = resolve(conn, tables, sink_id, dry_run=True)
            _check_known(conn, tables, sink_id, actions, never_decided=never_decided)
            if apply:
                actions = resolve(conn, tables, sink_id)
    return [{"gid": a.gid, "batch": a.batch, "action": a.action, "why": a.reason, "applied": apply} for a in actions]


def release(dsn: str, sink_id: str, *, schema: str = DEFAULT_SCHEMA) -> int:
    """Forget the sink id (owner, decisions, markers); refused while it has in-doubt gids."""
    with _connect(dsn) as conn:
        tables = _protocol(conn, sink_id, schema)
        with sink_lock(conn, sink_id):
            if not tables.knows(conn, sink_id):
                raise FatalError(
                    f"schema {schema!r} (--eos-schema) knows nothing of sink {sink_id!r}: nothing to release; "
                    f"{_where(conn, sink_id, schema)}",
                    sink_id=sink_id,
                )
            pending = list_prepared(conn, sink_id)
            if pending:
                raise FatalError(
                    f"sink {sink_id!r} has {len(pending)} in-doubt prepared transaction(s); run "
                    f"`spark-eos sinks recover --sink-id {sink_id} --apply` first"
                )
            return tables.release(conn, sink_id)


def _stuck_decision(
    conn: psycopg.Connection, tables: ProtocolTables, sink_id: str, batch: int, schema: str
) -> tuple[Decision, str]:
    """The decided, unpublished batch ``batch`` of ``sink_id``, with its staging place and none of its
    transactions still prepared: (decision, stage token); else a FatalError saying why and what to do."""
    from sinks.postgres.twophase.plan import DIRECT, STAGE_SQL, TASKS

    decision = tables.decision(conn, sink_id, batch)
    if decision is None:
        raise FatalError(
            f"sink {sink_id!r} has no decision of batch {batch} in schema {schema!r}; "
            f"{_where(conn, sink_id, schema) if not tables.knows(conn, sink_id) else 'nothing to resolve'}",
            sink_id=sink_id,
            batch_id=batch,
        )
    if decision.published:
        raise FatalError(f"batch {batch} of sink {sink_id!r} is published: nothing of it is stuck", batch_id=batch)
    token = decision.stage
    if token is None:
        raise FatalError(
            f"batch {batch} of sink {sink_id!r} was decided by spark-eos 0.1, which did not record where "
            "its rows are staged: restart the query with the columns it had then (it publishes the batch)",
            batch_id=batch,
        )
    m = STAGE_SQL.match(token.removeprefix(TASKS))
    if token != DIRECT and (m is None or m.group(1).replace('""', '"') != schema):
        raise FatalError(
            f"batch {batch} of sink {sink_id!r}: its decision names {token!r} as its staging place, not a "
            f"staging table of schema {schema!r}; {schema}.sink_batches was changed by hand",
            batch_id=batch,
        )
    gids = list(decision.gids)
    prepared = {str(p.gid) for p in list_prepared(conn, sink_id)}
    pending = [g for g in gids if g in prepared]
    if pending:
        raise FatalError(
            f"batch {batch} of sink {sink_id!r}: {len(pending)} of its {len(gids)} transactions are still "
            f"prepared, with their rows: run `spark-eos sinks recover --sink-id {sink_id} --eos-schema "
            f"{schema} --apply` (it commits them), then restart the query (it publishes the batch). "
            "Nothing was changed",
            batch_id=batch,
        )
    return decision, token


def _lost_and_kept(
    conn: psycopg.Connection, tables: ProtocolTables, decision: Decision, token: str
) -> tuple[dict[str, int], list[str], list[str]]:
    """Which of a decision's transactions still have their rows: (rows per gid by marker, lost, kept)."""
    from sinks.postgres.twophase.plan import DIRECT, staged_present

    gids = list(decision.gids)
    rows: dict[str, int] = {
        str(g): int(n)
        for g, n in conn.execute(
            sql.SQL("SELECT gid, rows FROM {} WHERE gid = ANY(%s)").format(tables.parts), (gids,)
        ).fetchall()
    }
    if token == DIRECT:  # rows in the table iff its transaction committed: its marker says so
        there = {g: g in rows for g in gids}
    else:
        there = {g: g in rows and ok for g, ok in staged_present(conn, token, gids).items()}
    lost = sorted(g for g in gids if not there[g])
    kept = sorted(g for g in gids if there[g])
    return rows, lost, kept


def resolve_lost(
    dsn: str, sink_id: str, batch: int, *, schema: str = DEFAULT_SCHEMA, action: str | None = None
) -> dict[str, Any]:
    """Get past a decided, unpublished batch whose staged rows are gone (issue 27 item 9).

    Such a batch can never be published (its staging tables were dropped, or a decided gid was
    rolled back by hand), and ``release`` refuses a sink with an unpublished batch. ``action``:

    - ``take-back``: delete the decision, what is left of its staged rows and its markers, in one
      transaction (as a refused batch is taken back): nothing of it was visible, and the query's next
      run (a batch job: the same ``batch.id`` again) writes the batch anew from its source. Refused for
      a ``visibility=partition`` batch with a committed transaction (its rows are in the table).
    - ``finish``: mark the batch published without its lost rows: the sink moves on, the loss is
      accepted (restore those rows from the source by hand). Refused while any staged rows of the
      batch are still there (they would never be published).

    Refused while its staged rows all exist (the query's next run publishes the batch), while any of
    its transactions is still prepared (``sinks recover --apply`` first), and for a published or
    missing decision. ``action`` None: only the finding. Under the sink lock, one transaction."""
    from sinks.postgres.twophase.plan import DIRECT, discard_staged

    if action not in (None, "take-back", "finish"):
        raise ConfigError(f"resolve-lost: unknown action {action!r}: --take-back or --finish", option="action")
    with _connect(dsn) as conn:
        tables = _protocol(conn, sink_id, schema)
        with sink_lock(conn, sink_id):
            decision, token = _stuck_decision(conn, tables, sink_id, batch, schema)
            gids = list(decision.gids)
            rows, lost, kept = _lost_and_kept(conn, tables, decision, token)
            found = {
                "sink_id": sink_id,
                "batch": batch,
                "rows": decision.rows,
                "visibility": "partition" if token == DIRECT else "batch",
                "lost": [{"gid": g, "rows": rows.get(g)} for g in lost],
                "still_there": [{"gid": g, "rows": rows.get(g)} for g in kept],
                "action": action,
                "done": False,
            }
            if not lost:
                raise FatalError(
                    f"batch {batch} of sink {sink_id!r}: nothing of it is lost (the rows of its {len(gids)} "
                    "transaction(s) are all there): restart the query, its next run publishes the batch. Nothing "
                    "was changed",
                    batch_id=batch,
                )
            if action == "take-back":
                if token == DIRECT and kept:
                    raise FatalError(
                        f"batch {batch} of sink {sink_id!r} (visibility=partition): {len(kept)} of its transactions "
                        "committed, so their rows are in the table already; it cannot be taken back. --finish accepts "
                        "the loss of the others. Nothing was changed",
                        batch_id=batch,
                    )
                if not tables.undecide(
                    conn, decision, lambda g: None if token == DIRECT else discard_staged(conn, token, g)
                ):
                    raise FatalError(f"batch {batch} of sink {sink_id!r} was published meanwhile", batch_id=batch)
                found["done"] = True
            elif action == "finish":
                if token != DIRECT and kept:
                    raise FatalError(
                        f"batch {batch} of sink {sink_id!r}: {len(kept)} of its transactions still have their staged "
                        "rows, which --finish would leave unpublished for good; take the batch back instead "
                        "(--take-back: the query writes it anew). Nothing was changed",
                        batch_id=batch,
                    )
                with conn.transaction():
                    again = tables.decision(conn, sink_id, batch, for_update=True)
                    if again is None or again.published or again.gids != decision.gids:
                        raise FatalError(f"batch {batch} of sink {sink_id!r} changed meanwhile", batch_id=batch)
                    tables.mark_published(conn, sink_id, batch)
                found["done"] = True
            return found


def retire(dsn: str, sink_id: str, *, schema: str = DEFAULT_SCHEMA, never_decided: bool = False) -> dict[str, Any]:
    """End a sink id for good: roll back its undecided prepared gids, forget its decisions, markers and
    owner, drop its staging tables (under the sink lock). Refused, with nothing changed, while a decided
    batch is unpublished (its rows wait in staging: publish it, or ``resolve-lost``), and when the
    schema does not know the sink (as ``recover``). Stop the sink's query (or jobs) first."""
    from sinks.postgres.twophase.committer import drop_empty_stages

    with _connect(dsn) as conn:
        tables = _protocol(conn, sink_id, schema)
        with sink_lock(conn, sink_id):
            plan = resolve(conn, tables, sink_id, dry_run=True)
            if not plan and not tables.knows(conn, sink_id):
                raise FatalError(
                    f"schema {schema!r} (--eos-schema) knows nothing of sink {sink_id!r} and no prepared transaction "
                    f"of it exists: nothing to retire; {_where(conn, sink_id, schema)}",
                    sink_id=sink_id,
                )
            _check_known(conn, tables, sink_id, plan, never_decided=never_decided)
            pending = conn.execute(
                sql.SQL("SELECT batch_id FROM {} WHERE sink_id = %s AND published_at IS NULL ORDER BY 1").format(
                    tables.batches
                ),
                (sink_id,),
            ).fetchall()
            if pending:
                raise FatalError(
                    f"sink {sink_id!r} has decided batches that are not published yet "
                    f"({', '.join(str(r[0]) for r in pending)}): their rows wait in staging and only their decision "
                    "says so. Run the query once more (it publishes them), or, if their staged rows are gone, "
                    f"`spark-eos sinks resolve-lost --sink-id {sink_id} --batch N`; then retire. Nothing was changed",
                    sink_id=sink_id,
                )
            actions = resolve(conn, tables, sink_id)
            removed = tables.release(conn, sink_id)
            dropped = drop_empty_stages(conn, tables, sink_id)
    return {
        "sink_id": sink_id,
        "rolled_back": sorted(a.gid for a in actions if a.action == ROLLBACK),
        "committed": sorted(a.gid for a in actions if a.action != ROLLBACK),
        "decisions_removed": removed,
        "staging_tables_dropped": dropped,
    }


def prune(
    dsn: str, sink_id: str, keep: int, *, schema: str = DEFAULT_SCHEMA, checkpoint: str | None = None
) -> dict[str, Any]:
    """Forget the sink's published decisions (and their markers) older than its ``keep`` newest ones.

    A streaming query prunes its own (``decisions.retain``); batch jobs never do. Never pruned: an
    unpublished decision, the newest ``keep``, and with ``checkpoint`` (the query's location) every
    batch from Spark's last ``commits/n`` on, which the checkpoint may still replay. A batch job run
    again with a pruned ``batch.id`` writes that batch again."""
    from eos_core.checkpoint import display, numbered

    if keep < 1:
        raise ConfigError(
            f"prune: --keep must be at least 1 (the newest decision always stays), got {keep}", option="keep"
        )
    below = None
    if checkpoint is not None:
        commits = numbered(checkpoint, "commits")
        if not commits:
            raise FatalError(
                f"prune: no commits/ in checkpoint {display(checkpoint)!r} (--checkpoint): the query may replay "
                "any batch; nothing was pruned"
            )
        below = commits[-1]
    with _connect(dsn) as conn:
        tables = _protocol(conn, sink_id, schema)
        if not tables.knows(conn, sink_id):
            raise FatalError(
                f"schema {schema!r} (--eos-schema) knows nothing of sink {sink_id!r}: nothing to prune; "
                f"{_where(conn, sink_id, schema)}",
                sink_id=sink_id,
            )
        with sink_lock(conn, sink_id):
            decisions, markers = tables.prune(conn, sink_id, keep, below)
            row = conn.execute(
                sql.SQL("SELECT min(batch_id), count(*) FROM {} WHERE sink_id = %s").format(tables.batches),
                (sink_id,),
            ).fetchone()
    assert row is not None
    return {
        "sink_id": sink_id,
        "decisions_removed": decisions,
        "markers_removed": markers,
        "decisions_kept": int(row[1]),
        "oldest_kept": None if row[0] is None else int(row[0]),
    }


def error_summary(dsn: str, errors_table: str) -> list[dict[str, Any]]:
    """The rows a sink diverted to ``errors_table``, counted per target, batch and error."""
    with _connect(dsn) as conn:
        return deadletter.summary(conn, parse_table_name(errors_table, option="--errors-table"))


def replay_errors(dsn: str, errors_table: str, target: str, batch: int | None, *, force: bool = False) -> Any:
    """Move the dead-letter rows of ``target`` (of ``batch``, or every batch) back into it: what moved, what
    was superseded, refused again or kept (``deadletter.replay``)."""
    table = parse_table_name(errors_table, option="--errors-table")
    with _connect(dsn) as conn:
        return deadletter.replay(conn, table, parse_table_name(target, option="--target"), batch, force=force)
