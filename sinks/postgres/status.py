"""Operator commands of the sinks: ``spark-eos sinks status | recover | release | errors | replay-errors``.

    python -m sinks.postgres.status status  --dsn URL --sink-id ID [--eos-schema eos] [--errors-table T] [--json]
    python -m sinks.postgres.status recover --dsn URL --sink-id ID [--apply]
    python -m sinks.postgres.status release --dsn URL --sink-id ID --yes
    python -m sinks.postgres.status errors  --dsn URL --errors-table T [--json]
    python -m sinks.postgres.status replay-errors --dsn URL --errors-table T --target TABLE [--batch N]

``status`` shows the owner of the sink id, the last decided batches and every in-doubt (prepared)
gid with its age and what recovery would do with it; with ``--errors-table`` each batch's
dead-letter rows. ``recover`` resolves in-doubt gids by the
decision log (commit what a decision names, roll back the rest); a dry run unless ``--apply``.
``release`` forgets which query owns the sink id (only when that query is gone for good).
``errors`` counts the rows a sink diverted to its dead-letter table (``errors.tolerance=all``) per
target, batch and error; ``replay-errors`` moves them back into the target once it was fixed, each row
leaving the dead-letter table in the transaction in which it reaches the target.

A failure (a bad ``--dsn``, a server that does not answer, a refused command) is one line on
stderr and exit code 2, never a traceback; no part of the password is ever printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from connectors.core.conninfo import scrub
from connectors.core.errors import ConfigError, EosError, FatalError
from sinks.postgres import deadletter
from sinks.postgres.connection import classify, connect
from sinks.postgres.options import ConnectionOptions, parse_table_name
from sinks.postgres.twophase.decisions import (
    DEFAULT_SCHEMA,
    ProtocolTables,
    list_prepared,
    max_prepared_transactions,
    sink_lock,
)
from sinks.postgres.twophase.recovery import resolve

__all__ = ["add_subparser", "main", "recover", "release", "sink_status"]


def _connect(dsn: str) -> psycopg.Connection:
    """Connect with ``dsn``; a bad one is a ConfigError naming 'dsn', an unreachable server a RetriableError."""
    return connect(ConnectionOptions(dsn=dsn), autocommit=True, application_name="spark-eos sinks")


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
    tables = ProtocolTables(schema)
    with _connect(dsn) as conn:
        tables.ensure(conn)
        owner = tables.owner(conn, sink_id)
        decisions = tables.recent(conn, sink_id, limit)
        refused: dict[int, int] | None = None
        if errors_table is not None:
            letters = parse_table_name(errors_table, option="--errors-table")
            refused = deadletter.per_batch(conn, letters, [d.batch_id for d in decisions], target)
        prepared = {str(p.gid): p for p in list_prepared(conn, sink_id)}
        plan = resolve(conn, tables, sink_id, dry_run=True)
        return {
            "sink_id": sink_id,
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


def recover(dsn: str, sink_id: str, *, schema: str = DEFAULT_SCHEMA, apply: bool = False) -> list[dict[str, Any]]:
    """Resolve the sink's in-doubt gids by the decision log; only a plan unless ``apply``."""
    tables = ProtocolTables(schema)
    with _connect(dsn) as conn:
        tables.ensure(conn)
        actions = resolve(conn, tables, sink_id, dry_run=not apply)
    return [{"gid": a.gid, "batch": a.batch, "action": a.action, "why": a.reason, "applied": apply} for a in actions]


def release(dsn: str, sink_id: str, *, schema: str = DEFAULT_SCHEMA) -> int:
    """Forget the sink id (owner, decisions, markers); refused while it has in-doubt gids."""
    tables = ProtocolTables(schema)
    with _connect(dsn) as conn:
        tables.ensure(conn)
        with sink_lock(conn, sink_id):
            pending = list_prepared(conn, sink_id)
            if pending:
                raise FatalError(
                    f"sink {sink_id!r} has {len(pending)} in-doubt prepared transaction(s); run "
                    f"`spark-eos sinks recover --sink-id {sink_id} --apply` first"
                )
            return tables.release(conn, sink_id)


def _print_status(info: dict[str, Any]) -> None:
    owner = info["owner"]
    print(
        f"sink {info['sink_id']}: last decided batch {info['last_batch']}, "
        f"owner {owner['identity'] + ' (run ' + str(owner['run_id']) + ')' if owner else '(none)'}, "
        f"max_prepared_transactions {info['max_prepared_transactions']}"
    )
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
            return 2

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
    actions = recover(args.dsn, args.sink_id, schema=args.eos_schema, apply=args.apply)
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
        done = deadletter.replay(conn, table, target, args.batch)
    print(f"{target}: {done.moved} row(s) moved from {table} into the target, {done.refused} refused again (kept)")
    return 0 if done.refused == 0 else 1


def _dsn(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", required=True, help="libpq URL or conninfo of the sink's database")


def _errors_common(p: argparse.ArgumentParser) -> None:
    _dsn(p)
    p.add_argument("--errors-table", required=True, help="the errors.table option of the sink")


def _common(p: argparse.ArgumentParser) -> None:
    _dsn(p)
    p.add_argument("--sink-id", required=True, help="the sink.id option of the query")
    p.add_argument("--eos-schema", default=DEFAULT_SCHEMA, help="the eos.schema option (default eos)")


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
    p.set_defaults(func=_cmd_recover)
    p = sub.add_parser("release", help="forget the owner of a sink id (to reuse it with a new checkpoint)")
    _common(p)
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=_cmd_release)
    p = sub.add_parser("errors", help="rows a sink diverted to its dead-letter table, per target, batch and error")
    _errors_common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_errors)
    p = sub.add_parser("replay-errors", help="move dead-letter rows back into the fixed target, exactly once")
    _errors_common(p)
    p.add_argument("--target", required=True, help="the table option of the sink whose rows to replay")
    p.add_argument("--batch", type=int, default=None, help="only this batch's rows (-1: a batch write's)")
    p.set_defaults(func=_cmd_replay_errors)


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sinks {status,recover,release,errors,replay-errors}`` to a CLI; each leaf sets ``func(args) -> exit code``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sinks", help="operate the Postgres sinks (status, recover, release, errors, replay-errors)"
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
