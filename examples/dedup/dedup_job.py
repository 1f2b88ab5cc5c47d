"""An example user job deduplicating with a watermark: clicks sent at least once, stored once.

Clients send click events wrapped in an envelope, as JSON:
``{"meta": {"event_id": "e000042", "sent_at": "2026-11-25T10:00:03.250Z"}, "click": {"user": "u07",
"page": "/pricing"}}``. A client that saw no acknowledgement sends the same event again, a few
seconds later: the same envelope, byte for byte. The job keeps one copy of each event with
``dropDuplicatesWithinWatermark`` (event time: ``sent_at``, watermark 10 minutes, far wider than any
resend delay here) and appends the clicks through the two-phase sink's foreachBatch function
(``connectors.twopc_batch``, keyed by the batch id): the dedup state lives in the checkpoint, the
rows in Postgres, and a replayed batch must neither lose a click nor store one twice.

The verdict comes from the reference-run oracle (rows as multisets):

    spark-eos chaos --app dedup_job:build --generator dedup_job:records --sink-kind foreachbatch \
        --oracle append --kills 4 --records 2000 --faults kill:1,fault-point:1,pg-restart:1,pg-stall:1
    pytest test_dedup_chaos.py
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Iterator
from typing import Any

from connectors.toolkit.app_runner import Job

HOUR_MS = 3_600_000


def records(seed: int, n: int) -> Iterator[tuple[str, str]]:
    """``n`` records: click events and, for about one in five, a resend of an event sent up to ten
    records before (key: the user). Event times start at the top of the hour before the current one."""
    rng = random.Random(seed)
    start_ms = (int(time.time() * 1000) // HOUR_MS - 1) * HOUR_MS
    sent: list[tuple[str, str]] = []
    made = 0
    while made < n:
        if sent and rng.random() < 0.2:
            yield rng.choice(sent[-10:])  # the same envelope again
        else:
            i = len(sent)
            at = dt.datetime.fromtimestamp((start_ms + i * 500) / 1000, dt.timezone.utc)
            user = f"u{rng.randrange(25):02d}"
            envelope = {
                "meta": {"event_id": f"e{i:06d}", "sent_at": at.isoformat(timespec="milliseconds")},
                "click": {"user": user, "page": rng.choice(["/", "/pricing", "/docs", "/signup", "/blog"])},
            }
            sent.append((user, json.dumps(envelope, sort_keys=True)))
            yield sent[-1]
        made += 1


def setup(job: Job) -> None:
    import psycopg

    with psycopg.connect(job.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {job.table} (event_id text NOT NULL, sent_at timestamptz NOT NULL, "  # type: ignore[arg-type]
            "user_id text NOT NULL, page text NOT NULL)"
        )


def build(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    import connectors

    raw = (
        spark.readStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("subscribe", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job.max_offsets)
        .load()
    )
    schema = "meta struct<event_id: string, sent_at: string>, click struct<user: string, page: string>"
    ev = F.from_json(F.col("value").cast("string"), schema)
    clicks = raw.select(
        ev["meta"]["event_id"].alias("event_id"),
        F.to_timestamp(ev["meta"]["sent_at"]).alias("sent_at"),
        ev["click"]["user"].alias("user_id"),
        ev["click"]["page"].alias("page"),
    )
    once = clicks.withWatermark("sent_at", "10 minutes").dropDuplicatesWithinWatermark(["event_id"])
    write = connectors.twopc_batch(
        **connectors.postgres_options(job.dsn), table=job.table, sink_id=job.sink_id, checkpointLocation=job.checkpoint
    )  # binds each decision to Spark's batch
    return once.writeStream.foreachBatch(write)
