"""One checkpoint, two sources: a query moves from Spark's format("kafka") to format("kafka-eos") and back,
through a batch that adds a partition and through stops in the middle of a planned batch (offsets/n written,
commits/n not), and its sink holds every record exactly once.

The sink is the idempotent by-batch sink exactly-once needs (a replayed batch id overwrites what its earlier
attempt wrote); the check is record by record against a plain consumer's read of the topic.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from integration.spark_peer.peer import (
    EOS,
    SPARK,
    Row,
    commits,
    create_topic,
    offsets,
    options,
    read,
    send,
    spark_initial,
    stream,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def admin(kafka_service: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_service.bootstrap})


def _values(start: int, count: int, partitions: int) -> list[dict[str, Any]]:
    return [{"key": b"k%d" % i, "value": b"r%d" % i, "partition": i % partitions} for i in range(start, start + count)]


def _exactly_once(spark: Any, bootstrap: str, topic: str, sink: dict[int, list[Row]]) -> None:
    truth = read(spark, SPARK, options(bootstrap, subscribe=topic)).rows
    got = [row for n in sorted(sink) for row in sink[n]]
    counts = Counter((r[2], r[3], r[4]) for r in got)
    duplicates = {k: c for k, c in counts.items() if c > 1}
    missing = [(r[2], r[3], r[4]) for r in truth if (r[2], r[3], r[4]) not in counts]
    assert not duplicates and not missing, f"duplicates {duplicates}, missing {missing}"
    assert sorted(got, key=lambda r: (r[3], r[4])) == sorted(truth, key=lambda r: (r[3], r[4]))  # every column


def test_checkpoint_moves_between_sparks_source_and_kafka_eos(
    spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path
) -> None:
    bootstrap = kafka_service.bootstrap
    topic = create_topic(admin, f"swap-{uuid.uuid4().hex[:8]}", 2)
    opts = options(bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="8")
    cp, sink = str(tmp_path / "checkpoint"), {}
    send(bootstrap, topic, _values(0, 20, 2))

    # 1. Spark's source starts the query: 20 records, 8 a batch
    first = stream(spark, SPARK, opts, cp, sink=sink)
    assert first.error is None and commits(cp) == {0, 1, 2} and offsets(cp)[2] == {topic: {"0": 10, "1": 10}}

    # 2. kafka-eos continues the checkpoint where Spark's source stopped
    send(bootstrap, topic, _values(20, 10, 2))
    second = stream(spark, EOS, opts, cp, sink=sink)
    assert second.error is None, second.error
    assert [p.batch for p in second.progress] == [3, 4] and second.progress[0].start == {topic: {"0": 10, "1": 10}}
    assert offsets(cp)[4] == {topic: {"0": 15, "1": 15}}

    # 3. a partition is added; Spark's source plans the batch that finds it, and stops inside it
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    wait_until(lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3, "3 partitions")
    send(bootstrap, topic, _values(30, 12, 3))
    third = stream(spark, SPARK, opts, cp, sink=sink, fail_at=5)
    assert third.error is not None and "sink stops in batch 5" in third.error, third.error
    planned = offsets(cp)[5]
    assert 5 not in commits(cp) and set(planned[topic]) == {"0", "1", "2"}, planned  # the new partition is in it
    assert planned[topic]["2"] > 0

    # 4. kafka-eos takes over mid-batch: it replays Spark's planned batch 5 with exactly its ranges (the new
    #    partition from its earliest offset), then reads on
    fourth = stream(spark, EOS, opts, cp, sink=sink)
    assert fourth.error is None, fourth.error
    replay = fourth.progress[0]
    assert replay.batch == 5 and replay.start == {topic: {"0": 15, "1": 15}} and replay.end == planned
    assert replay.rows == sum(planned[topic].values()) - 30

    # 5. more records; kafka-eos stops inside a planned batch
    send(bootstrap, topic, _values(42, 9, 3))
    last = max(offsets(cp))
    fifth = stream(spark, EOS, opts, cp, sink=sink, fail_at=last + 1)
    assert fifth.error is not None and last + 1 not in commits(cp) and last + 1 in offsets(cp), fifth.error
    eos_planned = offsets(cp)[last + 1]
    recorded = offsets(cp, raw=True)[last + 1]  # kafka-eos records the topic's id beside the offsets (issue 45)
    assert [k for k in recorded if k.startswith(f"kafka-eos:topic-id:{topic}=")] and recorded != eos_planned

    # 6. Spark's source takes over mid-batch: it replays kafka-eos's planned batch with its ranges (the topic id
    #    kafka-eos recorded in it is an empty map to Spark's parser), and finishes
    sixth = stream(spark, SPARK, opts, cp, sink=sink)
    assert sixth.error is None, sixth.error
    assert sixth.progress[0].batch == last + 1 and sixth.progress[0].end == eos_planned
    assert offsets(cp)[max(offsets(cp))] == {topic: {"0": 22, "1": 22, "2": 7}}
    assert commits(cp) == set(offsets(cp))
    _exactly_once(spark, bootstrap, topic, sink)


def test_kafka_eos_pinning_batch_then_sparks_source(
    spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path
) -> None:
    # kafka-eos starts at latest (its batch 0 records the resolved start), Spark's source continues from offsets/0
    bootstrap = kafka_service.bootstrap
    topic = create_topic(admin, f"pin-{uuid.uuid4().hex[:8]}", 2)
    send(bootstrap, topic, _values(0, 6, 2))
    opts = options(bootstrap, subscribe=topic, startingOffsets="latest")
    cp, sink = str(tmp_path / "checkpoint"), {}
    first = stream(spark, EOS, opts, cp, sink=sink)
    assert first.error is None and sink == {0: []} and offsets(cp) == {0: {topic: {"0": 3, "1": 3}}}
    send(bootstrap, topic, _values(6, 8, 2))
    second = stream(spark, SPARK, opts, cp, sink=sink)
    assert second.error is None and [p.batch for p in second.progress] == [1], second.error
    assert sorted(r[1] for r in sink[1]) == sorted(b"r%d" % i for i in range(6, 14))
    assert spark_initial(cp) is None  # Spark's source never resolved a start of its own


@pytest.mark.parametrize("start", ["earliest", "startingTimestamp"])
def test_sparks_uncommitted_batch_0(
    spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path, start: str
) -> None:
    """Spark's source planned batch 0 and stopped before committing it. Its start is in sources/0/0, which
    a Python data source cannot read: kafka-eos replays batch 0 to Spark's end from earliest offsets (the
    same records as Spark's replay), but a start Spark resolved from the clock is unknown to it and those
    records are lost. Documented: let Spark's source commit batch 0 first for such starts."""
    bootstrap = kafka_service.bootstrap
    topic = create_topic(admin, f"b0-{uuid.uuid4().hex[:8]}", 1)
    now = int(time.time() * 1000)
    send(bootstrap, topic, [{**r, "timestamp": now - 4000 + 1000 * i} for i, r in enumerate(_values(0, 4, 1))])
    how = {"startingOffsets": "earliest"} if start == "earliest" else {"startingTimestamp": str(now - 2000)}
    opts = options(bootstrap, subscribe=topic, **how)
    cp, sink = str(tmp_path / "checkpoint"), {}
    stopped = stream(spark, SPARK, opts, cp, sink=sink, fail_at=0)
    assert stopped.error is not None and 0 in offsets(cp) and 0 not in commits(cp), stopped.error
    first = 0 if start == "earliest" else 2
    assert spark_initial(cp) == {topic: {"0": first}} and offsets(cp)[0] == {topic: {"0": 4}}
    resumed = stream(spark, EOS, opts, cp, sink=sink)
    assert resumed.error is None, resumed.error
    assert resumed.progress[0].batch == 0 and resumed.progress[0].end == {topic: {"0": 4}}
    lost = start != "earliest"  # earliest partitions are read from their earliest offset; a resolved time is gone
    assert [r[4] for r in sink[0]] == ([] if lost else list(range(first, 4))), (start, sink[0])
