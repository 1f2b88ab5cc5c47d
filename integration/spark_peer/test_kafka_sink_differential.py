"""Spark's own Kafka sink is the oracle of the ``kafka-eos`` sink on the happy path: the same rows written
once by ``format("kafka")`` and once by ``format("kafka-eos")`` (``visibility=partition`` and
``visibility=batch``), in one Spark session, must give topics holding the same records: key, value and
headers as bytes, each record in the same partition (Java's default partitioner hashes a key with murmur2;
the sink sets librdkafka's ``murmur2_random``, which hashes it the same way; an explicit ``partition`` column
wins), the rows of one task in their order, the ``topic`` option over the ``topic`` column, null keys, null
values, string and binary columns. A third oracle, independent of both clients: Java's murmur2 in Python
(``java_partition``).

Differences on purpose, asserted here (for the comparison with Spark's sink in docs/kafka-sink.md):

- a keyless record's partition: both clients pick one "sticky" partition for a run of keyless records
  (Java's built-in partitioner; librdkafka's ``sticky.partitioning.linger.ms``), so which one differs from
  run to run in either; keyless records are compared as records, not by partition;
- offsets: a transaction's commit marker takes an offset in each partition it wrote, so kafka-eos's
  records sit at other offsets than Spark's; records and their order are compared, not offsets;
- a batch write needs ``sink.id`` and ``batch.id``; running it again with the same ``batch.id`` writes
  nothing, where Spark's sink writes every record again;
- rows that name their topics (no ``topic`` option) need ``marker.topic`` (the topic whose partition 0 the
  markers are kept against), else the write is refused before anything is written; Spark's sink needs none;
- a streaming query leaves a marker per writer (consumer-group offsets) whose batch is Spark's last
  ``commits/n``; Spark's sink leaves none.

A ``headers`` column built with ``array(struct(...))`` has non-nullable parts; Spark's sink takes it, and so
must kafka-eos (it refused it until its type check compared the type's shape only).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.errors import AnalysisException

from connectors.toolkit.checker import last_commit
from connectors.toolkit.topic_checker import marker_batches, open_transactions
from integration.spark_peer.peer import create_topic, java_partition, murmur2, send

pytestmark = pytest.mark.integration

PARTITIONS = 4
WRITERS = ("spark", "eos-partition", "eos-batch")  # Spark's format("kafka"), kafka-eos in both modes
N = 120  # rows of a batch case, in 2 Spark partitions (2 write tasks)

Rec = tuple[int, Any, Any, Any]  # (partition, key bytes | None, value bytes | None, headers | None)


def test_murmur2_matches_javas() -> None:
    # values of Kafka's own UtilsTest.testMurmur2 (signed ints there)
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for key, signed in cases.items():
        assert murmur2(key) == signed & 0xFFFFFFFF, key


# ---- the rows -----------------------------------------------------------------------------------------
def _rows(*, key_type: str, value_type: str, topic: Callable[[int], str | None]) -> list[dict[str, Any]]:
    """``N`` rows, each unique by (key, value): null keys (every 10th), an empty key, non-ASCII and (binary)
    non-UTF-8 bytes, null values (tombstones), headers null, empty, repeated, with null and empty values, an
    explicit partition on every 4th row and on some keyless ones."""

    def cast(text: str | None, kind: str, i: int) -> Any:
        if text is None or kind == "string":
            return text
        return text.encode() + (b"\xff\x00" if i % 2 else b"")  # not UTF-8

    rows = []
    for i in range(N):
        key = None if i % 10 == 3 else ("" if i == 8 else f"k{i}-é")
        value = None if i % 13 == 4 and key is not None else f"v{i}-ü"
        headers: Any = None
        if i % 5 == 1:
            headers = []
        elif i % 5 >= 2:
            headers = [("h", f"x{i}".encode()), ("h", None), ("ü", b"")][: i % 5]
        partition = (i * 7) % PARTITIONS if i % 4 == 0 or i % 20 == 3 else None
        rows.append(
            {
                "key": cast(key, key_type, i),
                "value": cast(value, value_type, i),
                "headers": headers,
                "partition": partition,
                "topic": topic(i),
            }
        )
    return rows


def _bytes(v: Any) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def expected(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each row as the record a reader gets: (key, value, headers) as bytes; no or empty headers read as None."""
    return [(_bytes(r["key"]), _bytes(r["value"]), tuple(r["headers"]) if r["headers"] else None) for r in rows]


def frame(spark: Any, rows: list[dict[str, Any]], *, key_type: str, value_type: str, with_topic: bool) -> Any:
    schema = (
        f"key {key_type}, value {value_type}, headers array<struct<key: string, value: binary>>, "
        f"partition int{', topic string' if with_topic else ''}"
    )
    cols = ["key", "value", "headers", "partition", *(["topic"] if with_topic else [])]
    data = [tuple(r[c] for c in cols) for r in rows]
    return spark.createDataFrame(spark.sparkContext.parallelize(data, 2), schema)  # rows 0-59 task 0, 60-119 task 1


# ---- writing and reading ------------------------------------------------------------------------------
def write(df: Any, writer: str, bootstrap: str, sink_id: str, batch_id: int = 1, **opts: str) -> None:
    w = df.write.option("kafka.bootstrap.servers", bootstrap).options(**opts)
    if writer == "spark":
        w.format("kafka").save()
        return
    w.format("kafka-eos").option("visibility", writer.split("-")[1]).option("sink.id", sink_id)
    w.option("batch.id", str(batch_id)).mode("append").save()


def read_topics(bootstrap: str, *topics: str) -> dict[str, list[Rec]]:
    """Every committed record of each of ``topics``, by partition then offset (one consumer for all)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"diff-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    meta = c.list_topics(timeout=10).topics
    tps = [(t, p) for t in topics for p in sorted(meta[t].partitions)]
    c.assign([TopicPartition(t, p, 0) for t, p in tps])
    found: list[tuple[str, int, int, Rec]] = []
    eof: set[tuple[str, int]] = set()
    try:
        while len(eof) < len(tps):
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    eof.add((m.topic(), m.partition()))
                    continue
                headers = tuple(m.headers()) if m.headers() else None
                found.append((m.topic(), m.partition(), m.offset(), (m.partition(), m.key(), m.value(), headers)))
    finally:
        c.close()
    found.sort(key=lambda f: f[:3])
    return {t: [f[3] for f in found if f[0] == t] for t in topics}


def assert_same_records(got: dict[str, list[Rec]], rows: list[dict[str, Any]], origin: Callable[[int], int]) -> None:
    """Each writer's topic holds exactly ``rows``; a keyed or explicitly partitioned row in the partition Java's
    partitioner (or the column) gives, where Spark's sink put it; in each partition the rows of one task
    (``origin`` of a row's index) in the task's order."""
    want = expected(rows)
    index = {rec: i for i, rec in enumerate(want)}
    assert len(index) == len(rows), "the rows must be unique"
    placed = {i for i, r in enumerate(rows) if r["partition"] is not None or r["key"] is not None}
    for writer, recs in got.items():
        assert Counter(r[1:] for r in recs) == Counter(want), f"{writer}: not exactly the rows"
        for part, key, value, headers in recs:
            i = index[(key, value, headers)]
            pinned = rows[i]["partition"]
            if pinned is not None:
                assert part == pinned, f"{writer}: row {i} has partition {pinned}, written to {part}"
            elif key is not None:
                assert part == java_partition(key, PARTITIONS), f"{writer}: row {i} (key {key!r}) in partition {part}"
        for part in range(PARTITIONS):
            seq = [index[r[1:]] for r in recs if r[0] == part]
            for task in {origin(i) for i in seq}:
                mine = [i for i in seq if origin(i) == task]
                assert mine == sorted(mine), f"{writer}: partition {part} has task {task}'s rows out of order: {mine}"
    theirs = Counter(r for r in got["spark"] if index[r[1:]] in placed)
    for writer in WRITERS[1:]:
        ours = Counter(r for r in got[writer] if index[r[1:]] in placed)
        assert ours == theirs, f"{writer}: records in other partitions than Spark's sink put them"
    # on purpose: a keyless row without a partition goes where each client's sticky partitioner puts it
    keyless = len(rows) - len(placed)
    assert keyless > 0, "no keyless row: the case proves less than it says"


@pytest.fixture(scope="module")
def admin(kafka_service: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_service.bootstrap})


def _topics(admin: AdminClient, name: str, *suffixes: str) -> dict[str, str]:
    prefix = f"ksd-{name}-{uuid.uuid4().hex[:6]}"
    return {s: create_topic(admin, f"{prefix}-{s}", PARTITIONS) for s in suffixes}


# ---- batch writes -------------------------------------------------------------------------------------
def test_batch_write_topic_option_over_the_column(spark: Any, kafka_service: Any, admin: AdminClient) -> None:
    """String keys, binary values; every row's topic column names a decoy, the ``topic`` option wins. Then the
    same write again: kafka-eos with the same batch.id writes nothing, Spark's sink writes every row twice."""
    bootstrap = kafka_service.bootstrap
    t = _topics(admin, "opt", "decoy", *WRITERS)
    rows = _rows(key_type="string", value_type="binary", topic=lambda i: t["decoy"])
    df = frame(spark, rows, key_type="string", value_type="binary", with_topic=True)
    sink_id = f"ksd-opt-{uuid.uuid4().hex[:6]}"
    for writer in WRITERS:
        write(df, writer, bootstrap, f"{sink_id}-{writer}", topic=t[writer])
    read = read_topics(bootstrap, *t.values())
    got = {w: read[t[w]] for w in WRITERS}
    assert read[t["decoy"]] == [], "the topic option must override the topic column"
    assert_same_records(got, rows, origin=lambda i: i // (N // 2))

    # on purpose: the same batch.id again is a no-op for kafka-eos; Spark's at-least-once sink duplicates
    for writer in WRITERS:
        write(df, writer, bootstrap, f"{sink_id}-{writer}", topic=t[writer])
    read = read_topics(bootstrap, *(t[w] for w in WRITERS))
    again = {w: read[t[w]] for w in WRITERS}
    assert len(again["spark"]) == 2 * N and Counter(again["spark"]) == Counter(got["spark"] * 2)
    assert again["eos-partition"] == got["eos-partition"] and again["eos-batch"] == got["eos-batch"]
    assert not open_transactions(bootstrap, [t[w] for w in WRITERS])


def test_batch_write_rows_name_their_topics(spark: Any, kafka_service: Any, admin: AdminClient) -> None:
    """Binary keys, string values, no ``topic`` option: each row goes to the topic its column names (two
    topics). kafka-eos then needs ``marker.topic``; Spark's sink needs nothing."""
    bootstrap = kafka_service.bootstrap
    t = {w: _topics(admin, "col", "a", "b") for w in WRITERS}
    sink_id = f"ksd-col-{uuid.uuid4().hex[:6]}"
    rows: dict[str, list[dict[str, Any]]] = {}
    for writer in WRITERS:
        rows[writer] = _rows(
            key_type="binary", value_type="string", topic=lambda i, w=writer: t[w]["a" if i % 3 else "b"]
        )
        df = frame(spark, rows[writer], key_type="binary", value_type="string", with_topic=True)
        extra = {} if writer == "spark" else {"marker.topic": t[writer]["a"]}
        write(df, writer, bootstrap, f"{sink_id}-{writer}", **extra)
    read = read_topics(bootstrap, *(t[w][s] for w in WRITERS for s in ("a", "b")))
    got = {w: {s: read[t[w][s]] for s in ("a", "b")} for w in WRITERS}
    for s in ("a", "b"):
        picked = [i for i in range(N) if (i % 3 != 0) == (s == "a")]
        mine = [rows["spark"][i] for i in picked]
        assert_same_records(
            {w: got[w][s] for w in WRITERS}, mine, origin=lambda j, picked=picked: picked[j] // (N // 2)
        )
    # on purpose: without marker.topic kafka-eos refuses before writing, naming the option
    with pytest.raises(AnalysisException, match=r"marker\.topic"):
        write(df, "eos-partition", bootstrap, f"{sink_id}-no-marker")


def test_headers_built_with_array_and_struct(spark: Any, kafka_service: Any, admin: AdminClient) -> None:
    """Headers built the usual way, ``array(struct(lit(k) AS key, v AS value))``: the column's type is
    array<struct<key:string,value:binary>> with non-nullable parts, which Spark's sink takes."""
    from pyspark.sql import functions as F

    bootstrap = kafka_service.bootstrap
    t = _topics(admin, "hdr", *WRITERS)
    df = spark.range(6).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
        F.array(F.struct(F.lit("src").alias("key"), F.col("id").cast("string").cast("binary").alias("value"))).alias(
            "headers"
        ),
    )
    sink_id = f"ksd-hdr-{uuid.uuid4().hex[:6]}"
    for writer in WRITERS:
        write(df, writer, bootstrap, f"{sink_id}-{writer}", topic=t[writer])
    read = read_topics(bootstrap, *t.values())
    got = {w: sorted(read[t[w]]) for w in WRITERS}
    assert len(got["spark"]) == 6 and got["eos-partition"] == got["spark"] and got["eos-batch"] == got["spark"]


# ---- streaming ---------------------------------------------------------------------------------------
def test_stream_from_kafka(spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path) -> None:
    """kafka-eos source -> key, value, headers and a computed partition for some rows -> each sink, availableNow
    in several micro-batches: the same records in the same partitions, each source partition's records in order;
    kafka-eos's last marker is Spark's last commits/n."""
    from pyspark.sql import functions as F

    bootstrap = kafka_service.bootstrap
    t = _topics(admin, "stream", "in", *WRITERS)
    rows = _rows(key_type="binary", value_type="binary", topic=lambda i: None)
    # row i goes to source partition i % 2 at offset i // 2: a read task reads one source partition in order
    send(
        bootstrap,
        t["in"],
        [
            {"key": r["key"], "value": r["value"], "headers": r["headers"] or None, "partition": i % 2}
            for i, r in enumerate(rows)
        ],
    )
    for i, r in enumerate(rows):  # what the query computes: keyed rows of source partition 0, offset % 4 == 2
        r["partition"] = len(r["key"]) % PARTITIONS if r["key"] is not None and i % 8 == 4 else None
    pin = F.col("key").isNotNull() & (F.col("partition") == 0) & (F.col("offset") % 4 == 2)
    out = (
        spark.readStream.format("kafka-eos")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", t["in"])
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", "60")
        .load()
        .select("key", "value", "headers", F.when(pin, F.length("key") % PARTITIONS).cast("int").alias("partition"))
    )
    sink_id = f"ksd-stream-{uuid.uuid4().hex[:6]}"
    checkpoints = {w: str(tmp_path / w) for w in WRITERS}
    for writer in WRITERS:  # one after the other: on a loaded machine a stream source's Python planner started
        # beside a running query may miss Spark's connect-back timeout ("Python worker failed to connect back")
        w = out.writeStream.option("kafka.bootstrap.servers", bootstrap).option("topic", t[writer])
        w = w.option("checkpointLocation", checkpoints[writer]).trigger(availableNow=True)
        if writer != "spark":
            w = w.option("visibility", writer.split("-")[1]).option("sink.id", f"{sink_id}-{writer}")
        q = w.format("kafka" if writer == "spark" else "kafka-eos").start()
        assert q.awaitTermination(120), f"{writer}: the query did not finish in 120 s"
        assert q.exception() is None, (writer, q.exception())
    read = read_topics(bootstrap, *(t[w] for w in WRITERS))
    got = {w: read[t[w]] for w in WRITERS}
    assert_same_records(got, rows, origin=lambda i: i % 2)
    # the same micro-batches: N / 60 of them, batch 0 the first
    last = {w: last_commit(checkpoints[w]) for w in WRITERS}
    assert last["spark"] == last["eos-partition"] == last["eos-batch"] == N // 60 - 1, last
    for writer in WRITERS[1:]:
        markers = marker_batches(bootstrap, f"{sink_id}-{writer}", t[writer])
        assert max(m.batch for m in markers.values()) == last[writer], (writer, markers)
    assert marker_batches(bootstrap, f"{sink_id}-spark", t["spark"]) == {}  # Spark's sink leaves no marker
    assert not open_transactions(bootstrap, [t[w] for w in WRITERS])
