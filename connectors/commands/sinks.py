"""``spark-eos sinks``: the operator commands of the Postgres sinks (``sinks.postgres.status`` does the work).

    spark-eos sinks status  --dsn URL --sink-id ID [--eos-schema eos] [--errors-table T] [--json]
    spark-eos sinks recover --dsn URL --sink-id ID [--apply] [--never-decided]
    spark-eos sinks release --dsn URL --sink-id ID --yes
    spark-eos sinks resolve-lost --dsn URL --sink-id ID --batch N (--take-back | --finish) --yes
    spark-eos sinks retire  --dsn URL --sink-id ID --yes
    spark-eos sinks prune   --dsn URL --sink-id ID --keep N [--checkpoint LOCATION] --yes
    spark-eos sinks errors  --dsn URL --errors-table T [--json]
    spark-eos sinks replay-errors --dsn URL --errors-table T --target TABLE [--batch N] [--force]

(also ``python -m connectors.commands.sinks ...``). What each does: ``sinks.postgres.status``.

A failure is one line on stderr, never a traceback, and no part of the password is ever printed:
exit code 64 for a bad argument (a malformed ``--dsn``, a ``--sink-id`` nothing in the database
knows), 2 for a server that does not answer or a refused command. ``--dsn`` defaults to
``$EOS_POSTGRES_DSN``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from connectors.commands import group, standalone
from eos_core.conninfo import scrub
from eos_core.errors import ConfigError, EosError
from sinks.postgres.connection import classify
from sinks.postgres.options import parse_table_name
from sinks.postgres.status import (
    EXIT_CONFIG,
    error_summary,
    prune,
    recover,
    release,
    replay_errors,
    resolve_lost,
    retire,
    sink_status,
)
from sinks.postgres.twophase.decisions import DEFAULT_SCHEMA

__all__ = ["add_subparser", "main"]


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
    rows = error_summary(args.dsn, args.errors_table)
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
    done = replay_errors(args.dsn, args.errors_table, args.target, args.batch, force=args.force)
    table = parse_table_name(args.errors_table, option="--errors-table")
    target = parse_table_name(args.target, option="--target")
    print(
        f"{target}: {done.moved} row(s) moved from {table} into the target ({done.superseded} of them superseded by "
        f"a newer version or a later delete, not written), {done.refused} refused again (kept), {done.kept} kept "
        "unwritten (the target has a row with their key and no version column orders them: --force overwrites)"
    )
    return 0 if done.refused == 0 and done.kept == 0 else 1


def _dsn(p: argparse.ArgumentParser) -> None:
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
    return group(
        subparsers,
        "sinks",
        "operate the Postgres sinks (status, recover, release, resolve-lost, retire, prune, errors, replay-errors)",
        "sinks_command",
        _add_commands,
    )


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m connectors.commands.sinks", __doc__, "sinks_command", _add_commands, argv)


if __name__ == "__main__":
    sys.exit(main())
