"""Benchmark: the kafka-eos sink (both visibility modes) against Spark's own Kafka sink and plain producer loops.

Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python -m bench.kafka_sink [--quick] [--records N] [--size B]
[--partitions P] [--batches B] [--repeat R] [--stream-repeat R] [--bootstrap HOST:PORT] [--broker apache|tansu]
[--spark-sink] [--profile]``. With ``--spark-sink`` (in the peer environment: ``make peer-venv``, then
``PYSPARK_PYTHON=.venv-peer/bin/python .venv-peer/bin/python -m bench.kafka_sink --spark-sink``; Maven Central
serves Spark's Kafka connector for PySpark 4.2.0, not 4.3) Spark's own ``format("kafka")`` writes the same
rows in the same session, its runs interleaved with the others', and is the base of the ratios.

One broker (``--bootstrap``/EOS_KAFKA_BOOTSTRAP, else a throwaway embedded one, ``--broker``), Spark
``local[2]`` at its defaults (``arrow.maxRecordsPerBatch`` 10,000), every client at its defaults (librdkafka's
for ours and the loops, with the sink's ``partitioner=murmur2_random``; the Java producer's for Spark's sink).
The records: ``--records`` (default 1M; ``--quick`` 100k) of key = the id as text, value = the id in 12
digits and 88 ``x`` (``--size`` 100 bytes), keyed, into fresh topics of ``--partitions`` (4) partitions.

1. Batch write: a DataFrame of the records in 2 partitions, cached in Spark, written by
   - a ``noop Python writer`` (a Python data source whose tasks only count their Arrow batches): what PySpark
     costs any Python sink, the Arrow transfer to the Python workers included;
   - ``kafka-eos visibility=partition`` and ``visibility=batch`` (``df.write``, ``sink.id``, ``batch.id``);
   - ``Spark format("kafka")`` (``--spark-sink``; at-least-once): the base, ``x Spark`` = its time / this time;
   - ``txn loop``: a plain confluent-kafka transactional producer loop in one process (keys and values ready as
     bytes before the clock, one transaction, ``commit_transaction``), ``txn loops x2`` the same in two
     processes with half the records each (the limit on 2 cores: ``x limit`` = its time / this time), and
     ``plain loop``: the one-process loop without a transaction (``flush``).
   Each contender writes once untimed (a tenth of the records: Python workers started, JIT warm), then
   ``--repeat`` rounds (3), interleaved; per round each writes into a fresh topic.
2. Stream: the records in an input topic (partition p holds the p-th range of ids), read by
   ``readStream.format("kafka-eos")`` from earliest with ``maxOffsetsPerTrigger`` = records / ``--batches``
   (10) and ``trigger(availableNow=True)``,
   ``select("key", "value")`` into each sink: Spark's ``noop`` (the source alone), the noop Python writer
   (PySpark's floor for a Python sink: "- Python floor" is a pipeline's seconds less its), kafka-eos in both modes, Spark's sink (``--spark-sink``), and with ``--spark-sink`` also Spark's source into Spark's
   sink (what users run today). Timed from ``start()`` to the end of ``awaitTermination()``; per micro-batch
   the medians of ``triggerExecution`` and ``addBatch`` (batches with rows). ``--stream-repeat`` rounds (2),
   interleaved.
3. Every timed write is checked before its time counts: the topic, read ``read_committed`` in Spark, holds
   exactly the input's count and checksum (sum of ``xxhash64(key, value)``), and a sample of every
   ``records/1000``-th id has its value and the partition Java's partitioner gives its key
   (``integration.spark_peer.peer.java_partition``).
4. CPU seconds per component of each contender (medians; ``Meter``: /proc sampled twice a second): the
   Spark JVM, its Python workers (tasks, the data source's planner and commit processes), the broker, and this
   process with its other children (the loops).
5. ``--profile``: in a fresh process, outside Spark, for each mode: one task of the batch write (records / 2
   rows) and one task of a micro-batch (records / batches / partitions), from Arrow batches of 10,000 made
   before the clock, through the writer Spark builds (``KafkaBatchWriter``, pickled as for the tasks): its
   ``write`` and the driver's ``commit`` (the publish for ``visibility=batch``), timed without the profiler, then under cProfile (top functions by own time); beside
   it a bare loop over the same Arrow batches (``to_pylist``, ``produce``, one transaction): the least a
   Python task can do.

The load average at the start and end is printed: on a shared machine compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._cpu import _subtree, _table, listener_pid
from bench._noop import noop_source
from bench.kafka_source import BROKERS, kafka

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("jvm", "python workers", "broker", "driver")
_TICK = os.sysconf("SC_CLK_TCK")
PAD = 88
EOS_P, EOS_B = "kafka-eos visibility=partition", "kafka-eos visibility=batch"
SPARK = 'Spark format("kafka")'
TXN1, TXN2, PLAIN1 = "txn loop (1 process)", "txn loops x2 (the limit)", "plain loop, no transaction"
NOOP = "Spark noop sink (the source alone)"
PYNOOP = "noop Python writer (PySpark's floor)"
SPARK_SPARK = "Spark source -> Spark sink (today's pipeline)"


def key_of(i: int) -> bytes:
    return str(i).encode()


def produce_pairs(p: Any, topic: str, keys: list[Any], values: list[Any]) -> None:
    """The plain loop: each (key, value) produced, librdkafka's queue served when it is full."""
    produce = p.produce
    for k, v in zip(keys, values, strict=True):
        try:
            produce(topic, v, k)
        except BufferError:
            p.poll(0.05)
            produce(topic, v, k)


def value_of(i: int, size: int) -> bytes:
    return (f"{i:012d}" + "x" * (size - 12)).encode()


# ---- CPU per component -------------------------------------------------------------------------------
class Meter:
    """CPU seconds of each component over a window, sampled from ``/proc`` every ``interval`` seconds.

    ``bench._cpu`` takes two snapshots and counts a process that ended through its parent's reaped-children time;
    here Spark's idle Python workers end between contenders and their children are reparented (reaped by init),
    so their time would go missing (negative figures). Instead each process's own time (utime + stime) is
    followed while it lives: its share is its last sample less its time at the start (0 when born inside the
    window); a process that ends loses at most one interval. Components: the Spark JVM, its descendants (Python
    workers: daemons, task workers, the data source's planner and commit processes), the broker's process tree,
    and this process with its other children (the loops; the sampler thread too, a few ms per sample).
    """

    def __init__(self, spark: Any, bootstrap: str, interval: float = 0.5) -> None:
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        self.jvm = proc.pid if proc is not None else None
        self.broker = listener_pid(bootstrap)
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._base: dict[int, int] = {}
        self._last: dict[int, tuple[str, int]] = {}

    def _sample(self) -> dict[int, tuple[str, int]]:
        table = _table()
        jvm = _subtree(table, self.jvm) if self.jvm in table else set()
        broker = _subtree(table, self.broker) if self.broker in table else set()
        mine = _subtree(table, os.getpid()) - jvm - broker
        out: dict[int, tuple[str, int]] = {}
        for kind, pids in (("python workers", jvm - {self.jvm}), ("broker", broker), ("driver", mine)):
            out.update((pid, (kind, table[pid][1])) for pid in pids)
        if self.jvm in table:
            out[self.jvm] = ("jvm", table[self.jvm][1])  # type: ignore[index]
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for pid, (kind, ticks) in self._sample().items():
                self._last[pid] = (self._last.get(pid, (kind, 0))[0], ticks)

    def start(self) -> None:
        first = self._sample()
        self._base = {pid: ticks for pid, (_, ticks) in first.items()}
        self._last = dict(first)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float | None]:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        for pid, (kind, ticks) in self._sample().items():
            self._last[pid] = (self._last.get(pid, (kind, 0))[0], ticks)
        out: dict[str, float | None] = dict.fromkeys(COMPONENTS, 0.0)
        if self.jvm is None:
            out["jvm"] = out["python workers"] = None
        if self.broker is None:
            out["broker"] = None
        for pid, (kind, ticks) in self._last.items():
            if out[kind] is not None:
                out[kind] = out[kind] + max(0, ticks - self._base.get(pid, 0)) / _TICK  # type: ignore[operator]
        return out


# ---- Kafka -------------------------------------------------------------------------------------------
def create_topic(bootstrap: str, partitions: int, prefix: str = "bench-sink") -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every partition has a leader before anyone writes
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            if all(p.leader >= 0 for p in t.partitions.values()):
                return topic
        time.sleep(0.1)
    raise SystemExit(f"topic {topic} has no leaders after 60 s")


def fill_input(bootstrap: str, records: int, size: int, partitions: int) -> str:
    """The stream's input: partition p holds the p-th contiguous range of ids, in order."""
    from confluent_kafka import Producer

    topic = create_topic(bootstrap, partitions, "bench-sink-in")
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "compression.type": "none",
        }
    )
    for i in range(records):
        while True:
            try:
                p.produce(topic, value_of(i, size), key_of(i), partition=i * partitions // records)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise SystemExit("producing the stream's input did not finish")
    return topic


def _loop(bootstrap: str, topic: str, lo: int, hi: int, size: int, txn: bool, ready: Any, go: Any, out: Any) -> None:
    """A plain producer loop over ids [lo, hi): data ready before the start signal; (start, end, cpu, errors)."""
    from confluent_kafka import Producer

    errors: list[str] = []
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"}
    if txn:
        conf["transactional.id"] = f"bench-loop-{uuid.uuid4().hex}"
    p = Producer({**conf, "on_delivery": lambda err, _m: errors.append(str(err)) if err else None})
    keys = [key_of(i) for i in range(lo, hi)]
    values = [value_of(i, size) for i in range(lo, hi)]
    if txn:
        p.init_transactions(60)
    ready.set()
    go.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    if txn:
        p.begin_transaction()
    produce_pairs(p, topic, keys, values)
    if txn:
        p.commit_transaction(120)
    elif p.flush(120):
        errors.append("flush timed out")
    out.put((t0, time.perf_counter(), time.process_time() - cpu0, errors[:3]))


def loops(bootstrap: str, topic: str, records: int, size: int, *, procs: int, txn: bool) -> float:
    """The loop in ``procs`` processes, each with its share of the ids: wall seconds from the common start."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    bounds = [(records * k // procs, records * (k + 1) // procs) for k in range(procs)]
    ready = [ctx.Event() for _ in bounds]
    kids = [
        ctx.Process(target=_loop, args=(bootstrap, topic, lo, hi, size, txn, r, go, out))
        for (lo, hi), r in zip(bounds, ready, strict=True)
    ]
    for k in kids:
        k.start()
    for r in ready:
        if not r.wait(300):
            raise SystemExit("a loop process did not get ready")
    time.sleep(0.5)
    t0 = time.perf_counter()
    go.set()
    ends = [out.get(timeout=1800) for _ in kids]
    for k in kids:
        k.join()
    errors = [e for *_, errs in ends for e in errs]
    if errors:
        raise SystemExit(f"a loop had delivery errors: {errors}")
    return max(end for _, end, _, _ in ends) - t0


# ---- Spark -------------------------------------------------------------------------------------------
def session(spark_sink: bool) -> Any:
    from connectors.services.spark import local_session

    conf: dict[str, str] = {}
    if spark_sink:
        import pyspark

        from connectors.services.spark_kafka import SPARK_KAFKA_VERSION, session_conf

        if pyspark.__version__ != SPARK_KAFKA_VERSION:
            raise SystemExit(
                f"--spark-sink needs PySpark {SPARK_KAFKA_VERSION} (the newest Spark whose Kafka connector Maven "
                f"Central serves), found {pyspark.__version__}: run make peer-venv, then PYSPARK_PYTHON=.venv-peer/"
                "bin/python .venv-peer/bin/python -m bench.kafka_sink --spark-sink"
            )
        conf = session_conf()
    return local_session("bench-kafka-sink", "local[2]", **conf)


def frame(spark: Any, records: int, size: int) -> Any:
    from pyspark.sql import functions as F

    ids = F.col("id").cast("string")
    df = spark.range(0, records, 1, 2).select(
        ids.alias("key"), F.concat(F.lpad(ids, 12, "0"), F.lit("x" * (size - 12))).alias("value")
    )
    return df


def checksum(df: Any) -> tuple[int, int]:
    """(count, sum of xxhash64(key, value) over the bytes) of a DataFrame with key and value columns."""
    from pyspark.sql import functions as F

    h = F.xxhash64(F.col("key").cast("binary"), F.col("value").cast("binary")).cast("decimal(38,0)")
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(h).alias("h")).first()
    return int(row["n"]), int(row["h"] or 0)


class Checker:
    """Each written topic must hold exactly the input: count, checksum, and a sample's values and partitions."""

    def __init__(self, spark: Any, bootstrap: str, records: int, size: int, partitions: int, want: tuple[int, int]):
        self.spark, self.bootstrap, self.records, self.size, self.partitions = (
            spark,
            bootstrap,
            records,
            size,
            partitions,
        )
        self.want = want
        self.step = max(1, records // 1000)

    def __call__(self, topic: str, who: str) -> None:
        from pyspark.sql import functions as F

        from integration.spark_peer.peer import java_partition

        df = (
            self.spark.read.format("kafka-eos")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", topic)
            .option("kafka.isolation.level", "read_committed")
            .load()
        )
        h = F.xxhash64(F.col("key"), F.col("value")).cast("decimal(38,0)")
        pick = F.col("key").cast("string").cast("long") % self.step == 0
        row = df.agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(h).alias("h"),
            F.collect_list(F.when(pick, F.struct("key", "value", "partition"))).alias("sample"),
        ).first()
        got = (int(row["n"]), int(row["h"] or 0))
        if got != self.want:
            raise SystemExit(
                f"{who}: topic {topic} holds {got[0]:,} records (checksum {got[1]}), not the input's "
                f"{self.want[0]:,} (checksum {self.want[1]})"
            )
        sample = row["sample"]
        if len(sample) != (self.records + self.step - 1) // self.step:
            raise SystemExit(f"{who}: the sample of {topic} has {len(sample)} records")
        for rec in sample:
            key, value, part = bytes(rec["key"]), bytes(rec["value"]), rec["partition"]
            i = int(key)
            if value != value_of(i, self.size) or part != java_partition(key, self.partitions):
                raise SystemExit(
                    f"{who}: record {key!r} in {topic} has value {value[:20]!r}..., partition {part} "
                    f"(want partition {java_partition(key, self.partitions)})"
                )


def write_batch(df: Any, who: str, bootstrap: str, topic: str) -> float:
    w = df.write.option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    if who == PYNOOP:
        w = df.write.format("bench-kafka-noop").mode("append")
    elif who == SPARK:
        w = w.format("kafka")
    else:
        mode = "partition" if who == EOS_P else "batch"
        w = w.format("kafka-eos").option("visibility", mode).option("sink.id", topic).option("batch.id", "1")
        w = w.mode("append")
    t0 = time.perf_counter()
    w.save()
    return time.perf_counter() - t0


def run_stream(
    spark: Any, who: str, bootstrap: str, source_topic: str, topic: str | None, per_trigger: int
) -> tuple[float, list[dict[str, Any]]]:
    """(seconds from start() to the end, the query's progress events) of one availableNow query."""
    src_fmt = "kafka" if who == SPARK_SPARK else "kafka-eos"
    df = (
        spark.readStream.format(src_fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load()
        .select("key", "value")
    )
    checkpoint = tempfile.mkdtemp(prefix="bench-kafka-sink-")
    w = df.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if who == NOOP:
        w = w.format("noop")
    elif who == PYNOOP:
        w = w.format("bench-kafka-noop")
    elif who in (SPARK, SPARK_SPARK):
        w = w.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    else:
        mode = "partition" if who == EOS_P else "batch"
        w = w.format("kafka-eos").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
        w = w.option("visibility", mode).option("sink.id", f"{topic}-stream")
    t0 = time.perf_counter()
    q = w.start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    if q.exception() is not None:
        raise SystemExit(f"{who}: the query failed: {q.exception()}")
    return elapsed, list(q.recentProgress)


# ---- the profile of one task -------------------------------------------------------------------------
def profile_task(bootstrap: str, mode: str, sizes: list[int], size: int, partitions: int) -> str:
    """cProfile of one task's ``write_task`` of each of ``sizes`` rows (and of the publish for visibility=batch) in a
    fresh process, after the writer's setup timed cold; its report as text."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.kafka_sink",
            "--profile-child",
            mode,
            bootstrap,
            ",".join(map(str, sizes)),
            str(size),
            str(partitions),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if out.returncode:
        raise SystemExit(f"the profile of visibility={mode} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def _profiled(fn: Any, *args: Any) -> tuple[Any, float, Any]:
    import cProfile

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    result = fn(*args)
    prof.disable()
    return result, time.perf_counter() - t0, prof


def _report(prof: Any, what: str, seconds: float, rows: int) -> None:
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    print(f"== {what}: {seconds:.3f} s wall for {rows:,} rows ({rows / seconds:,.0f} rows/s)")
    stats.sort_stats("tottime").print_stats(14)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip() and "function calls" not in ln]
    print("\n".join(ln for ln in lines if not ln.lstrip().startswith(("Ordered by", "List reduced"))))


def _profile_child(mode: str, bootstrap: str, sizes: list[int], size: int, partitions: int) -> None:
    """The writer as Spark builds it (``KafkaBatchWriter``, pickled for the tasks), its ``write`` as a task runs
    it (partition 0, first attempt: ``task_identity()`` outside Spark) and its ``commit`` as the driver does."""
    import pickle

    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from sinks.kafka import spark as sink_spark

    topic = create_topic(bootstrap, partitions, "bench-sink-profile")
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    batch_id = 0

    def writer_of(batch: int) -> tuple[Any, float]:
        raw = {
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "sink.id": topic,
            "batch.id": str(batch),
            "visibility": mode,
        }
        sink_spark._CHECKED.clear()  # Spark builds each writer in a fresh Python process: the cache is cold
        t0 = time.perf_counter()
        writer = pickle.loads(pickle.dumps(sink_spark.KafkaBatchWriter(raw, schema)))  # as the tasks get it
        return writer, time.perf_counter() - t0

    for rows in sizes:
        batches = []
        for lo in range(0, rows, 10_000):  # Spark's arrow.maxRecordsPerBatch
            ids = range(lo, min(rows, lo + 10_000))
            keys = pa.array([str(i) for i in ids])
            values = pa.array([f"{i:012d}" + "x" * (size - 12) for i in ids])
            batches.append(pa.RecordBatch.from_arrays([keys, values], names=["key", "value"]))
        batch_id += 1
        writer, setup = writer_of(batch_id)
        t0 = time.perf_counter()
        message = writer.write(iter(batches))
        task_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        writer.commit([message])
        commit_wall = time.perf_counter() - t0
        bare_init, bare = _bare_loop(bootstrap, topic, batches)
        print(f"#### visibility={mode}, one task of {rows:,} rows, Arrow batches of 10,000 made before the clock")
        print(
            f"   the writer built cold and pickled for the tasks (options, plan, check_services, the slots' "
            f"survey): {setup:.3f} s"
        )
        print(
            f"   the task's write without the profiler: {task_wall:.3f} s ({rows / task_wall:,.0f} rows/s); "
            f"the driver's commit: {commit_wall:.3f} s"
        )
        print(
            f"   bare loop over the same batches (to_pylist, produce, one transaction): {bare:.3f} s "
            f"({rows / bare:,.0f} rows/s), its init_transactions {bare_init:.3f} s more"
        )
        batch_id += 1
        writer, _ = writer_of(batch_id)
        message, seconds, prof = _profiled(writer.write, iter(batches))
        _report(prof, f"the task's write, visibility={mode}, under cProfile", seconds, rows)
        if mode == "batch":
            _, seconds, prof = _profiled(writer.commit, [message])
            _report(prof, "the driver's commit (the publish of that task's rows) under cProfile", seconds, rows)


def _bare_loop(bootstrap: str, topic: str, batches: list[Any]) -> tuple[float, float]:
    """(init_transactions seconds, seconds of the rest): the least a Python task can do with the same Arrow batches."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "transactional.id": f"bench-bare-{uuid.uuid4().hex}",
        }
    )
    t0 = time.perf_counter()
    p.init_transactions(60)
    t1 = time.perf_counter()
    p.begin_transaction()
    for batch in batches:
        produce_pairs(p, topic, batch.column(0).to_pylist(), batch.column(1).to_pylist())
        p.poll(0)
    p.commit_transaction(120)
    return t1 - t0, time.perf_counter() - t1


# ---- the report --------------------------------------------------------------------------------------
def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _cpu_cells(runs: list[dict[str, float | None]]) -> str:
    cells = []
    for k in COMPONENTS:
        vals = [r[k] for r in runs if r[k] is not None]
        cells.append("n/a" if not vals else f"{_med(vals):.2f}")  # type: ignore[arg-type]
    return " | ".join(cells)


def _progress_medians(events: list[dict[str, Any]]) -> tuple[float, float]:
    busy = [e for e in events if e["numInputRows"] > 0]
    return (
        _med([e["durationMs"]["triggerExecution"] for e in busy]),
        _med([e["durationMs"]["addBatch"] for e in busy]),
    )


@dataclass
class Results:
    """Per contender: seconds, CPU seconds per component, and (streams) the per-batch medians, one per round."""

    names: list[str]
    seconds: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    progress: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, who: str, seconds: float, cpu: dict[str, float | None], progress: tuple[float, float] | None) -> None:
        self.seconds.setdefault(who, []).append(seconds)
        self.cpu.setdefault(who, []).append(cpu)
        if progress is not None:
            self.progress.setdefault(who, []).append(progress)

    def ratios(self, base: str, who: str) -> list[float]:
        """base's time / who's time, round by round (above 1: who is faster)."""
        return [b / x for b, x in zip(self.seconds[base], self.seconds[who], strict=True)]


def run_batches(spark: Any, bootstrap: str, a: Any, records: int, repeat: int, meter: Meter, check: Checker) -> Results:
    res = Results([PYNOOP, EOS_P, EOS_B, *([SPARK] if a.spark_sink else []), TXN1, TXN2, PLAIN1])
    df = frame(spark, records, a.size).cache()
    warm = frame(spark, max(1000, records // 10), a.size).cache()
    if checksum(df) != check.want or warm.count() != max(1000, records // 10):
        raise SystemExit("the cached input is not the input")

    def one(who: str, data: Any, n: int) -> tuple[str, float]:
        topic = create_topic(bootstrap, a.partitions)
        if who in (TXN1, TXN2, PLAIN1):
            return topic, loops(bootstrap, topic, n, a.size, procs=2 if who == TXN2 else 1, txn=who != PLAIN1)
        return topic, write_batch(data, who, bootstrap, topic)

    for who in res.names:  # untimed: Python workers started, every write path warm
        one(who, warm, max(1000, records // 10))
    print("warm-up writes done", flush=True)
    for rnd in range(repeat):
        for who in res.names:
            meter.start()
            topic, seconds = one(who, df, records)
            used = meter.stop()
            if who != PYNOOP:
                check(topic, who)
            res.add(who, seconds, used, None)
            print(f"  round {rnd + 1} {who:40} {seconds:7.2f} s  {records / seconds:>10,.0f} records/s", flush=True)
    df.unpersist()
    warm.unpersist()
    return res


def run_streams(spark: Any, bootstrap: str, a: Any, records: int, meter: Meter, check: Checker) -> Results:
    res = Results([NOOP, PYNOOP, EOS_P, EOS_B, *([SPARK, SPARK_SPARK] if a.spark_sink else [])])
    source_topic = fill_input(bootstrap, records, a.size, a.partitions)
    for rnd in range(a.stream_repeat):
        for who in res.names:
            topic = None if who in (NOOP, PYNOOP) else create_topic(bootstrap, a.partitions)
            meter.start()
            seconds, events = run_stream(spark, who, bootstrap, source_topic, topic, records // a.batches)
            used = meter.stop()
            rows = sum(e["numInputRows"] for e in events)
            if rows != records:
                raise SystemExit(f"{who}: the stream read {rows:,} rows, not {records:,}")
            if topic is not None:
                check(topic, f"{who} (stream)")
            res.add(who, seconds, used, _progress_medians(events))
            print(f"  stream round {rnd + 1} {who:46} {seconds:7.2f} s", flush=True)
    return res


def report_batches(res: Results, records: int, a: Any, repeat: int) -> None:
    base = SPARK if a.spark_sink else None
    print(
        f"\nBatch write of {records:,} records ({a.size} B values, keyed, {a.partitions} partitions), {repeat} "
        "round(s); ratios: the median of the rounds' ratios (each round's in brackets)"
    )
    head = "| writer | seconds (median) | records/s |" + (" x Spark's sink |" if base else "") + " x limit |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for who in res.names:
        t = _med(res.seconds[who])
        cells = [who, f"{t:.2f}", f"{records / t:,.0f}"]
        for b in ([base] if base else []) + [TXN2]:
            per = res.ratios(b, who)
            cells.append(f"{_med(per):.2f} ({', '.join(f'{r:.2f}' for r in per)})")
        print("| " + " | ".join(cells) + " |")
    print("\nCPU seconds per write (medians)\n| writer | " + " | ".join(COMPONENTS) + " |")
    print("|" + "---|" * (len(COMPONENTS) + 1))
    for who in res.names:
        print(f"| {who} | {_cpu_cells(res.cpu[who])} |")
    if base:
        got = _med(res.ratios(base, EOS_P))
        print(
            f"\ntarget (issue 31): visibility=partition >= 0.8x Spark's sink on the batch write: {got:.2f}x -> "
            f"{'met' if got >= 0.8 else 'NOT met'}"
        )


def report_streams(res: Results, records: int, a: Any) -> None:
    base = SPARK if a.spark_sink else None
    print(
        f"\nStream of {records:,} records in {a.batches} micro-batches (availableNow, kafka-eos source unless "
        f"named), {a.stream_repeat} round(s); per batch: medians of the batches with rows"
    )
    head = "| pipeline | seconds | x Spark's sink | - Python floor s | triggerExecution ms | addBatch ms |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    floor = _med(res.seconds[PYNOOP])
    for who in res.names:
        t = _med(res.seconds[who])
        ratio = f"{_med(res.ratios(base, who)):.2f}" if base else "n/a"
        trig = _med([x for x, _ in res.progress[who]])
        add = _med([y for _, y in res.progress[who]])
        own = "" if who in (NOOP, PYNOOP) else f"{t - floor:+.2f}"
        print(f"| {who} | {t:.2f} | {ratio} | {own} | {trig:.0f} | {add:.0f} |")
    print("\nCPU seconds per stream (medians)\n| pipeline | " + " | ".join(COMPONENTS) + " |")
    print("|" + "---|" * (len(COMPONENTS) + 1))
    for who in res.names:
        print(f"| {who} | {_cpu_cells(res.cpu[who])} |")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--profile-child"]:
        mode, bootstrap, sizes, size, partitions = args[1:6]
        _profile_child(mode, bootstrap, [int(n) for n in sizes.split(",")], int(size), int(partitions))
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100k records, 1 round")
    p.add_argument("--records", type=int)
    p.add_argument("--size", type=int, default=100, help="value bytes (at least 12)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of every target topic and of the input")
    p.add_argument("--batches", type=int, default=10, help="micro-batches of the stream")
    p.add_argument("--repeat", type=int, help="rounds of batch writes (default 3; --quick 1)")
    p.add_argument("--stream-repeat", type=int, help="rounds of streams (default 2; --quick 1)")
    p.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"))
    p.add_argument("--broker", choices=BROKERS, default="apache", help="the embedded broker when no --bootstrap")
    p.add_argument("--spark-sink", action="store_true", help='Spark\'s own format("kafka") too (peer environment)')
    p.add_argument("--profile", action="store_true", help="cProfile one task of each mode afterwards")
    p.add_argument("--no-batch", action="store_true", help="no batch writes")
    p.add_argument("--no-stream", action="store_true", help="no streams")
    a = p.parse_args(args)
    records = a.records or (100_000 if a.quick else 1_000_000)
    repeat = a.repeat or (1 if a.quick else 3)
    a.stream_repeat = a.stream_repeat or (1 if a.quick else 2)
    if a.size < 12:
        raise SystemExit("--size must be at least 12")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    load0 = os.getloadavg()
    print(
        f"bench.kafka_sink: {records:,} records x {a.size} B, {a.partitions} partitions; load average at the "
        f"start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} ({os.cpu_count()} cores)",
        flush=True,
    )
    batches = streams = None
    profiles: list[str] = []
    with kafka(a.bootstrap, a.broker) as bootstrap:
        if not (a.no_batch and a.no_stream):
            spark = session(a.spark_sink)
            try:
                meter = Meter(spark, bootstrap)
                spark.dataSource.register(noop_source("bench-kafka-noop"))
                want = checksum(frame(spark, records, a.size))
                check = Checker(spark, bootstrap, records, a.size, a.partitions, want)
                if not a.no_batch:
                    batches = run_batches(spark, bootstrap, a, records, repeat, meter, check)
                if not a.no_stream:
                    streams = run_streams(spark, bootstrap, a, records, meter, check)
            finally:
                spark.stop()
        if a.profile:
            for mode in ("partition", "batch"):
                sizes = [records // 2, records // a.batches // a.partitions]  # a batch write's task, a micro-batch's
                profiles.append(profile_task(bootstrap, mode, sizes, a.size, a.partitions))
    load1 = os.getloadavg()
    if batches:
        report_batches(batches, records, a, repeat)
    if streams:
        report_streams(streams, records, a)
    for text in profiles:
        print("\n" + text)
    print(f"\nload average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
