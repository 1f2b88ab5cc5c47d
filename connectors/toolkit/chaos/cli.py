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
from collections.abc import Callable, Iterable
from typing import Any

from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import PIPELINES, SINK_KINDS
from connectors.toolkit.chaos.experiment import conduct
from connectors.toolkit.chaos.inputs import named_by, prepare
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
    _job_arguments(p)
    _workload_arguments(p)
    _run_arguments(p)


def _job_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--connect",
        action="store_true",
        help="with --app: run your job as a Spark Connect client (SparkSession.builder.remote) of a Connect server "
        "each run starts on loopback, its driver; the kills take the server with the job (needs spark-eos[connect])",
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


def _workload_arguments(p: argparse.ArgumentParser) -> None:
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
        "--value-format",
        choices=("json", "avro"),
        default="json",
        help="with --app: the records' values as JSON objects (default), or avro: each written in a Schema "
        "Registry's wire format with --schema under <topic>-value (your job reads value.format=avro); the "
        "checker reads them back with confluent-kafka's deserializer",
    )
    p.add_argument(
        "--schema", default=None, metavar="FILE", help="with --value-format avro: the records' schema (.avsc)"
    )
    p.add_argument(
        "--schema-registry",
        default=None,
        metavar="URL",
        help="with --value-format avro: the registry (default: EOS_SCHEMA_REGISTRY_URL, which spark-eos services "
        "up --with-registry sets); the job gets it as job.registry_options",
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


def _run_arguments(p: argparse.ArgumentParser) -> None:
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
        "--app-kafka-config",
        default=None,
        metavar="FILE",
        help="the job's Kafka client properties, when it runs as another principal than the toolkit's own clients "
        "(default: --kafka-config's file)",
    )
    p.add_argument(
        "--dsn", default=os.environ.get("EOS_POSTGRES_DSN"), help="Postgres (default: EOS_POSTGRES_DSN, else embedded)"
    )
    p.add_argument("--workdir", default=None, help="checkpoint, logs and fault log (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _command(args: argparse.Namespace) -> int:
    """``spark-eos chaos``: the flags' syntax read here, everything else checked by ``inputs.prepare``."""
    bad = [kv for kv in args.option if "=" not in kv]
    if bad:
        raise ConfigError(f"--option {bad[0]!r}: expected key=value")
    services = _Started()
    try:
        cfg = prepare(
            services,
            pipeline=args.pipeline,
            app=args.app,
            sink_kind=args.sink_kind,
            kills=args.kills,
            seed=args.seed,
            records=args.records,
            partitions=args.partitions,
            max_offsets=args.max_offsets,
            faults=args.faults,
            bootstrap=args.bootstrap,
            kafka_named=named_by(args.bootstrap, "EOS_KAFKA_BOOTSTRAP", "--bootstrap"),
            app_kafka_config=args.app_kafka_config,
            dsn=args.dsn,
            postgres_named=named_by(args.dsn, "EOS_POSTGRES_DSN", "--dsn"),
            workdir=args.workdir or tempfile.mkdtemp(prefix="eos-chaos-"),
            options=dict(kv.split("=", 1) for kv in args.option),
            id_field=args.id_field,
            payload=_names(args.payload),
            dead_letters=args.dead_letters,
            generator=args.generator,
            records_file=args.records_file,
            oracle=args.oracle,
            tolerance=args.tolerance,
            ignore_columns=_names(args.ignore_columns),
            reference_runs=args.reference_runs,
            only_kills=_kill_numbers(args.only_kills),
            minimise=args.minimise,
            report_dir=args.report,
            progress=not args.quiet,
            connect=args.connect,
            value_format=args.value_format,
            schema=args.schema,
            schema_registry=args.schema_registry,
        )
        report = conduct(cfg)
        print(report.to_json() if args.json else report.table())
        return 0 if report.ok else 1
    finally:
        services.stop()


def _names(text: str) -> tuple[str, ...]:
    return tuple(f.strip() for f in text.split(",") if f.strip())


def _kill_numbers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--only-kills {text!r}: comma-separated kill numbers, e.g. 0,3") from None


class _Started:
    """The services the command starts when none is named (embedded processes, or containers where a Docker
    engine answers: ``connectors.services``), stopped when the run ends."""

    def __init__(self) -> None:
        self._stops: list[Callable[[], None]] = []

    def kafka(self) -> Any:
        from connectors import services

        broker = services.kafka()
        self._stops.append(broker.stop)
        return broker

    def postgres(self) -> Any:
        from connectors import services

        pg = services.postgres()
        self._stops.append(pg.stop)
        return pg

    def stop(self) -> None:
        for stop in reversed(self._stops):
            stop()


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
