"""The ``spark-eos`` command: demo, run, inspect, savepoint, verify, services, sinks, kafka-sink, chaos.

Each command's module is imported only when that command runs, so ``spark-eos --help`` is fast.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from eos_core.kafka_config import client_settings

__all__ = ["build_parser", "main"]

EXIT_CONFIG = 64  # EX_USAGE: a bad command line or config file
EXIT_ERROR = 2  # a service failed, a command was refused, or anything unexpected


class _Parser(argparse.ArgumentParser):
    """argparse with spark-eos's usage errors: one line on stderr, exit 64 (argparse's own is usage + 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _run_cmd(args: argparse.Namespace) -> int:
    from connectors.pipelines import load_config, require_extras
    from connectors.pipelines.supervisor import run

    require_extras()
    overrides: dict[str, Any] = {}
    for name in ("trigger", "checkpoint", "master", "restart"):
        if getattr(args, name, None):
            overrides[name] = getattr(args, name)
    if args.log_format:
        overrides["log_format"] = args.log_format
    if args.no_progress:
        overrides["progress"] = False
    cfg = load_config(args.config, pipeline=args.pipeline, overrides=overrides or None)
    if cfg.pipeline != args.pipeline:
        raise _usage(f"--config {args.config} is for pipeline {cfg.pipeline!r}, not {args.pipeline!r}")
    return run(cfg)


def _inspect_cmd(args: argparse.Namespace) -> int:
    from connectors.inspect import inspect, render

    info = inspect(args.checkpoint, dsn=args.dsn, sink_id=args.sink_id, eos_schema=args.eos_schema)
    print(render(info, as_json=args.json))
    return 0


def _savepoint_errors(what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A savepoint refusal (no such checkpoint, a target that exists, a damaged savepoint) as a ConfigError."""
    from eos_core.errors import ConfigError

    try:
        return fn()
    except (ValueError, OSError) as exc:
        text = f"{exc.strerror}: {exc.filename!r}" if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"savepoint {what}: {text}") from None


def _must_exist(what: str, name: str, path: str) -> None:
    from eos_core.errors import ConfigError

    if not os.path.isdir(path):
        raise ConfigError(f"savepoint {what}: {name} {path!r} does not exist or is not a directory", option=name)


def _savepoint_create(args: argparse.Namespace) -> int:
    from connectors.savepoint import create

    _must_exist("create", "CHECKPOINT", args.checkpoint)
    manifest = _savepoint_errors(
        "create", lambda: create(args.checkpoint, args.dest, force=args.force, batch=args.batch)
    )
    print(
        f"savepoint {args.dest}: batches 0..{manifest['last_commit']} committed"
        f" ({manifest['files']} files, {manifest['bytes']} bytes) from {args.checkpoint}"
    )
    return 0


def _savepoint_restore(args: argparse.Namespace) -> int:
    from connectors.savepoint import restore

    _must_exist("restore", "DEST", args.savepoint)
    manifest = _savepoint_errors("restore", lambda: restore(args.savepoint, args.checkpoint, force=args.force))
    print(f"restored {args.savepoint} into {args.checkpoint}: the query resumes after batch {manifest['last_commit']}")
    if manifest.get("warning"):
        print(f"WARNING: {manifest['warning']}", file=sys.stderr)
    return 0


KAFKA_CHECK_TIMEOUT_S = 10.0
"""How long ``verify`` waits for the Kafka cluster to answer before saying it is unreachable."""
_BOOTSTRAP_SERVER = re.compile(r"(?:[A-Za-z_]+://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?")


def _check_bootstrap(bootstrap: str) -> None:
    """Refuse a --bootstrap that is not host:port[,host:port...] (ConfigError, exit 64)."""
    for server in bootstrap.split(","):
        m = _BOOTSTRAP_SERVER.fullmatch(server.strip())
        if not server.strip() or m is None or (m.group(1) is not None and not 0 < int(m.group(1)) < 65536):
            from eos_core.errors import ConfigError

            raise ConfigError(
                f"verify: --bootstrap {bootstrap!r} is not a Kafka bootstrap list: {server.strip()!r} is not "
                "host:port; give host:port[,host:port...] (e.g. 127.0.0.1:9092)",
                option="--bootstrap",
            )


def _check_topic(bootstrap: str, topic: str) -> None:
    """The cluster answers and ``topic`` exists on it, or one clear error (unreachable: exit 2; no topic: 64)."""
    from confluent_kafka import Consumer, KafkaException

    from eos_core.errors import ConfigError, EosError

    consumer = Consumer(
        {**client_settings(), "bootstrap.servers": bootstrap, "group.id": "spark-eos-verify-check", "log_level": 0}
    )
    try:
        try:
            meta = consumer.list_topics(topic, timeout=KAFKA_CHECK_TIMEOUT_S)
        except KafkaException as exc:
            raise EosError(
                f"verify: the Kafka cluster at --bootstrap {bootstrap} did not answer within "
                f"{KAFKA_CHECK_TIMEOUT_S:g}s ({exc.args[0].str() if exc.args else exc}); check the address "
                "and that the brokers are up"
            ) from None
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None:
            raise ConfigError(
                f"verify: --topic {topic!r} does not exist on {bootstrap}"
                + (f" ({tmeta.error.str()})" if tmeta is not None and tmeta.error is not None else "")
                + "; name the topic the pipeline reads",
                option="--topic",
            )
    finally:
        consumer.close()


def _verify_cmd(args: argparse.Namespace) -> int:
    from connectors.toolkit import checker
    from eos_core.conninfo import check_conninfo
    from eos_core.errors import ConfigError, FatalError

    check_conninfo(args.dsn, option="--dsn", context="verify")
    if not args.table and not args.balances_table:
        raise ConfigError(
            "verify: nothing to compare: give --table TABLE (one row per record; --id-column names what "
            "identifies one) or --balances-table TABLE; --sink-id alone checks no row",
            option="--table",
        )
    id_columns = checker.parse_id_columns(args.id_column) if args.id_column else None
    _check_bootstrap(args.bootstrap)
    _check_topic(args.bootstrap, args.topic)
    aggregates = None
    if args.balances_table:
        aggregates = {
            "table": args.balances_table,
            "key": "account",
            "value": "amount",
            "columns": {"balance": "sum", "events": "count"},
        }
    report = checker.verify(
        bootstrap=args.bootstrap,
        topic=args.topic,
        dsn=args.dsn,
        table=args.table or "",
        payload_fields=tuple(args.payload) if args.payload else None,
        sink_id=args.sink_id,
        checkpoint=args.checkpoint,
        decisions=bool(args.sink_id and args.checkpoint),
        aggregates=aggregates,
        dead_letters=args.dead_letters,
        poison_position=_poison_at(args.poison_at),
        id_columns=id_columns,
    )
    if args.table and not report.info.get("source_records"):
        raise FatalError(
            f"verify: topic {args.topic!r} holds no records to compare with table {args.table!r} (the table has "
            f"{report.info.get('sink_rows', 0)} rows); produce to it first, or name the topic the query reads"
        )
    print(report.to_json() if args.json else report.table())
    return 0 if report.ok else 1


def _poison_at(spec: str | None) -> Callable[[Any], tuple[int, int] | None] | None:
    """``--poison-at PART_COL,OFFSET_COL``: where a dead-letter row holds its record's Kafka position."""
    if not spec:
        return None
    cols = [c.strip() for c in spec.split(",")]
    if len(cols) != 2 or not all(cols):
        raise _usage(f"--poison-at {spec!r}: expected two column names, PARTITION_COLUMN,OFFSET_COLUMN")

    def position(row: Any) -> tuple[int, int] | None:
        try:
            return int(row[cols[0]]), int(row[cols[1]])
        except (KeyError, TypeError, ValueError):
            return None

    return position


def _demo_cmd(args: argparse.Namespace) -> int:
    from connectors.demo import main as demo_main
    from connectors.pipelines import require_extras

    require_extras()
    return demo_main(args)


def _usage(message: str) -> SystemExit:
    print(f"spark-eos: error: {message}", file=sys.stderr)
    return SystemExit(EXIT_CONFIG)


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job: embedded services, three pipelines killed and restarted, verdict",
        description="Start embedded Kafka and Postgres, produce payment events, run the ledger "
        "(two-phase commit), balances (keyed state + upsert) and transfers (Kafka -> Kafka through "
        "the kafka-eos sink) pipelines while killing them, then check exactly-once. Exit 0 only when "
        "it held.",
    )
    p.add_argument("--records", type=int, default=6000, help="payment events to produce (default 6000)")
    p.add_argument(
        "--kills",
        type=int,
        default=6,
        help="kills dealt round-robin to ledger, transfers, balances, alternating a SIGKILL and a fault "
        "point (default 6: one of each per pipeline)",
    )
    p.add_argument("--seed", type=int, default=7, help="seed of the events and the kill schedule (default 7)")
    p.add_argument("--partitions", type=int, default=2, help="topic partitions (default 2)")
    p.add_argument(
        "--poison",
        type=int,
        default=5,
        help="malformed records mixed into the topic; each pipeline puts each in its dead letters (default 5)",
    )
    p.add_argument(
        "--workdir", default=None, help="checkpoints, configs and logs (default: a temp dir, removed on success)"
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir even when the demo passes")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")
    p.set_defaults(func=_demo_cmd)


def _add_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a reference pipeline from a TOML/YAML config, restarting it on failure",
        description="Run PIPELINE (ledger | balances | transfers) as configured in --config; see configs/*.toml.",
    )
    p.add_argument(
        "pipeline",
        choices=("ledger", "balances", "transfers"),
        metavar="PIPELINE",
        help="ledger | balances | transfers",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="pipeline config (.toml, .yaml or .yml)")
    p.add_argument("--trigger", default=None, help="override spark.trigger (e.g. 2s, available-now)")
    p.add_argument("--checkpoint", default=None, help="override spark.checkpoint")
    p.add_argument("--master", default=None, help="override spark.master (e.g. local[*], local-cluster[2,1,1024])")
    p.add_argument(
        "--restart",
        default=None,
        metavar="STRATEGY",
        help="override restart.strategy: none | fixed-delay:N:D | exponential-backoff:I:M:X | "
        "failure-rate:N:INTERVAL:D",
    )
    p.add_argument("--log-format", choices=("text", "json"), default=None, help="structured log format")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.set_defaults(func=_run_cmd)


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="show a checkpoint: batches, source offsets, commit log, state store",
        description="Show a streaming checkpoint: each batch with its source offsets (the source's "
        "operator state), the commit log, the state store provider and versions; with --dsn also "
        "the two-phase sink's decision log and in-doubt transactions.",
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="the query's checkpoint directory")
    p.add_argument("--dsn", default=None, help="Postgres of a postgres-2pc sink: show its decision log")
    p.add_argument("--sink-id", default=None, help="only this sink id (default: every sink in the decision log)")
    p.add_argument("--eos-schema", default="eos", help="schema of the sink's protocol tables (default eos)")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")
    p.set_defaults(func=_inspect_cmd)


def _add_savepoint(sub: Any) -> None:
    p = sub.add_parser(
        "savepoint",
        help="copy a consistent checkpoint (create) or put one back (restore)",
        description="Savepoints: retained copies of a stopped query's checkpoint, consistent up to "
        "its last committed batch.",
    )
    ss = p.add_subparsers(dest="savepoint_command", required=True, metavar="{create,restore}")
    c = ss.add_parser("create", help="copy CHECKPOINT to DEST up to its last committed batch")
    c.add_argument("checkpoint", metavar="CHECKPOINT")
    c.add_argument("dest", metavar="DEST")
    c.add_argument("--force", action="store_true", help="replace DEST if it exists")
    c.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help="as of committed batch N instead of the last: the restored query replays the batches after N "
        "(those a database lost in a failover; postgres-2pc's refusal names N)",
    )
    c.set_defaults(func=_savepoint_create)
    r = ss.add_parser("restore", help="copy savepoint DEST into CHECKPOINT (a new or empty directory)")
    r.add_argument("savepoint", metavar="DEST")
    r.add_argument("checkpoint", metavar="CHECKPOINT")
    r.add_argument("--force", action="store_true", help="replace CHECKPOINT if it exists")
    r.set_defaults(func=_savepoint_restore)


def _add_verify(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check a topic against a table: duplicates, losses, aggregates, end state",
        description="Run the exactly-once checker: sink rows vs topic records by id, optional "
        "per-account balances, no prepared transaction left, decision log vs commit log.",
    )
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("EOS_KAFKA_BOOTSTRAP"),
        required=not os.environ.get("EOS_KAFKA_BOOTSTRAP"),
        help="Kafka bootstrap (default $EOS_KAFKA_BOOTSTRAP)",
    )
    p.add_argument("--topic", required=True)
    p.add_argument(
        "--dsn",
        default=os.environ.get("EOS_POSTGRES_DSN"),
        required=not os.environ.get("EOS_POSTGRES_DSN"),
        help="Postgres DSN (default $EOS_POSTGRES_DSN)",
    )
    p.add_argument("--table", default=None, help="table with one row per record (see --id-column)")
    p.add_argument(
        "--id-column",
        action="append",
        default=None,
        metavar="FIELD[=COLUMN][,...]",
        help="what identifies a record: a field of its JSON value and the table's column of it "
        "(default id=id); topic, partition, offset name the record's Kafka position, e.g. "
        "--id-column partition=src_partition,offset=src_offset",
    )
    p.add_argument("--balances-table", default=None, help="table of per-account balances to recompute and compare")
    p.add_argument("--payload", nargs="*", default=None, help="columns compared with the record (default: all shared)")
    p.add_argument(
        "--sink-id",
        default=None,
        help="postgres-2pc sink id: check its prepared transactions (without "
        "it: every eos sink's in the database) and decisions",
    )
    p.add_argument("--checkpoint", default=None, help="with --sink-id: last decision must equal the last commits/n")
    p.add_argument(
        "--dead-letters",
        default=None,
        help="the sink's errors.table: each record must be in exactly one of --table and this dead-letter table",
    )
    p.add_argument(
        "--poison-at",
        default=None,
        metavar="PART_COL,OFFSET_COL",
        help="with --dead-letters: the dead-letter rows' columns holding the Kafka partition and offset; "
        "each record that is not a JSON object must be there exactly once",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_verify_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spark-eos",
        description="Exactly-once Kafka -> Spark Structured Streaming -> Postgres. Start with: spark-eos demo",
    )
    from connectors import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--kafka-config",
        metavar="FILE",
        default=None,
        help="a Java client properties file (security.protocol, sasl.*, ssl.*) for every Kafka client of the "
        "command: verify, kafka-sink, run's lag probe, chaos, services (default: $EOS_KAFKA_CONFIG)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(sub)
    _add_run(sub)
    _add_inspect(sub)
    _add_savepoint(sub)
    _add_verify(sub)
    p = sub.add_parser(
        "submit-file",
        help="print the file to give spark-submit to run a spark-eos command",
        description="Print the path of the file spark-submit runs as the driver of a spark-eos "
        'command, e.g. spark-submit --master spark://h:7077 "$(spark-eos submit-file)" run ledger '
        "--config ledger.yaml (docs/deployment.md).",
    )
    p.set_defaults(func=_submit_file_cmd)
    # the command groups of their own modules (each imports only light dependencies at module level)
    from connectors.commands import doctor, kafka_sink, sinks
    from connectors.services import manage
    from connectors.toolkit.chaos import cli as chaos

    for module in (manage, sinks, kafka_sink, doctor, chaos):
        module.add_subparser(sub)
    return parser


def _submit_file_cmd(args: argparse.Namespace) -> int:
    import importlib.util

    # Found, not imported: spark_submit imports this module to run it.
    spec = importlib.util.find_spec("connectors.launch.spark_submit")
    assert spec is not None and spec.origin is not None
    print(spec.origin)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    from eos_core.conninfo import conninfo_error, conninfo_problem, conninfo_secrets, scrub
    from eos_core.errors import ConfigError, EosError

    # Second line of defence: whatever the error, its one line on stderr is scrubbed of the password
    # of a --dsn (read leniently: a malformed one too). Commands that own their errors (``sinks``)
    # already print one line and return 2.
    secrets = (*conninfo_secrets(getattr(args, "dsn", None)), getattr(args, "password", None))

    def fail(text: str) -> None:
        print(" ".join(scrub(text, *secrets).split()), file=sys.stderr)

    from eos_core.kafka_config import CONFIG_ENV

    before = os.environ.get(CONFIG_ENV)
    try:
        if args.kafka_config:  # every client of the command, the processes it starts too, read it from there
            from eos_core.kafka_config import read_properties

            read_properties(args.kafka_config)  # a file that cannot be read is refused before anything runs
            os.environ[CONFIG_ENV] = os.path.abspath(args.kafka_config)
        return int(args.func(args) or 0)
    except ConfigError as exc:
        fail(f"spark-eos: config error: {exc}")
        return EXIT_CONFIG
    except EosError as exc:
        fail(f"spark-eos: error: {type(exc).__name__}: {exc}")
        return 2
    except KeyboardInterrupt:
        print("spark-eos: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not type(exc).__module__.startswith("psycopg"):
            if os.environ.get("SPARK_EOS_TRACEBACK"):
                raise
            # Every command: any failure is one line, no traceback (an error from inside Spark: its cause).
            from eos_core.errors import error_cause

            fail(f"spark-eos {args.command}: error: {error_cause(exc)} (SPARK_EOS_TRACEBACK=1 shows where)")
            return EXIT_ERROR
        # A driver error, e.g. a --dsn libpq rejects: its text can quote the password (and a traceback
        # would print it twice). Say what is wrong with the dsn instead, or else one scrubbed line.
        dsn = getattr(args, "dsn", None)
        if isinstance(dsn, str) and conninfo_problem(dsn) is not None:
            fail(f"spark-eos: config error: {conninfo_error(dsn, option='dsn', context=args.command)}")
        else:
            fail(f"spark-eos: error: postgres: {type(exc).__name__}: {exc}")
        return 2
    finally:  # main() called as a function (tests, a wrapper) leaves the caller's environment as it was
        if before is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = before


if __name__ == "__main__":
    sys.exit(main())
