"""A deliberately broken job the chaos toolkit must catch: a foreachBatch that INSERTs each batch.

Payments arrive as CSV text ``"<payment id>,<account>,<cents>"``; the job parses them and appends
each micro-batch with a plain ``INSERT`` (what ``df.write.jdbc(mode="append")`` does). Nothing ties
the insert to Spark's batch commit: when the driver dies after the insert and before Spark writes
``commits/n``, the batch is replayed and inserted again. Chaos-testing it with the fault points
around foreachBatch and the reference-run oracle (rows as multisets) shows the duplicates, and
``--minimise`` names the one kill that is enough:

    spark-eos chaos --app insert_job:build --generator insert_job:records --sink-kind foreachbatch \
        --oracle append --kills 2 --seed 49 --records 200 --max-offsets 40 --minimise

The fix: write through ``connectors.upsert_batch(..., key="payment_id")`` (idempotent) or
``connectors.twopc_batch(...)`` (keyed by the batch id) instead of the plain insert.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from connectors.toolkit.app_runner import Job


def records(seed: int, n: int) -> Iterator[tuple[str, str]]:
    """``n`` payments (key: the account, value: CSV text)."""
    rng = random.Random(seed)
    for i in range(n):
        account = f"acct{rng.randrange(20):02d}"
        yield account, f"p{i:06d},{account},{rng.randint(1, 10_000)}"


def setup(job: Job) -> None:
    import psycopg

    with psycopg.connect(job.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {job.table} (payment_id text, account text, cents bigint)"  # type: ignore[arg-type]
        )


def build(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("subscribe", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job.max_offsets)
        .load()
    )
    f = F.split(F.col("value").cast("string"), ",")
    payments = raw.select(f[0].alias("payment_id"), f[1].alias("account"), f[2].cast("long").alias("cents"))

    def insert(df: Any, batch_id: int) -> None:  # the bug: not idempotent, not tied to the batch
        import psycopg

        rows = [tuple(r) for r in df.collect()]
        if rows:
            with psycopg.connect(job.dsn) as conn, conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {job.table} VALUES (%s, %s, %s)", rows)  # type: ignore[arg-type]

    return payments.writeStream.foreachBatch(insert)
