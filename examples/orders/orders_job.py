"""An example user job, chaos-tested with spark-eos's toolkit: orders from Kafka into Postgres.

Orders arrive as JSON (``{"id": "...", "key": "<customer>", "amount": <cents>}``); the job parses
them, stops on a malformed one (never drops it), tags each with a size band and its Kafka position,
and appends them to a table through ``postgres-2pc``: every order exactly once, in spite of any
crash. ``build`` returns the query unstarted: the chaos runner (or your own main) sets the
checkpoint and the trigger.

Chaos-test it from this directory:

    spark-eos chaos --app orders_job:build --kills 3 --payload key,amount
    pytest test_orders_chaos.py

With ``--option max_amount=900`` the table refuses orders above 900 (a CHECK) and the sink diverts
them to ``<table>_refused`` with the batch (``errors.tolerance=all``); tell the checker where they go:

    spark-eos chaos --app orders_job:build --option max_amount=900 --dead-letters '{table}_refused'
"""

from __future__ import annotations

from typing import Any

from connectors.toolkit.app_runner import Job


def setup(job: Job) -> None:
    """The table, created before the first start (idempotent)."""
    import psycopg

    limit = job.options.get("max_amount")
    check = f" CHECK (amount <= {int(limit)})" if limit else ""
    with psycopg.connect(job.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {job.table} (id text NOT NULL, key text NOT NULL, amount bigint NOT NULL"  # type: ignore[arg-type]
            f"{check}, band text NOT NULL, kafka_partition integer, kafka_offset bigint)"
        )


def build(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    orders = (
        spark.readStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("subscribe", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job.max_offsets)
        .load()
    )
    order = F.from_json(F.col("value").cast("string"), "id string, key string, amount long")
    bad = F.concat(F.lit("malformed order at offset "), F.col("offset").cast("string"))
    writer = (
        orders.select(
            F.when(order["id"].isNull(), F.raise_error(bad)).otherwise(order["id"]).alias("id"),
            order["key"].alias("key"),
            order["amount"].alias("amount"),
            F.when(order["amount"] >= 500, "large").otherwise("small").alias("band"),
            F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"),
        )
        .writeStream.format("postgres-2pc")
        .option("dsn", job.dsn)
        .option("table", job.table)
        .option("sink.id", job.sink_id)
    )
    if job.options.get("max_amount"):  # the table refuses big orders: they go to the dead-letter table
        writer = writer.option("errors.tolerance", "all").option("errors.table", f"{job.table}_refused")
    return writer
