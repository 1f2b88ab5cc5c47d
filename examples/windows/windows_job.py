"""An example user job with its own record format: sensor readings -> 10-second windows -> Postgres.

Readings arrive as text ``"<sensor>;<reading>"`` (Kafka key: the sensor) with the Kafka timestamp
set to the moment of the reading: that is the event time. The job counts, sums and takes the peak
of each sensor's readings per 10-second event-time window (watermark 1 hour) and writes the
windows in update mode through the foreachBatch upsert adapter (``connectors.upsert_batch``,
keyed by window start and sensor): a replayed batch rewrites the same rows.

The verdict is not a per-record check (a window is not a record): the chaos run's final table is
compared with fault-free reference runs of the same job on the same records, by key, the float
sums within a tolerance. From this directory:

    spark-eos chaos --app windows_job:build --generator windows_job:records --sink-kind foreachbatch \
        --oracle upsert:window_start,sensor --tolerance 1e-9 --kills 3 --records 2000
    pytest test_windows_chaos.py
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

from connectors.toolkit.app_runner import Job

HOUR_MS = 3_600_000
SENSORS = 8


def records(seed: int, n: int) -> Iterator[tuple[str, str, tuple[()], None, int]]:
    """``n`` readings (key, value, headers, partition, timestamp): four a second, in event-time order
    up to 200 ms of jitter (far inside the watermark: no reading is ever late, in any batching)."""
    rng = random.Random(seed)
    # the readings start at the top of the hour before the current one: recent enough that no broker's
    # retention (7 days by default) deletes them under the run, and the same for every call within the hour
    start_ms = (int(time.time() * 1000) // HOUR_MS - 1) * HOUR_MS
    for i in range(n):
        sensor = f"s{rng.randrange(SENSORS):02d}"
        reading = round(rng.uniform(-20.0, 40.0), 3)
        yield sensor, f"{sensor};{reading}", (), None, start_ms + i * 250 + rng.randrange(200)


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
    fields = F.split(F.col("value").cast("string"), ";")
    readings = raw.select(
        fields[0].alias("sensor"), fields[1].cast("double").alias("reading"), F.col("timestamp").alias("event_time")
    )
    windows = (
        readings.withWatermark("event_time", "1 hour")
        .groupBy(F.window("event_time", "10 seconds"), "sensor")
        .agg(F.count("*").alias("readings"), F.sum("reading").alias("total"), F.max("reading").alias("peak"))
        .select(F.col("window.start").alias("window_start"), "sensor", "readings", "total", "peak")
    )
    upsert = connectors.upsert_batch(dsn=job.dsn, table=job.table, key="window_start,sensor", **{"table.create": True})
    return windows.writeStream.outputMode("update").foreachBatch(upsert)
