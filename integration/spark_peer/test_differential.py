"""Spark's own format("kafka") is the oracle: the same topics read by it and by format("kafka-eos"), in one
Spark session, give the same schema, the same rows (every column, headers included), and in streaming the
same batch boundaries (offsets/n) and progress (numInputRows, startOffset, endOffset, latestOffset, and the
offsets-behind metrics, which kafka-eos cannot report and which its offsets give).

Differences on purpose are asserted here and explained in docs/kafka-source.md ("Differences from Spark's
source"): a partition added under a running query is read one batch later. (kafka-eos 0.1.0 also pinned a
non-concrete start with an empty batch 0 of its own; batch 0's end now records the start it resolved, and the
batch ids are Spark's for every start.)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as CkTP
from confluent_kafka.admin import AdminClient, NewPartitions

from integration.spark_peer.peer import (
    EOS,
    SPARK,
    assert_same_stream,
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

# create times an hour ago, 1 s apart: a record older than the broker's retention (7 days) would roll its
# segment at once and be deleted at the next retention check
BASE_TS = (int(time.time()) - 3600) * 1000
N = 45  # records in the main topic, 15 per partition


def _records(n: int, partitions: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        r: dict[str, Any] = {
            "key": None if i % 7 == 0 else b"k%d" % i,
            "value": None if i % 11 == 5 else b"v%d" % i,  # tombstones
            "partition": i % partitions,
            "timestamp": BASE_TS + i * 1000,
        }
        if i % 4 == 0:
            r["headers"] = [("h", b"x%d" % i), ("h", b"dup"), ("empty", None)]
        out.append(r)
    return out


@pytest.fixture(scope="module")
def admin(kafka_service: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_service.bootstrap})


@pytest.fixture(scope="module")
def data(kafka_service: Any, admin: AdminClient) -> Iterator[dict[str, str]]:
    """Two topics under one unique prefix: ``a`` (3 partitions, 45 records with null keys, tombstones, headers
    and create times 1 s apart) and ``b`` (1 partition, 5 records)."""
    prefix = f"diff-{uuid.uuid4().hex[:8]}"
    a, b = create_topic(admin, f"{prefix}-a", 3), create_topic(admin, f"{prefix}-b", 1)
    send(kafka_service.bootstrap, a, _records(N, 3))
    send(kafka_service.bootstrap, b, [{"value": b"b%d" % i, "partition": 0} for i in range(5)])
    yield {"prefix": prefix, "a": a, "b": b}


def _batch_cases(d: dict[str, str]) -> dict[str, dict[str, str]]:
    a, ts = d["a"], BASE_TS
    return {
        "subscribe": {"subscribe": a},
        "includeHeaders": {"subscribe": a, "includeHeaders": "true"},
        "assign": {"assign": json.dumps({a: [0, 2]})},
        "subscribePattern": {"subscribePattern": f"{d['prefix']}-.*"},
        "json offsets": {
            "subscribe": a,
            "startingOffsets": json.dumps({a: {"0": 2, "1": -2, "2": 5}}),
            "endingOffsets": json.dumps({a: {"0": 8, "1": -1, "2": 7}}),
        },
        "timestamps": {"subscribe": a, "startingTimestamp": str(ts + 10_000), "endingTimestamp": str(ts + 30_000)},
        "timestamps per partition": {
            "subscribe": a,
            "startingOffsetsByTimestamp": json.dumps({a: {"0": ts + 3_000, "1": ts, "2": ts + 20_000}}),
            "endingOffsetsByTimestamp": json.dumps({a: {"0": ts + 30_000, "1": ts + 10**9, "2": ts + 40_000}}),
        },
        "timestamp past the end, strategy latest": {
            "subscribe": a,
            "startingOffsetsByTimestamp": json.dumps({a: {"0": ts, "1": ts + 10**9, "2": ts + 20_000}}),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        "minPartitions": {"subscribe": a, "minPartitions": "7"},
        "maxRecordsPerPartition": {"subscribe": a, "maxRecordsPerPartition": "4"},
    }


BATCH_CASES = list(_batch_cases({"prefix": "p", "a": "a", "b": "b"}))


@pytest.mark.parametrize("case", BATCH_CASES)
def test_batch_read_matches_sparks_source(spark: Any, kafka_service: Any, data: dict[str, str], case: str) -> None:
    opts = options(kafka_service.bootstrap, **_batch_cases(data)[case])
    theirs, ours = read(spark, SPARK, opts), read(spark, EOS, opts)
    assert ours.schema == theirs.schema
    assert theirs.rows, "the case reads nothing: it proves nothing"
    assert ours.rows == theirs.rows
    if case == "minPartitions":
        assert ours.tasks == theirs.tasks == 6  # the same split of the offset ranges into read tasks
    if case == "maxRecordsPerPartition":
        # on purpose: Spark 4.2's batch read leaves the 3 ranges whole; kafka-eos cuts them (its streams do too)
        assert (ours.tasks, theirs.tasks) == (12, 3)


def test_batch_schema_and_null_columns(spark: Any, kafka_service: Any, data: dict[str, str]) -> None:
    # null keys, tombstones, a record without headers (null) and a header without a value, as Spark gives them
    opts = options(kafka_service.bootstrap, subscribe=data["a"], includeHeaders="true")
    rows = read(spark, EOS, opts).rows
    assert rows == read(spark, SPARK, opts).rows
    by_value = {r[1]: r for r in rows}
    assert by_value[b"v4"][7] == (("h", b"x4"), ("h", b"dup"), ("empty", None))
    assert by_value[b"v1"][7] is None and by_value[b"v1"][6] == 0  # no headers; CreateTime
    assert any(r[0] is None for r in rows) and any(r[1] is None for r in rows)


# ---- streams ------------------------------------------------------------------------------------------
def _both(spark: Any, tmp_path: Path, opts: dict[str, str], *, name: str = "q") -> tuple[Any, Any, str, str]:
    cps = str(tmp_path / f"{name}-spark"), str(tmp_path / f"{name}-eos")
    return stream(spark, SPARK, opts, cps[0]), stream(spark, EOS, opts, cps[1]), cps[0], cps[1]


@pytest.mark.parametrize("min_rows", [None, "8"])
def test_stream_earliest_with_max_offsets_per_trigger(
    spark: Any, kafka_service: Any, data: dict[str, str], tmp_path: Path, min_rows: str | None
) -> None:
    extra = {} if min_rows is None else {"minOffsetsPerTrigger": min_rows, "maxTriggerDelay": "1h"}
    opts = options(
        kafka_service.bootstrap, subscribe=data["a"], startingOffsets="earliest", maxOffsetsPerTrigger="10", **extra
    )
    s, e, scp, ecp = _both(spark, tmp_path, opts)
    assert len(s.batches) == 5  # 45 records, 10 a batch, split by backlog
    assert sum(len(rows) for rows in s.batches.values()) == N  # AvailableNow reads everything, whatever min says
    assert_same_stream(scp, ecp, s, e)


def test_stream_subscribe_pattern_and_headers(
    spark: Any, kafka_service: Any, data: dict[str, str], tmp_path: Path
) -> None:
    opts = options(
        kafka_service.bootstrap,
        subscribePattern=f"{data['prefix']}-.*",
        startingOffsets="earliest",
        includeHeaders="true",
        maxOffsetsPerTrigger="20",
    )
    s, e, scp, ecp = _both(spark, tmp_path, opts)
    assert sum(len(rows) for rows in s.batches.values()) == N + 5
    assert_same_stream(scp, ecp, s, e)


def test_stream_assign_with_concrete_json_start(
    spark: Any, kafka_service: Any, data: dict[str, str], tmp_path: Path
) -> None:
    a = data["a"]
    opts = options(
        kafka_service.bootstrap,
        assign=json.dumps({a: [1, 2]}),
        startingOffsets=json.dumps({a: {"1": 3, "2": 9}}),
        maxOffsetsPerTrigger="5",
    )
    s, e, scp, ecp = _both(spark, tmp_path, opts)
    assert_same_stream(scp, ecp, s, e)  # the same batch ids
    assert spark_initial(scp) == {a: {"1": 3, "2": 9}}
    assert s.progress[0].start is None and e.progress[0].start is None  # batch 0: no startOffset in either


def test_stream_latest_start(spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path) -> None:
    topic = create_topic(admin, f"latest-{uuid.uuid4().hex[:8]}", 2)
    send(kafka_service.bootstrap, topic, [{"value": b"old%d" % i, "partition": i % 2} for i in range(10)])
    opts = options(kafka_service.bootstrap, subscribe=topic, maxOffsetsPerTrigger="4")
    cps = str(tmp_path / "spark"), str(tmp_path / "eos")
    first = {SPARK: stream(spark, SPARK, opts, cps[0]), EOS: stream(spark, EOS, opts, cps[1])}
    # Spark resolves latest when the query starts (sources/0/0) and runs batch 0 at the first trigger, empty
    # when nothing arrived in between; kafka-eos resolves it at its first trigger and records it in offsets/0
    assert spark_initial(cps[0]) == {topic: {"0": 5, "1": 5}}
    assert first[SPARK].batches == first[EOS].batches == {0: []}
    assert offsets(cps[0]) == offsets(cps[1]) == {0: {topic: {"0": 5, "1": 5}}}
    send(kafka_service.bootstrap, topic, [{"value": b"new%d" % i, "partition": i % 2} for i in range(12)])
    s = stream(spark, SPARK, opts, cps[0], sink=first[SPARK].batches)
    e = stream(spark, EOS, opts, cps[1], sink=first[EOS].batches)
    assert {r[1] for rows in s.batches.values() for r in rows} == {b"new%d" % i for i in range(12)}
    s.progress, e.progress = first[SPARK].progress + s.progress, first[EOS].progress + e.progress
    assert_same_stream(*cps, s, e)


@pytest.mark.parametrize("how", ["startingTimestamp", "startingOffsetsByTimestamp"])
def test_stream_timestamp_start(spark: Any, kafka_service: Any, data: dict[str, str], tmp_path: Path, how: str) -> None:
    a = data["a"]
    by_ts = {
        "startingTimestamp": {"startingTimestamp": str(BASE_TS + 20_000)},
        "startingOffsetsByTimestamp": {
            "startingOffsetsByTimestamp": json.dumps({a: {"0": BASE_TS, "1": BASE_TS + 10**9, "2": BASE_TS + 30_000}}),
            "startingOffsetsByTimestampStrategy": "latest",
        },
    }[how]
    opts = options(kafka_service.bootstrap, subscribe=a, maxOffsetsPerTrigger="6", **by_ts)
    s, e, scp, ecp = _both(spark, tmp_path, opts)
    assert s.batches, "nothing read"
    assert_same_stream(scp, ecp, s, e)  # resolved once, recorded in offsets/0, read by batch 0 as Spark's


# ---- transactions and compaction ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def transactional(kafka_service: Any, admin: AdminClient) -> str:
    """2 partitions: committed, aborted, committed, aborted transactions, then plain records."""
    from confluent_kafka import Producer

    topic = create_topic(admin, f"txn-{uuid.uuid4().hex[:8]}", 2)
    p = Producer({"bootstrap.servers": kafka_service.bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 5})
    p.init_transactions(30)
    for n, (count, commit) in enumerate([(6, True), (5, False), (4, True), (3, False)]):
        p.begin_transaction()
        for i in range(count):
            p.produce(topic, value=b"t%d-%d-%s" % (n, i, b"c" if commit else b"a"), partition=i % 2)
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    send(kafka_service.bootstrap, topic, [{"value": b"plain%d" % i, "partition": i % 2} for i in range(4)])
    return topic


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_isolation_levels_over_aborted_transactions(
    spark: Any, kafka_service: Any, transactional: str, tmp_path: Path, isolation: str
) -> None:
    opts = options(kafka_service.bootstrap, subscribe=transactional, **{"kafka.isolation.level": isolation})
    theirs, ours = read(spark, SPARK, opts), read(spark, EOS, opts)
    values = [r[1] for r in ours.rows]
    assert ours.rows == theirs.rows
    assert len(values) == (6 + 4 + 4 if isolation == "read_committed" else 6 + 5 + 4 + 3 + 4), values
    if isolation == "read_committed":
        # streaming: batch boundaries count offsets (markers and aborted records included), both sources alike
        s, e, scp, ecp = _both(spark, tmp_path, {**opts, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "5"})
        assert_same_stream(scp, ecp, s, e)


def _log_offsets(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "diff-truth", "enable.partition.eof": True})
    c.assign([CkTP(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    try:
        while len(eof) < partitions:
            for m in c.consume(100, 2.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                    continue
                out.append((m.partition(), m.offset()))
    finally:
        c.close()
    return out


def test_compacted_topic(spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path) -> None:
    bootstrap = kafka_service.bootstrap
    config = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
    }
    topic = create_topic(admin, f"compact-{uuid.uuid4().hex[:8]}", 2, config)
    records = [
        {"key": b"u%d" % i if i % 2 else b"dup%d" % (i % 3), "value": b"v%d" % i, "partition": i % 2} for i in range(60)
    ]
    send(bootstrap, topic, records, **{"enable.idempotence": False})
    time.sleep(0.5)  # older than segment.ms: the next records roll the segments, which the cleaner may clean
    send(bootstrap, topic, [{"key": b"tail", "value": b"tail", "partition": p} for p in (0, 1)])
    wait_until(lambda: len(_log_offsets(bootstrap, topic, 2)) < 62, "the log cleaner to compact the topic", 90)
    opts = options(bootstrap, subscribe=topic)
    theirs, ours = read(spark, SPARK, opts), read(spark, EOS, opts)
    assert ours.rows == theirs.rows and len(ours.rows) < 62
    s, e, scp, ecp = _both(spark, tmp_path, {**opts, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "8"})
    assert_same_stream(scp, ecp, s, e)


# ---- partitions added, topics deleted -----------------------------------------------------------------
def test_partitions_added_between_runs(spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path) -> None:
    bootstrap = kafka_service.bootstrap
    topic = create_topic(admin, f"grow-{uuid.uuid4().hex[:8]}", 1)
    send(bootstrap, topic, [{"value": b"a%d" % i, "partition": 0} for i in range(6)])
    opts = options(bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 0}}))
    cps = str(tmp_path / "spark"), str(tmp_path / "eos")
    s = stream(spark, SPARK, opts, cps[0])
    e = stream(spark, EOS, opts, cps[1])
    assert_same_stream(*cps, s, e)
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    wait_until(lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3, "3 partitions")
    send(bootstrap, topic, [{"value": b"b%d" % i, "partition": i % 3} for i in range(9)])
    s2 = stream(spark, SPARK, opts, cps[0], sink=s.batches)
    e2 = stream(spark, EOS, opts, cps[1], sink=e.batches)
    assert s2.error is None and e2.error is None, (s2.error, e2.error)
    got = {
        fmt: sorted(v for rows in run.batches.values() for v in (r[1] for r in rows))
        for fmt, run in ((SPARK, s2), (EOS, e2))
    }
    assert got[EOS] == got[SPARK] and len(got[SPARK]) == 15  # the same records, each once
    so, eo = offsets(cps[0]), offsets(cps[1])
    assert so[1] == {topic: {"0": 9, "1": 3, "2": 3}}  # Spark reads the new partitions in the batch that finds them
    # on purpose: kafka-eos pins the new partitions at their earliest offset in the batch that finds them
    # (reading partition 0 on), and reads them in the next one
    assert eo[1] == {topic: {"0": 9, "1": 0, "2": 0}} and eo[2] == so[1], eo


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_deleted_topic(
    spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path, fail_on_data_loss: str
) -> None:
    bootstrap = kafka_service.bootstrap
    prefix = f"del-{uuid.uuid4().hex[:8]}"
    a, b = create_topic(admin, f"{prefix}-a", 1), create_topic(admin, f"{prefix}-b", 1)
    for t in (a, b):
        send(bootstrap, t, [{"value": b"%s-%d" % (t[-1:].encode(), i), "partition": 0} for i in range(4)])
    opts = options(
        bootstrap,
        subscribePattern=f"{prefix}-.*",
        startingOffsets=json.dumps({a: {"0": 0}, b: {"0": 0}}),
        failOnDataLoss=fail_on_data_loss,
    )
    cps = str(tmp_path / "spark"), str(tmp_path / "eos")
    s, e = stream(spark, SPARK, opts, cps[0]), stream(spark, EOS, opts, cps[1])
    assert_same_stream(*cps, s, e)
    admin.delete_topics([b])[b].result(30)
    wait_until(lambda: b not in admin.list_topics(timeout=10).topics, f"{b} deleted")
    send(bootstrap, a, [{"value": b"a-late%d" % i, "partition": 0} for i in range(3)])
    s2 = stream(spark, SPARK, opts, cps[0], sink=s.batches)
    e2 = stream(spark, EOS, opts, cps[1], sink=e.batches)
    if fail_on_data_loss == "true":
        assert s2.error is not None and e2.error is not None, (s2.error, e2.error)
        assert "failOnDataLoss" in s2.error and "failOnDataLoss" in e2.error, (s2.error[-2000:], e2.error[-2000:])
        assert "have been deleted" in s2.error and "is gone (topic or partition deleted)" in e2.error
        # nothing committed by either; Spark's source wrote the planned batch 1 (without the deleted topic) before
        # it failed, kafka-eos fails while planning, before offsets/1
        assert offsets(cps[0])[1] == {a: {"0": 7}} and commits(cps[0]) == {0}
        assert sorted(offsets(cps[1])) == [0] and commits(cps[1]) == {0}
    else:
        assert_same_stream(*cps, s2, e2)
        assert offsets(cps[1])[1] == {a: {"0": 7}}


def test_deleted_subscribed_topic_on_restart(
    spark: Any, kafka_service: Any, admin: AdminClient, tmp_path: Path
) -> None:
    # subscribe (not a pattern) naming a topic deleted while the query was stopped, failOnDataLoss=false
    bootstrap = kafka_service.bootstrap
    prefix = f"dels-{uuid.uuid4().hex[:8]}"
    a, b = create_topic(admin, f"{prefix}-a", 1), create_topic(admin, f"{prefix}-b", 1)
    for t in (a, b):
        send(bootstrap, t, [{"value": b"%d" % i, "partition": 0} for i in range(3)])
    opts = options(bootstrap, subscribe=f"{a},{b}", startingOffsets="earliest", failOnDataLoss="false")
    cps = str(tmp_path / "spark"), str(tmp_path / "eos")
    s, e = stream(spark, SPARK, opts, cps[0]), stream(spark, EOS, opts, cps[1])
    assert_same_stream(*cps, s, e)
    admin.delete_topics([b])[b].result(30)
    wait_until(lambda: b not in admin.list_topics(timeout=10).topics, f"{b} deleted")
    send(bootstrap, a, [{"value": b"late%d" % i, "partition": 0} for i in range(2)])
    s2 = stream(spark, SPARK, opts, cps[0], sink=s.batches)
    e2 = stream(spark, EOS, opts, cps[1], sink=e.batches)
    # on purpose: Spark's source fails at the restart whatever failOnDataLoss says (its admin client's
    # UnknownTopicOrPartitionException); kafka-eos takes the deleted topic as data loss, and with
    # failOnDataLoss=false logs it and reads on from the other topic
    assert s2.error is not None and "UnknownTopicOrPartitionException" in s2.error, s2.error
    assert sorted(offsets(cps[0])) == [0] and commits(cps[0]) == {0}
    assert e2.error is None, e2.error
    assert offsets(cps[1])[max(offsets(cps[1]))] == {a: {"0": 5}}
    assert [r[1] for r in e2.batches[max(e2.batches)]] == [b"late0", b"late1"]
