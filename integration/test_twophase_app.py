"""The streaming query the two-phase crash tests run (and kill) in a subprocess of its own group.

    python -m integration.test_twophase_app --dsn URL --table T --sink-id ID --checkpoint DIR \
        --input DIR --tag run3 [--mode append|upsert] [--extra key=value ...]

Source: JSON files ``{"id", "batch"}``, one file per micro-batch (``maxFilesPerTrigger=1``), so
batch n holds exactly file n's records and a replay reads the same records. Every row also carries
``tag`` (this run's name): a replay computes different rows than the attempt it replaces, so a test
can tell which attempt's rows became visible. Trigger AvailableNow: exit 0 once every file is done.
No test functions here; pytest collects nothing from this module.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m integration.test_twophase_app")
    for name in ("--dsn", "--table", "--sink-id", "--checkpoint", "--input", "--tag"):
        p.add_argument(name, required=True)
    p.add_argument("--mode", default="append", choices=("append", "upsert"))
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--extra", action="append", default=[])
    args = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # PySpark's worker daemon moves into a process group of its own: name ours, so that a
    # kill-group fault on an executor takes the driver JVM and this process down too.
    os.environ["EOS_FAULTS_PGID"] = str(os.getpgrp())
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sinks.postgres import Postgres2pcDataSource

    spark = (
        SparkSession.builder.master("local[2,2]")  # 2 task failures allowed: task retries happen
        .appName(f"twophase-{args.tag}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Postgres2pcDataSource)
    df = (
        spark.readStream.schema("id long, batch long")
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
        .repartition(args.partitions)
        .withColumn("tag", F.lit(args.tag))
    )
    writer = (
        df.writeStream.format("postgres-2pc")
        .option("dsn", args.dsn)
        .option("table", args.table)
        .option("sink.id", args.sink_id)
        .option("checkpointLocation", args.checkpoint)
        .option("retry.backoff", "50ms")
        .trigger(availableNow=True)
    )
    if args.mode == "upsert":
        writer = writer.option("mode", "upsert").option("key", "id").option("version", "batch")
    for kv in args.extra:
        key, _, value = kv.partition("=")
        writer = writer.option(key, value)
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:
        print(f"APP FAILED: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
