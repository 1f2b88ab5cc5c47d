"""Chaos runs: a pipeline killed N times at random moments and fault points while a producer writes.

    spark-eos chaos --pipeline 2pc --kills 100 --seed 7 --records 100000 [--json]
    spark-eos chaos --app myjob:build --sink-kind 2pc --kills 5 --payload key,amount
    python -m connectors.toolkit.chaos --pipeline 2pc --kills 5 --seed 1 --records 5000

``--pipeline`` runs one of our reference pipelines (from a clone); ``--app module:function`` runs
the user's own job (``connectors.toolkit.app_runner`` says what the function returns), from a wheel too.

Each kill is either a SIGKILL of the pipeline's whole process group at a random moment, or a
fault point (``eos_core.faults``) that kills the group from inside the sink or the source at a
random protocol step. The pipeline restarts from its checkpoint after each kill; when the producer
is done, a last run drains the topic (AvailableNow) and the checker compares the sink to the
topic. Everything random comes from ``--seed``: the same seed gives the same schedule of kinds,
points and delays (the exact batch a kill hits still depends on timing).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Iterable
from typing import Any

from connectors.toolkit import oracle
from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, PIPELINES, SINK_KINDS, ChaosConfig
from connectors.toolkit.chaos.experiment import minimise, reproduce_command, run, write_results
from connectors.toolkit.chaos.inputs import refuse_for_sink_kind
from connectors.toolkit.chaos.workload import load_generator
from eos_core.errors import ConfigError

__all__ = ["add_subparser", "main"]


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``chaos`` command to an argparse subparsers object (``spark-eos chaos``)."""
    p = subparsers.add_parser(
        "chaos",
        help="kill a pipeline N times while a producer writes, then check exactly-once",
        description=__doc__.split("\n")[0],
    )
    _arguments(p)
    p.set_defaults(func=_command)
    return p  # type: ignore[no-any-return]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pipeline", choices=PIPELINES, default=None, help="which reference pipeline to run (default 2pc)")
    p.add_argument(
        "--app", default=None, help="module:function building YOUR query instead (see connectors.toolkit.app_runner)"
    )
    p.add_argument(
        "--sink-kind",
        choices=SINK_KINDS,
        default="2pc",
        help="with --app: the job's sink, which picks the fault points and checks (default 2pc; "
        "foreachbatch: points around your foreachBatch function, before Spark's commit; kafka / "
        "kafka-partition: the kafka-eos sink with visibility=batch / partition, writing job.out_topic, "
        "which is read back read_committed)",
    )
    p.add_argument("--id-field", default="id", help="with --app: the record field / column identifying a record")
    p.add_argument("--payload", default="", help="with --app: comma-separated fields the table must hold unchanged")
    p.add_argument("--option", action="append", default=[], help="with --app: key=value handed to the job")
    p.add_argument(
        "--dead-letters",
        default=None,
        help="with --app: the job sink's errors.table ('{table}' stands for the run's table, e.g. {table}_refused), "
        "or with --sink-kind kafka* its errors.topic (the run creates it); a record there counts as delivered "
        "(each record once in the table or topic, or in the dead letters)",
    )
    p.add_argument(
        "--generator",
        default=None,
        metavar="MODULE:FUNCTION",
        help="with --app: YOUR records: records(seed, n) yields (key, value[, headers[, partition[, timestamp]]]) "
        "or dicts with key, value, headers, partition, timestamp (ms), topic (several topics: job.topics)",
    )
    p.add_argument(
        "--records-file",
        default=None,
        metavar="PATH",
        help="with --app: YOUR sample records: *.jsonl one {key, value, timestamp, topic...} object a line, "
        "*.avro an Avro container file (each record's value plain Avro binary, what from_avro reads), "
        "any other file one raw value a line (the first --records of them)",
    )
    p.add_argument(
        "--oracle",
        default=None,
        metavar="append|upsert:KEY[,KEY]",
        help="with --app: judge the table against fault-free reference runs of the job (availableNow, "
        "fresh checkpoint, table <table>_ref1..), as multisets (append) or by key (upsert)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="with --oracle: float columns may differ this much (relative and absolute; default 0: exact)",
    )
    p.add_argument("--ignore-columns", default="", help="with --oracle: comma-separated columns allowed to differ")
    p.add_argument(
        "--reference-runs",
        type=int,
        default=2,
        help="with --oracle: fault-free runs (default 2: they must agree, else the verdict is CANNOT JUDGE)",
    )
    p.add_argument(
        "--only-kills",
        default=None,
        metavar="I,J",
        help="run only these kills (numbered from 0) of the seed's schedule: what --minimise prints",
    )
    p.add_argument(
        "--minimise",
        action="store_true",
        help="when the run fails, re-run the seed dropping kills one at a time; print the smallest "
        "failing schedule and the command reproducing it",
    )
    p.add_argument(
        "--kills",
        type=int,
        default=10,
        help="how many faults the schedule has (default 10; all kills unless --faults says otherwise)",
    )
    p.add_argument(
        "--faults",
        default=None,
        metavar="KIND:WEIGHT,...",
        help="the fault kinds drawn and their weights (default kill:1,fault-point:1); kinds: "
        + ", ".join(kinds.KINDS)
        + " (docs/guarantees.md, chaos-test your own job)",
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="also write report.html (timeline, findings, the oracle's first differing rows; no network) "
        "and junit.xml (one test case per check) into DIR",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the kill schedule and the records (default 1)")
    p.add_argument("--records", type=int, default=10_000, help="records the producer writes (default 10000)")
    p.add_argument("--partitions", type=int, default=2, help="topic partitions (default 2)")
    p.add_argument("--max-offsets", type=int, default=1000, help="maxOffsetsPerTrigger (default 1000)")
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("EOS_KAFKA_BOOTSTRAP"),
        help="Kafka (default: EOS_KAFKA_BOOTSTRAP, else embedded)",
    )
    p.add_argument(
        "--dsn", default=os.environ.get("EOS_POSTGRES_DSN"), help="Postgres (default: EOS_POSTGRES_DSN, else embedded)"
    )
    p.add_argument("--workdir", default=None, help="checkpoint, logs and fault log (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _oracle_args(args: argparse.Namespace) -> tuple[str | None, tuple[str, ...]]:
    """``--oracle`` parsed (mode, key), its tuning flags checked."""
    mode: str | None = None
    key: tuple[str, ...] = ()
    if args.oracle:
        try:
            mode, key = oracle.parse_mode(args.oracle)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if args.tolerance < 0 or args.tolerance != args.tolerance:
        raise ConfigError(f"--tolerance {args.tolerance}: a number >= 0 (e.g. 1e-9)")
    if args.reference_runs < 1:
        raise ConfigError(
            f"--reference-runs {args.reference_runs}: at least 1 (2, the default, also checks the job is deterministic)"
        )
    given = {
        "--tolerance": args.tolerance != 0,
        "--ignore-columns": bool(args.ignore_columns),
        "--reference-runs": args.reference_runs != 2,
    }
    for flag, used in given.items():
        if used and not args.oracle:
            raise ConfigError(f"{flag} tunes the oracle's comparison: it needs --oracle append|upsert:KEY")
    return mode, key


def _only_kills(args: argparse.Namespace) -> tuple[int, ...] | None:
    only = None
    if args.only_kills is not None:
        try:
            only = tuple(sorted({int(x) for x in args.only_kills.split(",")}))
        except ValueError:
            raise ConfigError(f"--only-kills {args.only_kills!r}: comma-separated kill numbers, e.g. 0,3") from None
        if any(not 0 <= i < args.kills for i in only):
            raise ConfigError(
                f"--only-kills {args.only_kills}: kill numbers from 0 to {args.kills - 1} (--kills {args.kills})"
            )
    if args.minimise and (len(only) if only is not None else args.kills) < 2:
        raise ConfigError("--minimise drops kills one at a time: it needs at least 2 (--kills)")
    return only


def _workload_args(args: argparse.Namespace) -> None:
    for name in ("generator", "records_file", "oracle"):
        if getattr(args, name) and not args.app:
            raise ConfigError(
                f"--{name.replace('_', '-')} needs --app (the reference pipelines make their own records)"
            )
    if args.sink_kind != "2pc" and not args.app:
        raise ConfigError(
            f"--sink-kind {args.sink_kind} needs --app (your job, whose sink it names); the reference pipelines "
            "(--pipeline) have their own sinks"
        )
    if args.generator and args.records_file:
        raise ConfigError("--generator and --records-file: pick one (a function making records, or a file of them)")
    if args.records_file and not os.path.isfile(args.records_file):
        raise ConfigError(f"--records-file {args.records_file!r}: no such file")
    if args.generator:
        load_generator(args.generator)  # a bad module or function: refused before any service starts


def _command(args: argparse.Namespace) -> int:
    for name in ("kills", "records", "partitions", "max_offsets"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.app and args.pipeline:
        raise SystemExit("--app and --pipeline: pick one (your job, or one of our reference pipelines)")
    bad = [kv for kv in args.option if "=" not in kv]
    if bad:
        raise SystemExit(f"--option {bad[0]!r}: expected key=value")
    mode, key = _oracle_args(args)
    _workload_args(args)
    only = _only_kills(args)
    weights = kinds.parse_faults(args.faults)
    named_kafka = _named(args.bootstrap, "EOS_KAFKA_BOOTSTRAP", "--bootstrap")
    named_pg = _named(args.dsn, "EOS_POSTGRES_DSN", "--dsn")
    if args.app:  # before the general refusals: a Kafka sink job's say more
        refuse_for_sink_kind(args.sink_kind, weights, dsn=args.dsn, dead_letters=args.dead_letters)
    kinds.refuse_unsupported(
        weights, kafka_named=named_kafka, postgres_named=named_pg, dsn=args.dsn, partitions=args.partitions
    )
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        raise ConfigError(f"--report {args.report!r}: a file is there; name a directory (it is created if missing)")
    # a broker of the run's own when the faults restart it or cut it (kinds.FaultKit starts it)
    own_broker = any(k in weights for k in (*kinds.BROKER, *kinds.KAFKA_NET))
    # a job writing with the kafka-eos sink gets no Postgres unless --dsn (or EOS_POSTGRES_DSN) names one
    kafka_job = bool(args.app) and args.sink_kind in KAFKA_SINK_KINDS
    stack, pg_service = _services(args, kafka=not own_broker, postgres=not kafka_job)
    try:
        workdir = args.workdir or tempfile.mkdtemp(prefix="eos-chaos-")
        cfg = ChaosConfig(
            pipeline=args.pipeline or "2pc",
            kills=args.kills,
            seed=args.seed,
            records=args.records,
            bootstrap=args.bootstrap,
            dsn=args.dsn,
            workdir=workdir,
            partitions=args.partitions,
            max_offsets=args.max_offsets,
            progress=not args.quiet,
            app=args.app,
            sink_kind=args.sink_kind,
            id_field=args.id_field,
            payload_fields=tuple(f for f in args.payload.split(",") if f),
            options=dict(kv.split("=", 1) for kv in args.option),
            dead_letters=args.dead_letters,
            generator=args.generator,
            records_file=args.records_file,
            oracle=mode,
            oracle_key=key,
            tolerance=args.tolerance,
            ignore_columns=tuple(c.strip() for c in args.ignore_columns.split(",") if c.strip()),
            reference_runs=args.reference_runs,
            only_kills=only,
            faults=weights,
            postgres_service=pg_service,
            kafka_named=named_kafka,
            postgres_named=named_pg,
        )
        report = run(cfg)
        if args.minimise and not report.ok and report.info.get("verdict") != oracle.CANNOT_JUDGE:
            if not args.quiet:
                print(f"minimising: re-running seed {cfg.seed} dropping kills one at a time", file=sys.stderr)
            minimise(cfg, report)
        write_results(report, cfg)
        if args.report:
            from connectors.toolkit import report as report_files

            written = report_files.write(
                report, cfg.workdir, args.report, command=reproduce_command(cfg, cfg.only_kills)
            )
            if not args.quiet:
                print(f"report: {' '.join(written)}", file=sys.stderr)
        print(report.to_json() if args.json else report.table())
        return 0 if report.ok else 1
    finally:
        for stop in reversed(stack):
            stop()


def _named(value: str | None, env: str, flag: str) -> str | None:
    """Where the user named a service (``flag`` or ``env``), None when nothing names it."""
    if not value:
        return None
    return env if value == os.environ.get(env) else flag


def _services(args: argparse.Namespace, *, kafka: bool = True, postgres: bool = True) -> tuple[list[Any], Any]:
    """Use the named services, else start embedded ones (stopped when the run ends); the Postgres
    service object when spark-eos runs it (the server faults stop and start it). ``kafka=False``:
    no broker (the run starts one of its own, for the broker faults); ``postgres=False``: no Postgres
    unless one is named (a job that writes only to Kafka)."""
    stops: list[Any] = []
    from connectors import services

    if not args.bootstrap and kafka:
        broker = services.kafka()
        stops.append(broker.stop)
        args.bootstrap = broker.bootstrap
    pg = None
    if not args.dsn and postgres:
        pg = services.postgres()
        stops.append(pg.stop)
        args.dsn = pg.dsn
    args.bootstrap = args.bootstrap or ""
    args.dsn = args.dsn or ""
    return stops, pg


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connectors.toolkit.chaos", description=__doc__.split("\n")[0])
    _arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _command(args)
    except ConfigError as exc:
        print(f"chaos: config error: {exc}", file=sys.stderr)
        return 64


if __name__ == "__main__":
    sys.exit(main())
