"""Benchmark: Kafka -> kafka-eos -> each sink, as a streaming query: rows/s, per-batch time, latency.

Run: ``.venv/bin/python -m bench.streaming [--quick] [--records N] [--batches B] [--interval S]
[--dsn URL] [--bootstrap HOST:PORT] [--broker apache|tansu] [--spark-source]``.
``--spark-source`` adds what users run today, Spark's own ``format("kafka")`` into ``df.write.jdbc`` in
``foreachBatch`` (at-least-once; the base of the "x Spark JDBC" column then), and Spark's source into
``postgres-2pc``; it runs in the peer environment (``make peer-venv``, then ``PYSPARK_PYTHON=.venv-peer/bin/python
.venv-peer/bin/python -m bench.streaming --spark-source``: Spark's connector exists for PySpark 4.2.0, not 4.3).

Kafka is a throwaway embedded broker (``--broker``: Apache Kafka, the default, or tansu;
``bench.kafka_source.kafka``) unless ``--bootstrap``/EOS_KAFKA_BOOTSTRAP names one; Postgres is ``--dsn``/EOS_POSTGRES_DSN or a throwaway
cluster. Spark ``local[2]``. Records: ``--records`` (default 1M; ``--quick`` 100k) of key = the id
as text and value = 100 bytes, in 2 topic partitions; partition p holds the ids
``[p*N/2, (p+1)*N/2)`` in order. The query is ``readStream.format("kafka-eos")`` projected to
``id bigint, v text`` and written by each contender into a fresh LOGGED table:

- ``noop`` (the floor): a Python streaming data source whose tasks read their Arrow batches and
  return a message, and whose ``commit()`` does nothing: PySpark's own cost of a micro-batch
  through a Python writer (the same Kafka read, the same Arrow transfer, the same commit protocol);
- ``postgres-2pc visibility=partition`` and ``visibility=batch`` (exactly-once);
- ``postgres-upsert`` (key ``id``; the table has the primary key);
- ``spark jdbc (foreachBatch)``: what a user would write instead, ``df.write.jdbc`` in
  ``foreachBatch`` (at-least-once; the PostgreSQL JDBC jar is fetched once, ``bench._jdbc``).
- with a stateful step (throughput only): the same records through a windowed aggregation, count
  and last id per 10-second window of the Kafka timestamp (watermark 1 hour) and id mod 1,000, in
  update mode, into a table keyed by (window start, bucket). Ours: ``connectors.upsert_batch`` (the
  ``postgres-upsert`` foreachBatch adapter). The peer a user writes: ``df.write.jdbc`` of each batch
  into a staging table (overwrite, truncate) and an ``INSERT ... ON CONFLICT DO UPDATE`` from it
  (psycopg), in ``foreachBatch``; it is the base of these rows' "x Spark JDBC" (Spark's source into
  it with ``--spark-source``). Each such table is checked to count every record once (sum of counts
  = records, last id = records - 1).

1. Throughput: all records are produced first; each contender reads them from the earliest offset
   with ``maxOffsetsPerTrigger`` = records / ``--batches`` and ``trigger(availableNow=True)``, so
   it runs exactly ``--batches`` micro-batches. Timed from ``start()`` to the end of
   ``awaitTermination()``. Per batch, from the query's progress (``durationMs``): ``addBatch`` (the
   tasks' writes and the writer's ``commit()``) and ``triggerExecution`` (the whole trigger,
   offsets log and commit log included); each sink's median is printed as the noop floor plus what
   the sink adds. For postgres-2pc also the driver's ``commit()`` (decision + COMMIT PREPARED +
   publish + cleanup) as the sink itself records it (``EOS_2PC_TIMINGS``).
2. Latency: a fresh topic per contender, the query started first with ``trigger(processingTime=
   --interval)`` (default: 1.5x the slowest contender's median trigger in the throughput run,
   rounded up to 0.5 s, the same for every contender), then the records are produced at a steady
   rate of records / (batches x interval) per second, a chunk every 10 ms, each record stamped
   with the time of its ``produce()`` call. Visibility is measured by a poller, not by the row's
   insert time (with postgres-2pc a row is inserted in a prepared transaction long before anyone
   can see it): every 20 ms a separate connection runs ``SELECT max(id)`` per topic partition
   (ids are increasing within a partition, and every contender makes a partition's rows of one
   batch visible in one commit, batches in order, so ``max(id)`` visible means every smaller id
   of that partition is visible; the latency tables carry an index on ``id`` so the poll is two
   index lookups). A record's latency is the end of the first poll that saw it minus its produce
   time: late by at most one poll interval plus the poll's own time (~20 ms). tansu reports the
   end of a partition as the first offset of its last record batch + 1, so the steady producer
   also keeps the newest records from being read until its next chunk (up to ~10 ms later); the
   last record of each partition goes alone.
3. Every table is checked to hold each id exactly once (count, distinct count, min, max).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench._noop import noop_source
from bench.kafka_source import BROKERS, kafka, spark_connector_conf
from bench.upsert import bench_session, throwaway_postgres

__all__ = ["main"]

BROKER_LABEL = "apache"  # what the report names: the embedded broker's kind, or "named broker"

PARTITIONS = 2
VALUE_PAD = "x" * 88  # value = 12-digit id + 88 bytes = 100 bytes
POLL_S = 0.02
NOOP = "noop Python writer (the floor)"
NOOP_AGAIN = "noop Python writer (again, last)"
TICK_S = 0.01


def _value(i: int) -> bytes:
    return (f"{i:012d}" + VALUE_PAD).encode()


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 2,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "compression.type": "none",
        }
    )


def _create_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"bench-stream-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    return topic


def _ranges(records: int) -> list[tuple[int, int]]:
    per = records // PARTITIONS
    return [(p * per, (p + 1) * per if p < PARTITIONS - 1 else records) for p in range(PARTITIONS)]


def _send(p: Any, topic: str, part: int, i: int) -> None:
    while True:
        try:
            p.produce(topic, key=str(i).encode(), value=_value(i), partition=part)
            return
        except BufferError:
            p.poll(0.05)


def fill_topic(bootstrap: str, records: int) -> str:
    """A topic holding every record (for the throughput run); each partition ends with a one-record
    batch (needed on tansu, harmless on Apache Kafka)."""
    topic = _create_topic(bootstrap)
    p = _producer(bootstrap)
    for part, (lo, hi) in enumerate(_ranges(records)):
        for i in range(lo, hi - 1):
            _send(p, topic, part, i)
        p.flush()
        _send(p, topic, part, hi - 1)  # alone: tansu's end offset is the last batch's first offset + 1
        p.flush()
    return topic


class SteadyProducer(threading.Thread):
    """Produces ``records`` at ``rate`` records/s (a chunk per partition every 10 ms), stamping each id."""

    def __init__(self, bootstrap: str, topic: str, records: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.records, self.rate = bootstrap, topic, records, rate
        self.stamps: list[float] = [0.0] * records
        self.error: BaseException | None = None
        self.done_at = 0.0

    def run(self) -> None:
        try:
            p = _producer(self.bootstrap)
            ranges = _ranges(self.records)
            nxt = [lo for lo, _ in ranges]
            t0 = time.perf_counter()
            per_part = self.rate / PARTITIONS
            while any(nxt[k] < hi - 1 for k, (_, hi) in enumerate(ranges)):
                now = time.perf_counter()
                for k, (lo, hi) in enumerate(ranges):
                    due = min(hi - 1, lo + int(per_part * (now - t0)))
                    for i in range(nxt[k], due):
                        self.stamps[i] = now
                        _send(p, self.topic, k, i)
                    nxt[k] = max(nxt[k], due)
                p.poll(0)
                time.sleep(max(0.0, TICK_S - (time.perf_counter() - now)))
            p.flush()
            for k, (_, hi) in enumerate(ranges):  # the last record of each partition alone (tansu)
                self.stamps[hi - 1] = time.perf_counter()
                _send(p, self.topic, k, hi - 1)
                p.flush()
            self.done_at = time.perf_counter()
        except BaseException as exc:
            self.error = exc


class Poller(threading.Thread):
    """Every 20 ms: the highest visible id of each topic partition, with the time the poll ended."""

    def __init__(self, dsn: str, table: str, records: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.ranges = dsn, table, _ranges(records)
        self.seen: list[tuple[float, list[int]]] = []
        self.stop_event = threading.Event()
        self.complete = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        parts = ", ".join(
            f"(SELECT max(id) FROM {self.table} WHERE id >= {lo} AND id < {hi})" for lo, hi in self.ranges
        )
        query = f"SELECT {parts}"
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    started = time.perf_counter()
                    row = conn.execute(query).fetchone()  # type: ignore[arg-type]
                    ended = time.perf_counter()
                    assert row is not None
                    maxes = [-1 if v is None else int(v) for v in row]
                    if not self.seen or maxes != self.seen[-1][1]:
                        self.seen.append((ended, maxes))
                    if all(m == hi - 1 for m, (_, hi) in zip(maxes, self.ranges, strict=True)):
                        self.complete.set()
                        return
                    time.sleep(max(0.0, POLL_S - (ended - started)))
        except BaseException as exc:
            self.error = exc

    def latencies(self, stamps: list[float]) -> list[float]:
        """Per id: the end of the first poll that saw it minus its produce time."""
        out: list[float] = []
        for k, (lo, hi) in enumerate(self.ranges):
            i = lo
            for ended, maxes in self.seen:
                while i <= maxes[k] and i < hi:
                    out.append(ended - stamps[i])
                    i += 1
            if i < hi:
                raise RuntimeError(f"ids {i}..{hi - 1} never became visible")
        return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Result:
    name: str
    seconds: float | None = None
    note: str = ""
    batches: list[dict[str, Any]] = field(default_factory=list)  # progress of batches with rows
    check: str = ""
    commit_ms: list[float] = field(default_factory=list)
    commit_parts: list[dict[str, float]] = field(default_factory=list)  # 2pc commit() steps, cumulative s
    latency: list[float] = field(default_factory=list)
    latency_check: str = ""


def _make_table(dsn: str, table: str, *, key: bool, index: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {table} (id bigint{' PRIMARY KEY' if key else ''}, v text)")  # type: ignore[arg-type]
        if index and not key:
            conn.execute(f"CREATE INDEX ON {table} (id)")  # type: ignore[arg-type]


def _check(dsn: str, table: str, records: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {table}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    n, distinct, lo, hi = row
    ok = n == distinct == records and lo == 0 and hi == records - 1
    return "exact" if ok else f"WRONG: {n} rows, {distinct} distinct, ids {lo}..{hi}"


SPARK_JDBC = "spark kafka -> spark jdbc (foreachBatch)"
# the stateful step: a windowed aggregation in update mode into a keyed table
AGG_BUCKETS = 1000
AGG = "window agg -> postgres-upsert (foreachBatch adapter)"
AGG_JDBC = "window agg -> spark jdbc staging + ON CONFLICT (foreachBatch)"
SPARK_AGG = "spark kafka -> " + AGG
SPARK_AGG_JDBC = "spark kafka -> " + AGG_JDBC


def _stateful(name: str) -> bool:
    return "window agg" in name


def _make_agg_table(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        conn.execute(  # type: ignore[arg-type]
            f"CREATE TABLE {table} (window_start timestamptz, bucket bigint, n bigint, last_id bigint, "
            "PRIMARY KEY (window_start, bucket))"
        )


def _check_agg(dsn: str, table: str, records: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*), sum(n), max(last_id) FROM {table}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    groups, n, last = row
    ok = n == records and last == records - 1
    return f"exact ({groups} groups)" if ok else f"WRONG: counts sum to {n}, last id {last}"


def _aggregate(df: Any) -> Any:
    from pyspark.sql import functions as F

    return (
        df.withWatermark("ts", "1 hour")
        .groupBy(F.window("ts", "10 seconds"), (F.col("id") % AGG_BUCKETS).alias("bucket"))
        .agg(F.count("*").alias("n"), F.max("id").alias("last_id"))
        .select(F.col("window.start").alias("window_start"), "bucket", "n", "last_id")
    )


def run(
    dsn: str,
    bootstrap: str,
    records: int,
    batches: int,
    interval: float | None,
    skip_latency: bool,
    spark_source: bool = False,
) -> int:
    root = tempfile.mkdtemp(prefix="eos-bench-stream-")
    timings = os.path.join(root, "timings.jsonl")
    os.environ["EOS_2PC_TIMINGS"] = timings  # before the JVM starts: its Python processes inherit it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    conf = {
        "spark.driver.memory": "2g",
        "spark.python.authenticate.socketTimeout": "120s",  # a loaded machine starts workers slowly
    }
    if spark_source:  # Spark's own format("kafka"): its connector's jars beside the JDBC driver
        conf.update(spark_connector_conf())
    spark = bench_session("bench-streaming", **conf)
    spark.dataSource.register(noop_source())
    suffix = uuid.uuid4().hex[:6]

    def stream(topic: str, cap: int | None, fmt: str = "kafka-eos", stateful: bool = False) -> Any:
        r = (
            spark.readStream.format(fmt)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
        )
        if fmt == "kafka-eos":
            r = r.option("kafkaConsumer.pollTimeoutMs", "60000")
        if cap:
            r = r.option("maxOffsetsPerTrigger", str(cap))
        cols = ["CAST(CAST(key AS STRING) AS BIGINT) AS id", "CAST(value AS STRING) AS v"]
        df = r.load().selectExpr(*cols, "timestamp AS ts") if stateful else r.load().selectExpr(*cols)
        return _aggregate(df) if stateful else df

    def jdbc_batch(table: str, mode: str = "append") -> Any:
        rest = dsn.split("://", 1)[1]
        user = rest.split("@", 1)[0] if "@" in rest else "postgres"
        url = "jdbc:postgresql://" + rest.split("@", 1)[-1]

        def write(df: Any, batch_id: int) -> None:
            df.write.jdbc(
                url,
                table,
                mode=mode,
                properties={
                    "user": user.split(":")[0],
                    "driver": "org.postgresql.Driver",
                    "batchsize": "10000",
                    "truncate": "true",  # overwrite keeps the staging table's definition
                },
            )

        return write

    # name -> (start(df, table, ckpt, trigger) -> query, primary key?, has visible rows?)
    def sink(fmt: str, **opts: str) -> Any:
        def start(df: Any, table: str, ckpt: str, trigger: dict[str, Any]) -> Any:
            w = df.writeStream.format(fmt).option("checkpointLocation", ckpt)
            if fmt != "bench-noop":
                w = w.option("dsn", dsn).option("table", table)
            for k, v in opts.items():
                w = w.option(k, v.replace("{table}", table))
            return w.trigger(**trigger).start()

        return start

    def jdbc_start(df: Any, table: str, ckpt: str, trigger: dict[str, Any]) -> Any:
        return (
            df.writeStream.foreachBatch(jdbc_batch(table)).option("checkpointLocation", ckpt).trigger(**trigger).start()
        )

    def agg_upsert_start(df: Any, table: str, ckpt: str, trigger: dict[str, Any]) -> Any:
        import connectors

        upsert = connectors.upsert_batch(dsn=dsn, table=table, key="window_start,bucket")
        w = df.writeStream.outputMode("update").foreachBatch(upsert).option("checkpointLocation", ckpt)
        return w.trigger(**trigger).start()

    def agg_jdbc_start(df: Any, table: str, ckpt: str, trigger: dict[str, Any]) -> Any:
        write_staging = jdbc_batch(f"{table}_staging", mode="overwrite")

        def write(batch: Any, batch_id: int) -> None:
            write_staging(batch, batch_id)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(  # type: ignore[arg-type]
                    f"INSERT INTO {table} SELECT * FROM {table}_staging ON CONFLICT (window_start, bucket) "
                    "DO UPDATE SET n = EXCLUDED.n, last_id = EXCLUDED.last_id"
                )

        w = df.writeStream.outputMode("update").foreachBatch(write).option("checkpointLocation", ckpt)
        return w.trigger(**trigger).start()

    def make_table(name: str, table: str, key: bool, index: bool) -> None:
        if _stateful(name):
            _make_agg_table(dsn, table)
            _make_agg_table(dsn, f"{table}_staging")
        else:
            _make_table(dsn, table, key=key, index=index)

    eos = "kafka-eos"
    two_pc_batch = sink("postgres-2pc", **{"sink.id": "bench-{table}", "visibility": "batch"})
    contenders: list[tuple[str, Any, bool, str, str]] = [
        (NOOP, sink("bench-noop"), False, "reads the rows, commit() does nothing", eos),
        (
            "postgres-2pc visibility=partition",
            sink("postgres-2pc", **{"sink.id": "bench-{table}", "visibility": "partition"}),
            False,
            "exactly-once",
            eos,
        ),
        ("postgres-2pc visibility=batch", two_pc_batch, False, "exactly-once", eos),
        ("postgres-upsert (key id)", sink("postgres-upsert", key="id"), True, "idempotent", eos),
        ("spark jdbc (foreachBatch)", jdbc_start, False, "at-least-once", eos),
    ]
    if spark_source:  # what users run today, our sink behind Spark's own source, and the Python writer's floor there
        contenders.append((SPARK_JDBC, jdbc_start, False, "at-least-once", "kafka"))
        contenders.append(("spark kafka -> noop Python writer", sink("bench-noop"), False, "the floor", "kafka"))
        contenders.append(
            ("spark kafka -> postgres-2pc visibility=batch", two_pc_batch, False, "exactly-once", "kafka")
        )
    contenders.append((AGG, agg_upsert_start, True, "idempotent, stateful step", eos))
    contenders.append((AGG_JDBC, agg_jdbc_start, True, "at-least-once, stateful step", eos))
    if spark_source:
        contenders.append((SPARK_AGG_JDBC, agg_jdbc_start, True, "at-least-once, stateful step", "kafka"))
        contenders.append((SPARK_AGG, agg_upsert_start, True, "idempotent, stateful step", "kafka"))
    # the floor again, last: the machine's load drifts over a run; the lower of the two counts
    contenders.append((NOOP_AGAIN, sink("bench-noop"), False, "the floor measured again at the end", eos))
    results = {name: Result(name, note=note) for name, _, _, note, _ in contenders}

    print(f"load average at the start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs", flush=True)
    try:
        t0 = time.perf_counter()
        topic = fill_topic(bootstrap, records)
        warm = fill_topic(bootstrap, 2000)
        print(f"produced {records:,} records in {PARTITIONS} partitions in {time.perf_counter() - t0:.1f}s", flush=True)

        # warm the JVM paths and the Python workers once per contender, outside every measurement
        for k, (name, start, key, _, fmt) in enumerate(contenders[:-1]):
            table = f"st_warm{k}_{suffix}"
            make_table(name, table, key=key, index=False)
            start(
                stream(warm, 1000, fmt, _stateful(name)),
                table,
                os.path.join(root, f"ckpt-warm{k}"),
                {"availableNow": True},
            ).awaitTermination()

        # 1. throughput: the backlog in `batches` micro-batches
        cap = records // batches
        for k, (name, start, key, _, fmt) in enumerate(contenders):
            table = f"st_tp{k}_{suffix}"
            make_table(name, table, key=key, index=False)
            open(timings, "w").close()
            t = time.perf_counter()
            df = stream(topic, cap, fmt, _stateful(name))
            q = start(df, table, os.path.join(root, f"ckpt-tp{k}"), {"availableNow": True})
            q.awaitTermination()
            r = results[name]
            r.seconds = time.perf_counter() - t
            r.batches = [{"rows": p.numInputRows, **p.durationMs} for p in q.recentProgress if p.numInputRows]
            with open(timings, encoding="utf-8") as fh:
                r.commit_parts = [json.loads(line) for line in fh if line.strip()]
            r.commit_ms = [t["total"] * 1000 for t in r.commit_parts]
            floor_run = "noop" in name
            r.check = "exact" if floor_run else (_check_agg if _stateful(name) else _check)(dsn, table, records)
            if floor_run:
                got = sum(b["rows"] for b in r.batches)
                r.check = "read all" if got == records else f"WRONG: read {got}"
            print(f"  {name}: {r.seconds:.2f}s, {len(r.batches)} batches, {r.check}", flush=True)

        # 2. latency: a steady producer, a processingTime trigger, a poller for visibility
        if interval is None:
            slowest = max(
                statistics.median(b["triggerExecution"] for b in r.batches) for r in results.values() if r.batches
            )
            interval = max(1.0, math.ceil(slowest * 1.5 / 500) / 2)
        rate = records / (batches * interval)
        if not skip_latency:
            print(f"latency: trigger every {interval:g}s, {rate:,.0f} records/s", flush=True)
            for k, (name, start, key, _, fmt) in enumerate(contenders):
                if "noop" in name or _stateful(name):  # latency is of records, not of windows
                    continue
                table = f"st_lat{k}_{suffix}"
                _make_table(dsn, table, key=key, index=True)
                ltopic = _create_topic(bootstrap)
                q = start(
                    stream(ltopic, None, fmt),
                    table,
                    os.path.join(root, f"ckpt-lat{k}"),
                    {"processingTime": f"{interval:g} seconds"},
                )
                poller = Poller(dsn, table, records)
                producer = SteadyProducer(bootstrap, ltopic, records, rate)
                poller.start()
                producer.start()
                producer.join()
                finished = poller.complete.wait(max(60.0, 10 * interval))
                poller.stop_event.set()
                poller.join()
                idle = time.perf_counter() + 30
                while q.status["isTriggerActive"] and time.perf_counter() < idle:
                    time.sleep(0.05)  # stop between triggers, not in the middle of an empty one
                q.stop()
                r = results[name]
                if producer.error or poller.error or not finished:
                    r.latency_check = (
                        f"FAILED: producer {producer.error!r}, poller {poller.error!r}, all visible {finished}"
                    )
                else:
                    r.latency = poller.latencies(producer.stamps)
                    r.latency_check = _check(dsn, table, records)
                print(f"  {name}: {r.latency_check}", flush=True)
    finally:
        spark.stop()

    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    report(results, records, batches, interval, rate, skip_latency, spark_source)
    ok = all(r.check.startswith("exact") or r.check == "read all" for r in results.values() if r.seconds is not None)
    ok = ok and (skip_latency or all(r.latency_check == "exact" for r in results.values() if r.latency_check))
    return 0 if ok else 1


def _med(r: Result, key: str) -> float:
    return float(statistics.median(b.get(key, 0) for b in r.batches))


def report(
    results: dict[str, Result],
    records: int,
    batches: int,
    interval: float,
    rate: float,
    skip_latency: bool,
    spark_source: bool = False,
) -> None:
    floors = [r for r in (results[NOOP], results[NOOP_AGAIN]) if r.batches]
    floor = min(floors, key=lambda r: _med(r, "addBatch")) if floors else results[NOOP]
    # the pipeline a user runs today is the base: Spark's own source into df.write.jdbc, when it ran
    jdbc = results.get(SPARK_JDBC) if spark_source else results.get("spark jdbc (foreachBatch)")
    base = jdbc.seconds if jdbc is not None and jdbc.seconds else None
    agg_jdbc = results.get(SPARK_AGG_JDBC if spark_source else AGG_JDBC)
    agg_base = agg_jdbc.seconds if agg_jdbc is not None and agg_jdbc.seconds else None
    print(
        f"\nstreaming: Kafka ({BROKER_LABEL}, {PARTITIONS} partitions) -> kafka-eos -> sink, {records:,} records "
        f"(id bigint, v text 100 B), {batches} micro-batches (maxOffsetsPerTrigger {records // batches:,}, "
        "availableNow), local[2], logged tables, one run\n"
    )
    floor_s = min((r.seconds for r in (results[NOOP], results[NOOP_AGAIN]) if r.seconds), default=None)
    base_name = SPARK_JDBC if spark_source else "spark jdbc (foreachBatch), behind kafka-eos"
    agg_name = SPARK_AGG_JDBC if spark_source else AGG_JDBC
    print(f"(x Spark JDBC: against {base_name}; the window agg rows against {agg_name})\n")
    print("| contender | seconds | rows/s | x Spark JDBC | x noop floor | rows |")
    print("|---|---|---|---|---|---|")
    for r in results.values():
        if r.seconds is None:
            print(f"| {r.name} | | | | | {r.note} |")
            continue
        b = agg_base if _stateful(r.name) else base
        vs = f"{b / r.seconds:.2f}x" if b else "n/a"
        vf = f"{floor_s / r.seconds:.2f}x" if floor_s else "n/a"
        print(f"| {r.name} | {r.seconds:.2f} | {records / r.seconds:,.0f} | {vs} | {vf} | {r.check} |")
    print(
        "(x = the other's time / this time: above 1 is faster; seconds from start() to the end of "
        "awaitTermination(); the noop floor is the faster of its two runs)"
    )

    print("\nper micro-batch, medians of the query's progress (durationMs):\n")
    print("| contender | triggerExecution ms | addBatch ms | addBatch = noop floor + ours | 2pc commit() ms |")
    print("|---|---|---|---|---|")
    f_add = _med(floor, "addBatch") if floor.batches else 0.0
    for r in results.values():
        if not r.batches:
            continue
        add = _med(r, "addBatch")
        split = "the floor" if r is floor else f"{f_add:.0f} + {add - f_add:.0f}"
        if r in floors and r is not floor:
            split = "(the other floor run is lower)"
        cm = f"{statistics.median(r.commit_ms):.0f} (p99 {percentile(r.commit_ms, 0.99):.0f})" if r.commit_ms else ""
        print(f"| {r.name} | {_med(r, 'triggerExecution'):.0f} | {add:.0f} | {split} | {cm} |")
    for r in results.values():
        if r.commit_parts:
            steps = {"decide": "decide", "commit_prepared": "COMMIT PREPARED", "publish": "publish"}
            prev = "decide"
            parts = [f"decide {statistics.median(t['decide'] for t in r.commit_parts) * 1000:.0f}"]
            for key in ("commit_prepared", "publish", "total"):
                label = steps.get(key, "cleanup")
                ms = statistics.median((t[key] - t[prev]) for t in r.commit_parts) * 1000
                parts.append(f"{label} {ms:.0f}")
                prev = key
            print(f"({r.name}: driver commit() steps, medians in ms: {', '.join(parts)})")
    others = sorted(
        {k for r in results.values() for b in r.batches for k in b} - {"rows", "addBatch", "triggerExecution"}
    )
    if floor.batches:
        rest = ", ".join(f"{k} {_med(floor, k):.0f}" for k in others if _med(floor, k))
        if rest:
            print(f"(the floor's other parts of a trigger, medians in ms: {rest})")

    if skip_latency:
        return
    print(
        f"\nend-to-end latency, produce() to visible in Postgres (a poller every {POLL_S * 1000:.0f} ms), "
        f"{records:,} records produced at a steady {rate:,.0f}/s, trigger every {interval:g} s:\n"
    )
    print("| contender | p50 ms | p99 ms | max ms | rows |")
    print("|---|---|---|---|---|")
    for r in results.values():
        if r.latency:
            print(
                f"| {r.name} | {percentile(r.latency, 0.5) * 1000:.0f} | {percentile(r.latency, 0.99) * 1000:.0f} | "
                f"{max(r.latency) * 1000:.0f} | {r.latency_check} |"
            )
        elif r.latency_check:
            print(f"| {r.name} | | | | {r.latency_check} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.streaming", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="100k records")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--interval", type=float, default=None, help="latency run: trigger interval in seconds")
    p.add_argument("--no-latency", action="store_true", help="only the throughput run")
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    p.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"))
    p.add_argument("--broker", choices=BROKERS, default="apache", help="the embedded broker when no --bootstrap")
    p.add_argument(
        "--spark-source",
        action="store_true",
        help='also run Spark\'s own format("kafka") into df.write.jdbc and into postgres-2pc (needs the peer '
        "environment: make peer-venv, then run this module with .venv-peer/bin/python)",
    )
    args = p.parse_args(argv)
    records = 100_000 if args.quick else args.records
    global BROKER_LABEL
    BROKER_LABEL = "named broker" if args.bootstrap else args.broker
    with kafka(args.bootstrap, args.broker) as bootstrap:
        if args.dsn:
            return run(args.dsn, bootstrap, records, args.batches, args.interval, args.no_latency, args.spark_source)
        with throwaway_postgres() as dsn:
            return run(dsn, bootstrap, records, args.batches, args.interval, args.no_latency, args.spark_source)


if __name__ == "__main__":
    sys.exit(main())
