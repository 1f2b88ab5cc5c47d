"""Benchmark: kafka-eos in Spark vs a plain confluent-kafka consumer loop, and a read task's peak memory.

Run: ``.venv/bin/python -m bench.kafka_source [--quick] [--records N] [--size B] [--partitions P]
[--repeat R] [--big-mb M] [--bootstrap HOST:PORT] [--broker apache|tansu] [--spark-source]``.
With ``--spark-source`` (in the peer environment: ``make peer-venv``, then ``PYSPARK_PYTHON=.venv-peer/bin/python
.venv-peer/bin/python -m bench.kafka_source --spark-source``; Maven Central serves Spark's Kafka connector for
PySpark 4.2.0, not 4.3) Spark's own ``format("kafka")`` reads the same topic in the same session, its runs
interleaved with kafka-eos's, and the ratio kafka-eos / Spark's source is printed.

1. Throughput: one topic of ``--records`` records (default 1M) of ``--size`` bytes (100) in
   ``--partitions`` partitions (4), read to the end by
   - ``kafka-eos (Spark local[2], noop)``: ``spark.read.format("kafka-eos") ... .write.format("noop")``
     with warm Python workers and a warm JVM (two untimed reads of the topic first, as in a running
     stream; session start-up is not timed);
   - ``plain consumer loop``: this process alone, one confluent-kafka Consumer assigned to every
     partition, ``consume(1000)`` until the end offsets, librdkafka's defaults: the peer a user
     would write, with no Spark and no Arrow;
   - ``plain consumer loop, tuned``: the same with the fetch setting kafka-eos's read tasks use
     (``fetch.queue.backoff.ms=10``; the default, 1 s, idles a consumer whose queue fills);
   - ``plain loops, 2 processes, tuned``: the tuned loop in two processes, each with half the
     partitions: the limit on two cores.
   Each reader drains the topic ``--repeat`` times (3); its median is printed, in records/s,
   kafka-eos against each peer, and per core (kafka-eos / 2 against the tuned loop).
2. Memory: a partition of ``--big-mb`` MB (500) read by one kafka-eos read task (the same
   ``read()`` code path a Spark Python worker runs) in a fresh process: its peak RSS (VmHWM) above
   its RSS before the read, against the same figure for a 50 MB partition in the same run. The
   limit: the big read may grow by at most 25 % of the extra payload more than the small one (a
   reader that buffered its range would grow by all of it).

Kafka: ``--bootstrap`` or EOS_KAFKA_BOOTSTRAP, else a throwaway embedded broker: ``--broker apache``
(Apache Kafka, log on disk; the default) or ``tansu`` (memory storage). On 2 cores the broker
competes with the readers: its CPU seconds per read are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["main"]


BROKERS = ("apache", "tansu")


@contextmanager
def kafka(bootstrap: str | None, broker: str = "apache") -> Iterator[str]:
    """The named broker, or a throwaway embedded one stopped on exit: Apache Kafka (KRaft, log on
    disk; the default) or tansu (memory storage)."""
    if bootstrap:
        yield bootstrap
        return
    if broker not in BROKERS:
        raise SystemExit(f"--broker must be one of {', '.join(BROKERS)}, not {broker!r}")
    if broker == "apache":
        from connectors.services.apache_kafka import ApacheKafka

        service: Any = ApacheKafka()
    else:
        from connectors.services.embedded_kafka import EmbeddedKafka

        service = EmbeddedKafka()
    try:
        yield service.bootstrap
    finally:
        service.stop()


def broker_cpu_seconds(bootstrap: str) -> float | None:
    """CPU seconds (user + system) used so far by the process listening on ``bootstrap``'s port, or
    None when it is not found (a broker on another machine): the broker's share of a run."""
    from bench._cpu import listener_pid

    pid = listener_pid(bootstrap)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spent(before: float | None, after: float | None, runs: int) -> float | None:
    return None if before is None or after is None else (after - before) / runs


def make_topic(bootstrap: str, partitions: int, records_per_partition: int, size: int) -> str:
    """Create a topic and fill each partition; each ends with a one-record batch (tansu's high watermark)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the future resolves
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 200_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "message.max.bytes": 10_000_000,
            "compression.type": "none",
        }
    )
    payload = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
    for part in range(partitions):
        for _ in range(records_per_partition - 1):
            while True:
                try:
                    p.produce(topic, value=payload, partition=part)
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush()
        p.produce(topic, value=payload, partition=part)
        p.flush()
    return topic


# what kafka-eos's read tasks set besides librdkafka's defaults that changes the speed (sources/kafka/reader.py)
TUNED = {"fetch.queue.backoff.ms": 10}


def plain_loop(
    bootstrap: str, topic: str, partitions: int, only: list[int] | None = None, conf: dict[str, Any] | None = None
) -> tuple[int, float]:
    """Drain the topic (or the partitions ``only``) with one consumer in this process: (records, seconds)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-plain",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            **(conf or {}),
        }
    )
    mine = list(range(partitions)) if only is None else only
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in mine}
    c.assign([TopicPartition(topic, p, 0) for p in mine])
    done: set[int] = set()
    n = 0
    t0 = time.perf_counter()
    while len(done) < len(mine):
        for m in c.consume(1000, 1.0):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    done.add(m.partition())
                continue
            m.value()
            n += 1
    elapsed = time.perf_counter() - t0
    c.close()
    return n, elapsed


def _loop_child(
    bootstrap: str,
    topic: str,
    partitions: int,
    only: list[int],
    conf: dict[str, Any] | None,
    ready: Any,
    go: Any,
    out: Any,
) -> None:
    ready.set()
    go.wait()
    out.put(plain_loop(bootstrap, topic, partitions, only, conf)[0])


def plain_loops(
    bootstrap: str, topic: str, partitions: int, procs: int = 2, conf: dict[str, Any] | None = None
) -> tuple[int, float]:
    """The same loop in ``procs`` processes, each draining its share of the partitions: the limit on
    ``procs`` cores. (records, wall seconds from the common start to the last one done)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    shares = [list(range(partitions))[i::procs] for i in range(procs)]
    ready = [ctx.Event() for _ in shares]
    kids = [
        ctx.Process(target=_loop_child, args=(bootstrap, topic, partitions, share, conf, r, go, out))
        for share, r in zip(shares, ready, strict=True)
    ]
    for k in kids:
        k.start()
    for r in ready:
        r.wait(120)
    time.sleep(1.0)  # each child has its consumer up before the clock starts
    t0 = time.perf_counter()
    go.set()
    total = sum(out.get(timeout=1800) for _ in kids)
    elapsed = time.perf_counter() - t0
    for k in kids:
        k.join()
    return total, elapsed


def spark_read(spark: object, bootstrap: str, topic: str, fmt: str = "kafka-eos") -> tuple[int, float]:
    """(records, seconds) of one read of ``topic`` to its end into Spark's noop sink by ``fmt``."""
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "kafkaConsumer.pollTimeoutMs": "60000"}
    count_df = spark.read.format(fmt).options(**opts).load()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    count_df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - t0
    total = spark.read.format(fmt).options(**opts).load().count()  # type: ignore[attr-defined]
    return total, elapsed


def spark_connector_conf() -> dict[str, str]:
    """Session settings that put Spark's own Kafka connector beside kafka-eos (``--spark-source``); it exists
    for PySpark 4.2.0, not 4.3 (Maven Central serves no 4.3.0), so this runs in the peer environment."""
    import pyspark

    from connectors.services.spark_kafka import SPARK_KAFKA_VERSION, connector_jars

    if pyspark.__version__ != SPARK_KAFKA_VERSION:
        raise SystemExit(
            f"--spark-source needs PySpark {SPARK_KAFKA_VERSION} (the newest Spark whose Kafka connector Maven Central "
            f"serves), found {pyspark.__version__}: run make peer-venv, then .venv-peer/bin/python -m bench.<name> "
            "--spark-source"
        )
    from bench.upsert import find_jdbc_jar

    return {"spark.jars": ",".join([find_jdbc_jar(), *(str(j) for j in connector_jars())])}


def _median(repeat: int, run: Callable[[], tuple[int, float]]) -> tuple[int, float]:
    """(records, seconds) of the median of ``repeat`` runs; the record count must be the same in each."""
    runs = sorted((run() for _ in range(max(1, repeat))), key=lambda r: r[1])
    if len({n for n, _ in runs}) != 1:
        raise SystemExit(f"record counts differ between runs of one reader: {[n for n, _ in runs]}")
    return runs[len(runs) // 2]


_MEMORY_CHILD = """
import json, os, sys
from sources.kafka.options import parse_options
from sources.kafka.planner import KafkaPlanner
from sources.kafka.reader import read_partition

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0

bootstrap, topic = sys.argv[1:3]
planner = KafkaPlanner(parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                      "kafkaConsumer.pollTimeoutMs": "60000"}, streaming=False), streaming=False)
parts = planner.plan_batch()
planner.client.close()
import pyarrow  # loaded before the baseline, as in a worker
before = rss("VmRSS:")
rows = 0
payload = 0
for part in parts:
    for batch in read_partition(part):
        rows += batch.num_rows
        payload += batch.column(1).nbytes
print(json.dumps({"rows": rows, "payload": payload, "before": before, "peak": rss("VmHWM:")}))
"""


def worker_memory(bootstrap: str, topic: str) -> dict[str, int]:
    """Read every partition of ``topic`` with kafka-eos read tasks in a fresh process; its memory figures."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, bootstrap, topic],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100k records, a 150 MB partition")
    p.add_argument("--records", type=int)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each reader; the median counts")
    p.add_argument("--big-mb", type=int)
    p.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"))
    p.add_argument("--broker", choices=BROKERS, default="apache", help="the embedded broker when no --bootstrap")
    p.add_argument(
        "--spark-source",
        action="store_true",
        help="also read with Spark's own format(\"kafka\"), runs interleaved with kafka-eos's (needs the peer "
        "environment: make peer-venv, then .venv-peer/bin/python -m bench.kafka_source --spark-source)",
    )
    args = p.parse_args(argv)
    records = args.records or (100_000 if args.quick else 1_000_000)
    conf = spark_connector_conf() if args.spark_source else {}
    big_mb = args.big_mb or (150 if args.quick else 500)
    small_mb = min(50, big_mb)
    os.environ["PYSPARK_PYTHON"] = sys.executable

    with kafka(args.bootstrap, args.broker) as bootstrap:
        t0 = time.perf_counter()
        topic = make_topic(bootstrap, args.partitions, records // args.partitions, args.size)
        print(
            f"produced {records} x {args.size} B in {args.partitions} partitions in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )

        from bench.upsert import bench_session

        spark = bench_session("bench-kafka-source", **conf)
        t_jvm: float | None = None
        try:
            for _ in range(2):  # Python workers started, the JVM's Arrow path compiled
                spark_read(spark, bootstrap, topic)
                if args.spark_source:
                    spark_read(spark, bootstrap, topic, "kafka")
            if args.spark_source:  # rounds interleaved: each pair shares the machine's load of the moment
                eos_runs, jvm_runs = [], []
                for _ in range(max(1, args.repeat)):
                    eos_runs.append(spark_read(spark, bootstrap, topic))
                    jvm_runs.append(spark_read(spark, bootstrap, topic, "kafka"))
                n_jvm, t_jvm = _median(len(jvm_runs), iter(jvm_runs).__next__)
                if n_jvm != records:
                    print(f'Spark\'s format("kafka") read {n_jvm} records, not {records}')
                    return 1
                n_spark, t_spark = _median(len(eos_runs), iter(eos_runs).__next__)
                cpu_spark = None
            else:
                cpu0 = broker_cpu_seconds(bootstrap)
                n_spark, t_spark = _median(args.repeat, lambda: spark_read(spark, bootstrap, topic))
                cpu_spark = _spent(cpu0, broker_cpu_seconds(bootstrap), args.repeat)
        finally:
            spark.stop()
        n_plain, t_plain = _median(args.repeat, lambda: plain_loop(bootstrap, topic, args.partitions))
        cpu0 = broker_cpu_seconds(bootstrap)
        n_tuned, t_tuned = _median(args.repeat, lambda: plain_loop(bootstrap, topic, args.partitions, conf=TUNED))
        cpu_tuned = _spent(cpu0, broker_cpu_seconds(bootstrap), args.repeat)
        n_two, t_two = _median(args.repeat, lambda: plain_loops(bootstrap, topic, args.partitions, 2, conf=TUNED))
        if not n_spark == n_plain == n_tuned == n_two:
            print(
                f"record counts differ: kafka-eos {n_spark}, plain {n_plain}, tuned {n_tuned}, "
                f"two tuned processes {n_two}"
            )
            return 1

        # the big partition (values of 10 KB so that producing 500 MB stays quick) and, as the in-run
        # peer, a 50 MB one (big enough for librdkafka's buffers to fill): a streaming reader grows
        # about the same on both, a buffering one by the difference in size
        value = 10_000
        t0 = time.perf_counter()
        big = make_topic(bootstrap, 1, big_mb * 1_000_000 // value, value)
        small = make_topic(bootstrap, 1, small_mb * 1_000_000 // value, value)
        print(f"produced a {big_mb} MB and a {small_mb} MB partition in {time.perf_counter() - t0:.1f}s", flush=True)
        mem = worker_memory(bootstrap, big)
        mem_small = worker_memory(bootstrap, small)

    rs, rp, rt, r2 = n_spark / t_spark, n_plain / t_plain, n_tuned / t_tuned, n_two / t_two
    grown = mem["peak"] - mem["before"]
    grown_small = mem_small["peak"] - mem_small["before"]
    extra = mem["payload"] - mem_small["payload"]
    limit = grown_small + extra // 4  # a reader buffering its range would grow by about `extra` more
    rows = [
        ("kafka-eos (Spark local[2], noop sink)", f"{n_spark:,}", f"{t_spark:.2f}", f"{rs:,.0f}"),
        *(
            [('Spark\'s format("kafka") (same session)', f"{records:,}", f"{t_jvm:.2f}", f"{records / t_jvm:,.0f}")]
            if t_jvm
            else []
        ),
        ("plain confluent-kafka loop (1 process)", f"{n_plain:,}", f"{t_plain:.2f}", f"{rp:,.0f}"),
        ("plain loop, tuned (1 process)", f"{n_tuned:,}", f"{t_tuned:.2f}", f"{rt:,.0f}"),
        ("plain loops, tuned, 2 processes (limit)", f"{n_two:,}", f"{t_two:.2f}", f"{r2:,.0f}"),
    ]
    print()
    print(f"{'reader':42} {'records':>12} {'seconds':>9} {'records/s':>12}")
    for r in rows:
        print(f"{r[0]:42} {r[1]:>12} {r[2]:>9} {r[3]:>12}")
    if t_jvm:
        print(f"{'ratio kafka-eos / Spark format(kafka)':42} {'':>12} {'':>9} {t_jvm / t_spark:>12.2f}")
    print(f"{'ratio kafka-eos / 1-process loop':42} {'':>12} {'':>9} {rs / rp:>12.2f}")
    print(f"{'ratio kafka-eos / tuned 1-process loop':42} {'':>12} {'':>9} {rs / rt:>12.2f}")
    print(f"{'ratio kafka-eos / tuned 2-process loops':42} {'':>12} {'':>9} {rs / r2:>12.2f}")
    print(f"{'per core: kafka-eos / 2 vs tuned loop':42} {'':>12} {'':>9} {rs / 2 / rt:>12.2f}")
    broker = "named broker" if args.bootstrap else f"embedded {args.broker}"
    if cpu_spark is not None and cpu_tuned is not None:  # on 2 cores the broker competes with the readers
        print(
            f"broker CPU ({broker}) per read: {cpu_spark:.2f} s under kafka-eos ({cpu_spark / t_spark:.0%} of a "
            f"core over its {t_spark:.2f} s), {cpu_tuned:.2f} s under the tuned loop ({cpu_tuned / t_tuned:.0%})"
        )
    print()
    print(f"read task on a {mem['payload'] / 1e6:,.0f} MB partition ({mem['rows']:,} records):")
    print(
        f"  RSS before read {mem['before'] / 1e6:,.0f} MB, peak {mem['peak'] / 1e6:,.0f} MB, "
        f"growth {grown / 1e6:,.0f} MB = {grown / mem['payload']:.1%} of the partition"
    )
    print(f"  same on a {mem_small['payload'] / 1e6:,.0f} MB partition: growth {grown_small / 1e6:,.0f} MB")
    ok = grown < limit
    print(
        f"  limit: growth < small-read growth + 25% of the extra {extra / 1e6:,.0f} MB = {limit / 1e6:,.0f} MB -> "
        f"{'OK (streams)' if ok else 'FAIL (memory grows with the range)'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
