"""The crash matrix's reference pipeline: Kafka JSON records -> parse -> a sink, run as its own process.

    python -m integration.harness.runner --sink 2pc|upsert|stateful|broken --bootstrap HOST:PORT \
        --topic T --dsn URL --table TBL --checkpoint DIR [--kafka-config FILE] [--sink-id ID] [--max-offsets N] ...

Records are JSON objects ``{"id": str, "key": str, "amount": int, ...}``. Sinks:

- ``2pc``: ``postgres-2pc`` append into ``table`` (id, key, amount, src_partition, src_offset);
- ``upsert``: ``postgres-upsert`` keyed by ``id`` into ``table``;
- ``stateful``: ``groupBy(key)`` sum/count (update mode) through the upsert sink's foreachBatch
  adapter into ``table`` (key, total, events);
- ``kafka``: the ``kafka-eos`` sink into the topic ``table`` (created with 2 partitions when missing),
  key = the record's key, value = the JSON of (id, key, amount, src_partition, src_offset);
- ``broken``: a deliberately wrong sink that commits each task's rows directly (at-least-once),
  used to prove that the crash matrix's checker bites.

A malformed record stops the query with an error naming its topic, partition and offset (the
documented policy: never a silent drop). Exit code 0 when the trigger drained the topic, 2 on a
query failure (the error is printed last on stderr, prefixed ``RUNNER FAILED:``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from connectors.launch import pyspark_daemon
from connectors.toolkit.app_runner import executor_env, mark_process_group, serve, with_trigger
from eos_core import faults

__all__ = ["SINKS", "build_parser", "create_tables", "main"]

SINKS = ("2pc", "upsert", "stateful", "broken", "kafka")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m integration.harness.runner", description=__doc__.split("\n")[0])
    p.add_argument("--sink", choices=SINKS, required=True)
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    p.add_argument(
        "--kafka-config",
        default=None,
        help="the job's Kafka client properties (Java names: security.protocol, sasl.*, ssl.*), given to its source "
        "and Kafka sink as kafka.* options (default: none, a plaintext broker)",
    )
    p.add_argument("--topic", required=True)
    p.add_argument("--dsn", required=True, help="Postgres DSN the sink writes through (may be a proxy)")
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--sink-id", default=None, help="postgres-2pc sink.id (default: the table name)")
    p.add_argument("--max-offsets", type=int, default=500, help="maxOffsetsPerTrigger (several batches)")
    p.add_argument("--trigger", default="available-now", help="available-now | processing:SECONDS")
    p.add_argument("--master", default="local[2,2]", help="Spark master (local-cluster[2,1,1024] for F6)")
    p.add_argument("--partitions", type=int, default=2, help="spark.sql.shuffle.partitions")
    p.add_argument("--fail-on-data-loss", default="true")
    p.add_argument("--isolation", default="read_committed", help="kafka.isolation.level")
    p.add_argument("--timeout", type=float, default=600.0, help="give up (exit 3) after this many seconds")
    p.add_argument("--extra", action="append", default=[], help="extra sink option key=value (repeatable)")
    p.add_argument("--conf", action="append", default=[], help="a Spark setting key=value (repeatable; chaos --faults)")
    p.add_argument(
        "--remote",
        default=None,
        help="a Spark Connect server (sc://host:port) to run the query in, instead of a Spark of this process; the "
        "fault spec (EOS_FAULTS) and the Postgres password (PGPASSWORD) travel as the connectors' options",
    )
    return p


def create_tables(dsn: str, sink: str, table: str, bootstrap: str = "") -> None:
    """Create the target table (idempotent): the sink's expected schema, primary key where keyed; for the
    Kafka sink, its topic."""
    import psycopg

    if sink == "kafka":
        from confluent_kafka import KafkaError, KafkaException

        from connectors.toolkit.chaos import create_topic

        try:
            create_topic(bootstrap, table, 2)
        except KafkaException as exc:  # a restarted run finds it
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        return
    if sink == "stateful":
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, total bigint NOT NULL, events bigint NOT NULL)"
        )
    elif sink == "upsert":
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, key text, amount bigint, "
            "src_partition integer, src_offset bigint)"
        )
    else:  # 2pc and broken append: no key, so a duplicate shows as a second row
        ddl = f"CREATE TABLE IF NOT EXISTS {table} (id text, key text, amount bigint, src_partition integer, src_offset bigint)"
    from sinks.postgres.connection import ddl_lock

    # F16 starts two runners at once: unguarded, CREATE TABLE IF NOT EXISTS fails in one of them
    with psycopg.connect(dsn, autocommit=True) as conn, ddl_lock(conn):
        conn.execute(ddl)


def _spark(args: argparse.Namespace) -> Any:
    if args.remote:
        return _register(_remote(args), args)
    # On a local master Spark's Python processes (workers, planner) run this interpreter, as the chaos toolkit's
    # app runner has them do: unset, they ran `python3` from PATH (on a pyenv machine its shim's bash scripts
    # before each, and another interpreter that found the packages only through PYTHONPATH)
    if args.master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(args.master)
        .appName(f"eos-runner-{args.sink}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
    )
    if args.master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "512m")
    for key, value in {
        **pyspark_daemon.CONF,
        **executor_env(args.master),
        **dict(kv.split("=", 1) for kv in args.conf),
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return _register(spark, args)


def _remote(args: argparse.Namespace) -> Any:
    """A Spark Connect session on ``--remote``: the server's Spark (its master, its Python) runs the query; the
    session's SQL settings are the run's."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    for key, value in (kv.split("=", 1) for kv in args.conf):
        spark.conf.set(key, value)
    return spark


def _register(spark: Any, args: argparse.Namespace) -> Any:
    # register only what this run needs, so one sink's pipeline never depends on the other sink
    from sources.kafka import KafkaEosDataSource

    spark.dataSource.register(KafkaEosDataSource)
    if args.sink == "2pc":
        from sinks.postgres import Postgres2pcDataSource

        spark.dataSource.register(Postgres2pcDataSource)
    elif args.sink == "upsert":
        from sinks.postgres import PostgresUpsertDataSource

        spark.dataSource.register(PostgresUpsertDataSource)
    return spark


def _parsed(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.format("kafka-eos")
        .options(**_kafka_options(args))
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .option("failOnDataLoss", args.fail_on_data_loss)
        .option("kafka.isolation.level", args.isolation)
        .options(**_remote_options(args, source=True))
        .load()
    )
    schema = "id string, key string, amount long"
    rec = F.from_json(F.col("value").cast("string"), schema)
    where = F.concat(
        F.lit("malformed record (not a JSON object with a string id) at topic "),
        F.col("topic"),
        F.lit(" partition "),
        F.col("partition").cast("string"),
        F.lit(" offset "),
        F.col("offset").cast("string"),
        F.lit(": stopping rather than dropping it; fix or remove the record, or move the start offset past it"),
    )
    # raise_error inside the projection of id: a poison record fails its task (and so the query)
    checked_id = F.when(rec.isNull() | rec["id"].isNull(), F.raise_error(where)).otherwise(rec["id"])
    return raw.select(
        checked_id.alias("id"),
        rec["key"].alias("key"),
        rec["amount"].alias("amount"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
    )


def _kafka_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``kafka.*`` options of the job's source and Kafka sink: the bootstrap and ``--kafka-config``'s settings."""
    from eos_core.kafka_config import kafka_options

    return kafka_options(args.bootstrap, args.kafka_config)


def _remote_options(args: argparse.Namespace, *, source: bool = False) -> dict[str, str]:
    """Over Spark Connect the query runs in the server's processes, which see none of this process's environment:
    the run's fault spec goes to each connector as its ``faults`` option, and the sink gets the Postgres password
    as its ``password`` option (Spark redacts it by key). Nothing on a Spark of this process."""
    if not args.remote:
        return {}
    options = {"faults": os.environ[faults.ENV_SPEC]} if os.environ.get(faults.ENV_SPEC) else {}
    if not source and args.sink != "kafka" and os.environ.get("PGPASSWORD"):
        options["password"] = os.environ["PGPASSWORD"]
    return options


def _broken_batch(dsn: str, table: str) -> Any:
    """foreachBatch that INSERTs and commits inside each task: at-least-once, duplicates on replay."""

    def write(batch_df: Any, batch_id: int) -> None:
        def part(rows: Any) -> None:
            import psycopg

            with psycopg.connect(dsn) as conn:
                with conn.cursor() as cur:
                    for r in rows:
                        cur.execute(
                            f"INSERT INTO {table} (id, key, amount, src_partition, src_offset) VALUES (%s,%s,%s,%s,%s)",
                            (r.id, r.key, r.amount, r.src_partition, r.src_offset),
                        )
                conn.commit()

        batch_df.foreachPartition(part)
        # the same driver-side point the real sinks pass once every row is committed
        faults.point("sink.after_commit", batch=batch_id)

    return write


def _query(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    df = _parsed(spark, args)
    sink_id = args.sink_id or args.table.replace(".", "_")
    extra = dict(kv.split("=", 1) for kv in args.extra)
    if args.sink == "stateful":
        agg = df.groupBy("key").agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("events"))
        extra.update(_remote_options(args))
        writer = agg.writeStream.outputMode("update").foreachBatch(_stateful_batch(args.dsn, args.table, extra))
    elif args.sink == "broken":
        writer = df.writeStream.foreachBatch(_broken_batch(args.dsn, args.table))
    elif args.sink == "kafka":
        row = F.to_json(F.struct("id", "key", "amount", "src_partition", "src_offset"))
        writer = df.select(F.col("key"), row.alias("value")).writeStream.format("kafka-eos")
        writer = writer.options(**_kafka_options(args)).option("topic", args.table)
        writer = writer.option("sink.id", sink_id).options(**_remote_options(args))
        for k, v in extra.items():
            writer = writer.option(k, v)
    else:
        fmt = "postgres-2pc" if args.sink == "2pc" else "postgres-upsert"
        writer = df.writeStream.format(fmt).option("dsn", args.dsn).option("table", args.table)
        writer = writer.option("sink.id", sink_id) if args.sink == "2pc" else writer.option("key", "id")
        writer = writer.options(**_remote_options(args))
        for k, v in extra.items():
            writer = writer.option(k, v)
    return with_trigger(writer.option("checkpointLocation", args.checkpoint), args.trigger).start()


def _stateful_batch(dsn: str, table: str, extra: dict[str, str]) -> Any:
    """The upsert sink's foreachBatch adapter, between the driver-side points of a batch."""
    import connectors

    write = connectors.upsert_batch(dsn=dsn, table=table, key="key", **extra)

    spec = extra.get("faults")  # over Spark Connect this function runs in the server, without the run's EOS_FAULTS

    def batch(df: Any, batch_id: int) -> None:
        faults.point("pipeline.batch", spec=spec, batch=batch_id)
        write(df, batch_id)
        # every task committed, Spark's commits/n not yet written: the window replays must cover
        faults.point("sink.after_commit", spec=spec, batch=batch_id)

    return batch


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.remote:  # a Connect server's fault points kill the server's group (its own EOS_FAULTS_PGID)
        mark_process_group()  # before the JVM starts: kill-group fault points in executors need it
    create_tables(args.dsn, args.sink, args.table, args.bootstrap)
    spark = _spark(args)
    return serve(lambda: _query(spark, args), args.timeout)


if __name__ == "__main__":
    sys.exit(main())
