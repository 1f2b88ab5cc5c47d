"""An example user job joining a stream with a static table: orders enriched with their customer's
region and tier, appended to Postgres through ``postgres-2pc``.

Orders arrive as pipe-separated text ``"<order id>|<customer id>|<cents>"`` (Kafka key: the
customer). The customers are a static table, ``customers.csv`` beside this file (a dimension a
team would load from a file or a warehouse). Each order is joined with its customer (an inner
join: an order of an unknown customer is dropped, in every run alike) and appended with the
customer's region and tier; ``postgres-2pc`` commits each micro-batch exactly once.

A chaos run cannot check such rows against the records one by one (they carry fields the records
do not have); the verdict comes from the reference-run oracle, rows compared as multisets:

    spark-eos chaos --app enrich_job:build --generator enrich_job:records --sink-kind 2pc \
        --oracle append --kills 4 --records 2000 \
        --faults kill:1,fault-point:1,pg-crash:1,kafka-cut:1,broker-restart:1 --report report
    pytest test_enrich_chaos.py
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

from connectors.toolkit.app_runner import Job

CUSTOMERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "customers.csv")


def records(seed: int, n: int) -> Iterator[tuple[str, str]]:
    """``n`` orders (key: the customer, value: pipe-separated text); about 1 in 20 names a customer
    the table does not know (dropped by the inner join)."""
    rng = random.Random(seed)
    for i in range(n):
        customer = f"c{rng.randrange(42):03d}"  # customers.csv holds c000..c039
        yield customer, f"o{i:06d}|{customer}|{rng.randint(100, 50_000)}"


def setup(job: Job) -> None:
    import psycopg

    with psycopg.connect(job.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {job.table} (order_id text NOT NULL, customer_id text NOT NULL, "  # type: ignore[arg-type]
            "cents bigint NOT NULL, region text NOT NULL, tier text NOT NULL)"
        )


def build(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    customers = spark.read.csv(CUSTOMERS, header=True, schema="customer_id string, region string, tier string")
    raw = (
        spark.readStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("subscribe", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job.max_offsets)
        .load()
    )
    f = F.split(F.col("value").cast("string"), r"\|")
    orders = raw.select(f[0].alias("order_id"), f[1].alias("customer_id"), f[2].cast("long").alias("cents"))
    enriched = orders.join(F.broadcast(customers), "customer_id").select(
        "order_id", "customer_id", "cents", "region", "tier"
    )
    return (
        enriched.writeStream.format("postgres-2pc")
        .option("dsn", job.dsn)
        .option("table", job.table)
        .option("sink.id", job.sink_id)
    )
