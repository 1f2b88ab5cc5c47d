"""Operator commands of the sinks: ``spark-eos sinks status | recover | release | resolve-lost | retire |
prune | errors | replay-errors``.

    python -m sinks.postgres.status status  --dsn URL --sink-id ID [--eos-schema eos] [--errors-table T] [--json]
    python -m sinks.postgres.status recover --dsn URL --sink-id ID [--apply] [--never-decided]
    python -m sinks.postgres.status release --dsn URL --sink-id ID --yes
    python -m sinks.postgres.status resolve-lost --dsn URL --sink-id ID --batch N (--take-back | --finish) --yes
    python -m sinks.postgres.status retire  --dsn URL --sink-id ID --yes
    python -m sinks.postgres.status prune   --dsn URL --sink-id ID --keep N [--checkpoint LOCATION] --yes
    python -m sinks.postgres.status errors  --dsn URL --errors-table T [--json]
    python -m sinks.postgres.status replay-errors --dsn URL --errors-table T --target TABLE [--batch N] [--force]

``status`` shows the owner of the sink id, the last decided batches and every in-doubt (prepared)
gid with its age and what recovery would do with it; with ``--errors-table`` each batch's
dead-letter rows. ``recover`` resolves in-doubt gids by the
decision log (commit what a decision names, roll back the rest); a dry run unless ``--apply``.
``release`` forgets which query owns the sink id (only when that query is gone for good).
``resolve-lost`` gets past a decided batch whose staged rows are gone: take it back, or accept the
loss. ``retire`` ends a sink id for good: rolls back its undecided prepared gids, forgets its
decisions, markers and owner, drops its staging tables. ``prune`` forgets old published decisions
(batch jobs keep every decision otherwise).
``errors`` counts the rows a sink diverted to its dead-letter table (``errors.tolerance=all``) per
target, batch and error; ``replay-errors`` moves them back into the target once it was fixed, each row
leaving the dead-letter table in the transaction in which it reaches the target.

None of them creates or drops a schema or a protocol table: pointed at a schema that has no protocol
tables, or that knows nothing of the sink while prepared transactions of it exist, a command is
refused, naming the schema that does know the sink when the database has one (I3, I4: a recovery
by the wrong decision log would roll back decided batches).

A failure is one line on stderr, never a traceback, and no part of the password is ever printed:
exit code 64 for a bad argument (a malformed ``--dsn``, a ``--sink-id`` nothing in the database
knows), 2 for a server that does not answer or a refused command. ``--dsn`` defaults to
``$EOS_POSTGRES_DSN``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from eos_core.conninfo import scrub
from eos_core.errors import ConfigError, EosError, FatalError
from sinks.postgres import deadletter
from sinks.postgres.connection import classify, connect
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
    "add_subparser",
    "main",
    "prune",
    "recover",
    "release",
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


def _print_status(info: dict[str, Any]) -> None:
    owner = info["owner"]
    print(
        f"sink {info['sink_id']}: last decided batch {info['last_batch']}, "
        f"owner {owner['identity'] + ' (run ' + str(owner['run_id']) + ')' if owner else '(none)'}, "
        f"max_prepared_transactions {info['max_prepared_transactions']}"
    )
    print(f"protocol schema {info['eos_schema']}, gid prefix {info['gid_prefix']}")
    if info.get("hint"):
        print(f"note: schema {info['eos_schema']} knows nothing of this sink; {info['hint']}")
    print("decided batches (newest first):")
    letters = any("dead_letters" in d for d in info["decisions"])
    head = f" {'refused':>8}" if letters else ""
    print(f"  {'batch':>8} {'gids':>5} {'rows':>10}{head} {'published':>9}  {'lineage':<12}  decided at  (checkpoint)")
    for d in info["decisions"]:
        refused = f" {d['dead_letters']:>8}" if letters else ""
        print(
            f"  {d['batch']:>8} {d['gids']:>5} {d['rows']:>10}{refused} {('yes' if d['published'] else 'NO'):>9}  "
            f"{(d['lineage'] or '-')[:12]:<12}  {d['decided_at']}  ({d['checkpoint'] or '-'})"
        )
    if not info["in_doubt"]:
        print("in-doubt (prepared) transactions: none")
        return
    print("in-doubt (prepared) transactions:")
    print(f"  {'age s':>8} {'recovery':>8}  gid  (why)")
    for g in info["in_doubt"]:
        print(f"  {g['age_seconds']:>8} {g['recovery']:>8}  {g['gid']}  ({g['why']})")


def _one_line_errors(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command; an EosError or driver error becomes one scrubbed line on stderr and exit code 2."""

    @functools.wraps(cmd)
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except (EosError, psycopg.Error) as exc:
            err = classify(exc)  # an EosError as it is; a driver error sorted, its text redacted
            what = "config error" if isinstance(err, ConfigError) else f"error: {type(err).__name__}"
            text = " ".join(scrub(str(err), conninfo=getattr(args, "dsn", None)).split())
            print(f"spark-eos sinks {getattr(args, 'sinks_command', '')}: {what}: {text}", file=sys.stderr)
            return EXIT_CONFIG if isinstance(err, ConfigError) else 2

    return run


@_one_line_errors
def _cmd_status(args: argparse.Namespace) -> int:
    info = sink_status(
        args.dsn, args.sink_id, schema=args.eos_schema, errors_table=args.errors_table, target=args.target
    )
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_status(info)
    return 0


@_one_line_errors
def _cmd_recover(args: argparse.Namespace) -> int:
    actions = recover(
        args.dsn, args.sink_id, schema=args.eos_schema, apply=args.apply, never_decided=args.never_decided
    )
    verb = "did" if args.apply else "would do (dry run; add --apply)"
    if not actions:
        print(f"sink {args.sink_id}: no in-doubt transactions")
    for a in actions:
        print(f"{verb}: {a['action']:>8} {a['gid']}  ({a['why']})")
    return 0


@_one_line_errors
def _cmd_release(args: argparse.Namespace) -> int:
    if not args.yes:
        print(
            f"release forgets sink {args.sink_id!r}: its owner AND its decision log, so that a query with a NEW "
            "checkpoint (whose batch numbers start again at 0), or restored from an OLDER savepoint, can use the id. "
            "The sink then writes every batch that query runs: rows already in the table from batches after the "
            "savepoint are written again unless you delete them first. Only when the old query is gone for good; "
            "a new sink.id with a new table is simpler. Refused while a decided batch is unpublished. "
            "Repeat with --yes to proceed.",
            file=sys.stderr,
        )
        return 2
    print(f"released: {release(args.dsn, args.sink_id, schema=args.eos_schema)} decision row(s) removed")
    return 0


@_one_line_errors
def _cmd_resolve_lost(args: argparse.Namespace) -> int:
    action = "take-back" if args.take_back else "finish"
    found = resolve_lost(
        args.dsn, args.sink_id, args.batch, schema=args.eos_schema, action=action if args.yes else None
    )
    lost = found["lost"]
    rows = sum(g["rows"] or 0 for g in lost)
    unknown = sum(1 for g in lost if g["rows"] is None)
    what = f"{len(lost)} of {len(lost) + len(found['still_there'])} transaction(s) of batch {args.batch} lost"
    what += f" ({rows} row(s){', and rows of ' + str(unknown) + ' rolled back by hand, uncounted' if unknown else ''})"
    if not args.yes:
        effect = (
            "--take-back deletes the decision, what is left of its staged rows and its markers (nothing of the batch "
            "is visible); the query's next run writes the batch anew from its source"
            if action == "take-back"
            else "--finish marks the batch published without its lost rows; the sink moves on and the rows stay lost"
        )
        print(f"sink {args.sink_id}: {what}. {effect}. Repeat with --yes to proceed.", file=sys.stderr)
        return 2
    done = "taken back: the query's next run writes it anew" if action == "take-back" else "finished without them"
    print(f"sink {args.sink_id}: {what}; batch {args.batch} {done}")
    return 0


@_one_line_errors
def _cmd_retire(args: argparse.Namespace) -> int:
    if not args.yes:
        print(
            f"retire ends sink {args.sink_id!r} for good: it rolls back its undecided prepared transactions, deletes "
            "its decisions, markers and owner and drops its staging tables (the target table is not touched). Stop "
            "its query or jobs first; refused while a decided batch is unpublished. Repeat with --yes to proceed.",
            file=sys.stderr,
        )
        return 2
    done = retire(args.dsn, args.sink_id, schema=args.eos_schema, never_decided=args.never_decided)
    print(
        f"retired sink {args.sink_id}: {len(done['rolled_back'])} prepared transaction(s) rolled back, "
        f"{len(done['committed'])} committed, {done['decisions_removed']} decision row(s) removed, "
        f"{len(done['staging_tables_dropped'])} staging table(s) dropped"
    )
    return 0


@_one_line_errors
def _cmd_prune(args: argparse.Namespace) -> int:
    if not args.yes:
        print(
            f"prune forgets the published decisions of sink {args.sink_id!r} older than its {args.keep} newest "
            "(and, with --checkpoint, older than Spark's last commits/n there), with their markers. A batch job run "
            "again with a forgotten batch.id writes that batch again; a query restored from a savepoint older than "
            "the oldest decision kept is refused. Repeat with --yes to proceed.",
            file=sys.stderr,
        )
        return 2
    done = prune(args.dsn, args.sink_id, args.keep, schema=args.eos_schema, checkpoint=args.checkpoint)
    print(
        f"sink {args.sink_id}: {done['decisions_removed']} decision(s) and {done['markers_removed']} marker(s) "
        f"removed; {done['decisions_kept']} decision(s) kept, the oldest of batch {done['oldest_kept']}"
    )
    return 0


@_one_line_errors
def _cmd_errors(args: argparse.Namespace) -> int:
    with _connect(args.dsn) as conn:
        rows = deadletter.summary(conn, parse_table_name(args.errors_table, option="--errors-table"))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"{args.errors_table}: no refused rows")
    else:
        print(f"  {'target':<24} {'batch':>8} {'rows':>7} {'again':>6}  {'sqlstate':<8} {'class':<9} where: message")
    for r in rows:
        batch = "-" if r["batch"] is None else r["batch"]
        print(
            f"  {r['target']:<24} {batch:>8} {r['rows']:>7} {r['refused_again']:>6}  {r['sqlstate']:<8} "
            f"{r['class']:<9} {r['where'] or '-'}: {r['message']}"
        )
    return 0


@_one_line_errors
def _cmd_replay_errors(args: argparse.Namespace) -> int:
    table = parse_table_name(args.errors_table, option="--errors-table")
    target = parse_table_name(args.target, option="--target")
    with _connect(args.dsn) as conn:
        done = deadletter.replay(conn, table, target, args.batch, force=args.force)
    print(
        f"{target}: {done.moved} row(s) moved from {table} into the target ({done.superseded} of them superseded by "
        f"a newer version or a later delete, not written), {done.refused} refused again (kept), {done.kept} kept "
        "unwritten (the target has a row with their key and no version column orders them: --force overwrites)"
    )
    return 0 if done.refused == 0 and done.kept == 0 else 1


def _dsn(p: argparse.ArgumentParser) -> None:
    import os

    env = os.environ.get("EOS_POSTGRES_DSN")
    p.add_argument(
        "--dsn", default=env, required=not env, help="libpq URL or conninfo of the sink's database ($EOS_POSTGRES_DSN)"
    )


def _errors_common(p: argparse.ArgumentParser) -> None:
    _dsn(p)
    p.add_argument("--errors-table", required=True, help="the errors.table option of the sink")


def _common(p: argparse.ArgumentParser) -> None:
    _dsn(p)
    p.add_argument("--sink-id", required=True, help="the sink.id option of the query")
    p.add_argument("--eos-schema", default=DEFAULT_SCHEMA, help="the eos.schema option (default eos)")


_NEVER_DECIDED = (
    "the sink never decided a batch (its first batch crashed before the decision): roll back its prepared "
    "transactions although no schema knows the sink"
)


def _add_commands(sub: Any) -> None:
    p = sub.add_parser("status", help="decided batches and in-doubt prepared transactions of a two-phase sink")
    _common(p)
    p.add_argument("--errors-table", help="the sink's errors.table: show each batch's dead-letter rows")
    p.add_argument("--target", help="with --errors-table shared by several sinks: count this target's rows only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("recover", help="resolve in-doubt transactions by the decision log (dry run by default)")
    _common(p)
    p.add_argument("--apply", action="store_true", help="really commit/roll back (default: print the plan)")
    p.add_argument("--never-decided", action="store_true", help=_NEVER_DECIDED)
    p.set_defaults(func=_cmd_recover)
    p = sub.add_parser("release", help="forget the owner of a sink id (to reuse it with a new checkpoint)")
    _common(p)
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=_cmd_release)
    p = sub.add_parser(
        "resolve-lost", help="take back, or finish, a decided batch whose staged rows are gone (docs/lifecycle.md)"
    )
    _common(p)
    p.add_argument("--batch", type=int, required=True, help="the stuck batch (sinks status shows it: published NO)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--take-back", action="store_true", help="forget the batch; the query writes it anew")
    how.add_argument("--finish", action="store_true", help="mark it published without its lost rows")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=_cmd_resolve_lost)
    p = sub.add_parser("retire", help="end a sink id: roll back its undecided transactions, forget its decisions")
    _common(p)
    p.add_argument("--never-decided", action="store_true", help=_NEVER_DECIDED)
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=_cmd_retire)
    p = sub.add_parser("prune", help="forget old published decisions of a sink (batch jobs keep every one)")
    _common(p)
    p.add_argument("--keep", type=int, required=True, help="decisions to keep, newest first (at least 1)")
    p.add_argument("--checkpoint", help="the query's checkpoint location: keep every batch from its last commits/n")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=_cmd_prune)
    p = sub.add_parser("errors", help="rows a sink diverted to its dead-letter table, per target, batch and error")
    _errors_common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_errors)
    p = sub.add_parser("replay-errors", help="move dead-letter rows back into the fixed target, exactly once")
    _errors_common(p)
    p.add_argument("--target", required=True, help="the table option of the sink whose rows to replay")
    p.add_argument("--batch", type=int, default=None, help="only this batch's rows (-1: a batch write's)")
    p.add_argument(
        "--force",
        action="store_true",
        help="without a version column: overwrite (or delete) the target's row of a key (default: keep such rows)",
    )
    p.set_defaults(func=_cmd_replay_errors)


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sinks {status,recover,release,resolve-lost,retire,prune,errors,replay-errors}`` to a CLI; each
    leaf sets ``func(args) -> exit code``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sinks",
        help="operate the Postgres sinks (status, recover, release, resolve-lost, retire, prune, errors, replay-errors)",
    )
    _add_commands(p.add_subparsers(dest="sinks_command", required=True))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sinks.postgres.status", description=__doc__.split("\n")[0])
    _add_commands(parser.add_subparsers(dest="sinks_command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
