"""Run one read with format("kafka") and with format("kafka-eos") and put what each gave side by side.

Rows are compared with every column (key, value, topic, partition, offset, timestamp, timestampType,
headers); streams by what the sink got per batch, the checkpoint's ``offsets/n`` and ``commits/n``, and
the progress events' per-source fields.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sources.kafka.offsets import ID_KEY, START_KEY

SPARK, EOS = "kafka", "kafka-eos"
FORMATS = (SPARK, EOS)
Row = tuple[Any, ...]


def options(bootstrap: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "kafkaConsumer.pollTimeoutMs": "20000", **extra}


def row_of(r: Any) -> Row:
    """A row as plain values: bytes for binary columns, headers as ((key, value), ...) or None."""
    d = r.asDict()
    out: list[Any] = []
    for name, value in d.items():
        if isinstance(value, bytearray):
            value = bytes(value)
        if name == "headers" and value is not None:
            value = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in value)
        out.append(value)
    return tuple(out)


def ordered(rows: list[Row]) -> list[Row]:
    """By (topic, partition, offset): columns 2, 3, 4 of Spark's schema."""
    return sorted(rows, key=lambda t: (t[2], t[3], t[4]))


@dataclass
class Read:
    schema: Any
    rows: list[Row]
    tasks: int  # Spark partitions (read tasks) of the scan


def read(spark: Any, fmt: str, opts: Mapping[str, str]) -> Read:
    df = spark.read.format(fmt).options(**opts).load()
    return Read(df.schema, ordered([row_of(r) for r in df.collect()]), df.rdd.getNumPartitions())


# ---- streams ----------------------------------------------------------------------------------------
def _last_json(path: Path) -> Any:
    text = path.read_bytes().lstrip(b"\x00").decode()  # Spark's sources/0/0 starts with a zero byte
    return json.loads(text.strip().splitlines()[-1])


def partition_offsets(value: Any) -> Any:
    """An offset as Spark's own source reads it: without the topic ids and the first batch's start kafka-eos
    records beside the offsets (``sources.kafka.offsets.ID_KEY``, ``START_KEY``: keys whose empty maps give Spark
    no partition)."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if not (k.startswith((ID_KEY, START_KEY)) and v == {})}


def offsets(checkpoint: str, *, raw: bool = False) -> dict[int, Any]:
    """offsets/n -> the source's end offsets of batch n (either source's JSON; ``raw``: with kafka-eos's topic
    ids, else as Spark's source reads them)."""
    d = Path(checkpoint, "offsets")
    if not d.is_dir():
        return {}
    found = {int(p.name): _last_json(p) for p in d.iterdir() if p.name.isdigit()}
    return found if raw else {n: partition_offsets(v) for n, v in found.items()}


def commits(checkpoint: str) -> set[int]:
    d = Path(checkpoint, "commits")
    return {int(p.name) for p in d.iterdir() if p.name.isdigit()} if d.is_dir() else set()


def spark_initial(checkpoint: str) -> Any:
    """The start of batch 0 as Spark's source keeps it (``sources/0/0``); kafka-eos writes no such file."""
    path = Path(checkpoint, "sources", "0", "0")
    return _last_json(path) if path.exists() else None


@dataclass
class Progress:
    batch: int
    rows: int
    start: Any
    end: Any
    latest: Any
    metrics: dict[str, str]

    def same_as(self) -> tuple[Any, ...]:
        """What both sources must agree on (batch ids aside)."""
        return (self.rows, self.start, self.end, self.latest)


def _json(text: str | None) -> Any:
    return None if text is None else partition_offsets(json.loads(text))


@dataclass
class Run:
    """One query run: the sink's rows per batch id (a replay overwrites), progress, and the error if it failed."""

    batches: dict[int, list[Row]] = field(default_factory=dict)
    progress: list[Progress] = field(default_factory=list)
    error: str | None = None


def stream(
    spark: Any,
    fmt: str,
    opts: Mapping[str, str],
    checkpoint: str,
    *,
    sink: dict[int, list[Row]] | None = None,
    fail_at: int | None = None,
    timeout: float = 180.0,
) -> Run:
    """An AvailableNow query from ``checkpoint`` into a by-batch sink (``sink``, kept across runs); the sink
    fails batch ``fail_at`` (after Spark wrote its offsets/n, before commits/n: a stop mid-batch)."""
    run = Run(batches={} if sink is None else sink)

    def write(df: Any, batch_id: int) -> None:
        if batch_id == fail_at:
            raise RuntimeError(f"sink stops in batch {batch_id}")
        run.batches[batch_id] = ordered([row_of(r) for r in df.collect()])

    q = (
        spark.readStream.format(fmt)
        .options(**opts)
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(timeout)
    except Exception as e:  # the query's own error, read below
        run.error = str(e)
    finally:
        if q.isActive:
            q.stop()
            run.error = run.error or f"did not finish in {timeout:.0f}s"
    run.progress = progress_of(q.recentProgress)
    return run


def progress_of(events: list[Any]) -> list[Progress]:
    out = []
    for p in events:
        src = p["sources"][0]
        out.append(
            Progress(
                batch=p["batchId"],
                rows=p["numInputRows"],
                start=_json(src.get("startOffset")),
                end=_json(src.get("endOffset")),
                latest=_json(src.get("latestOffset")),
                metrics=dict(src.get("metrics") or {}),
            )
        )
    return out


def assert_same_stream(spark_cp: str, eos_cp: str, spark_run: Run, eos_run: Run) -> None:
    """kafka-eos's batch n is Spark's batch n: rows, offsets/n (as Spark's source reads them), progress."""
    assert spark_run.error is None and eos_run.error is None, (spark_run.error, eos_run.error)
    so, eo = offsets(spark_cp), offsets(eos_cp)
    assert sorted(eo) == sorted(so), (so, eo)
    assert sorted(spark_run.batches) == sorted(so) and sorted(eos_run.batches) == sorted(eo)
    for n in so:
        assert eos_run.batches[n] == spark_run.batches[n], f"rows of Spark's batch {n}"
        assert eo[n] == so[n], f"offsets/{n}: {so[n]} vs kafka-eos's {eo[n]}"
    sp = {p.batch: p for p in spark_run.progress}
    ep = {p.batch: p for p in eos_run.progress}
    assert sorted(ep) == sorted(sp), (sp, ep)
    for n, p in sp.items():
        ours = ep[n]
        assert ours.same_as() == p.same_as(), (n, p, ours)
        assert_behind_metrics(p, ours)


def assert_behind_metrics(spark_p: Progress, eos_p: Progress) -> None:
    """Spark's source reports the offsets-behind metrics; a Python data source (PySpark's API has no
    metrics hook) reports none, and latestOffset - endOffset gives the same numbers."""
    assert eos_p.metrics == {}, eos_p.metrics
    latest, end = eos_p.latest, eos_p.end
    behind = [latest[t][p] - end[t].get(p, 0) for t in latest for p in latest[t]]
    if behind:
        assert float(spark_p.metrics["maxOffsetsBehindLatest"]) == max(behind), (spark_p.metrics, behind)
        assert float(spark_p.metrics["minOffsetsBehindLatest"]) == min(behind), (spark_p.metrics, behind)
        avg = sum(behind) / len(behind)  # Spark shows it with one decimal
        assert float(spark_p.metrics["avgOffsetsBehindLatest"]) == round(avg, 1), (spark_p.metrics, avg)


# ---- Kafka ------------------------------------------------------------------------------------------
def create_topic(admin: AdminClient, name: str, partitions: int, config: Mapping[str, str] | None = None) -> str:
    admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))])[name].result(30)
    wait_until(lambda: _leaders(admin, name) == partitions, f"{name} with {partitions} partitions")
    return name


def _leaders(admin: AdminClient, name: str) -> int:
    t = admin.list_topics(name, timeout=10).topics.get(name)
    if t is None or t.error is not None or any(p.leader < 0 for p in t.partitions.values()):
        return -1
    return len(t.partitions)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def send(bootstrap: str, topic: str, records: list[dict[str, Any]], **conf: Any) -> None:
    """Produce ``records`` (dicts of produce() arguments) and wait for every delivery."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    errors: list[str] = []
    for r in records:
        p.produce(topic, on_delivery=lambda err, _m: errors.append(str(err)) if err else None, **r)
    assert p.flush(30) == 0 and not errors, errors


# ---- Java's default partitioner, in Python (the Kafka sink's oracle) -----------------------------------
def murmur2(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2 (seed 0x9747b28c), as an unsigned 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = len(data) & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


__all__ = [
    "EOS",
    "FORMATS",
    "SPARK",
    "Progress",
    "Read",
    "Run",
    "assert_same_stream",
    "commits",
    "create_topic",
    "java_partition",
    "murmur2",
    "offsets",
    "options",
    "read",
    "send",
    "spark_initial",
    "stream",
    "wait_until",
]
