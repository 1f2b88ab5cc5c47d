"""What operators do to a query writing with the kafka-eos sink, rows L-K1..L-K6 of docs/lifecycle.md: each
ends exactly once (the exact checker for topics) or in a clear refusal that changed nothing.

- L-K1 an older savepoint restored after the sink went on: refused (K1), the latest one finishes;
- L-K2 the partitioning changed between a crash and the restart: visibility=partition refuses the
  partly written batch before anything more is visible (K2) and finishes once restored as it was;
  visibility=batch writes it once as it is;
- L-K3 a second query (a fresh checkpoint) on the same sink id: refused (K1);
- L-K4 a record the broker refuses (over the topic's max.message.bytes): the batch fails with nothing
  of it visible (K3), errors.tolerance=all sends it to errors.topic once;
- L-K5 batch jobs: a batch id again is a no-op, a lower one refused; the columns Spark's sink takes;
- L-K6 foreachBatch through ``connectors.kafka_batch``, a failed batch replayed.

They run in the suite's Spark session (availableNow queries), on the suite's Kafka.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import functions as F

import connectors
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from connectors.toolkit.checker import read_topic
from connectors.toolkit.harness import wait_until
from connectors.toolkit.topic_checker import verify_topic

pytestmark = [pytest.mark.integration]


_APP: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _app(kafka_service: Any) -> None:
    """The connectors run as the suite's app principal: its kafka.* options, and every topic a test creates
    granted to it (``_create``); the toolkit's own clients set up and check as the admin."""
    _APP["kafka"] = kafka_service


def _kafka(bootstrap: str) -> dict[str, str]:
    kafka = _APP["kafka"]
    return dict(kafka.app_options) if bootstrap == kafka.bootstrap else {"kafka.bootstrap.servers": bootstrap}


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    create_topic(bootstrap, topic, partitions)
    _APP["kafka"].grant_topic(topic)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _source(bootstrap: str, n: int, *, seed: int = 0, topic: str | None = None) -> str:
    topic = topic or _name("klc-in")
    if seed == 0:
        _create(bootstrap, topic, 2)
    produce_records(bootstrap, topic, make_records(n, seed=seed, prefix=f"{topic}-{seed}-"), partitions=2)
    return topic


def _run(
    spark: Any,
    bootstrap: str,
    src: str,
    out: str,
    sink_id: str,
    checkpoint: str,
    *,
    visibility: str,
    max_offsets: int = 200,
    min_partitions: int | None = None,
    faults: str | None = None,
    options: dict[str, str] | None = None,
) -> Exception | None:
    """One availableNow run of kafka-eos -> (key, value) -> the kafka-eos sink; the exception it ended with."""
    reader = (
        spark.readStream.format("kafka-eos")
        .options(**_kafka(bootstrap))
        .option("subscribe", src)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
    )
    if min_partitions is not None:
        reader = reader.option("minPartitions", str(min_partitions))
    writer = (
        reader.load()
        .select("key", "value")
        .writeStream.format("kafka-eos")
        .options(**_kafka(bootstrap))
        .option("topic", out)
        .option("sink.id", sink_id)
        .option("visibility", visibility)
        .option("checkpointLocation", checkpoint)
        .options(**(options or {}))
        .trigger(availableNow=True)
    )
    if faults:
        writer = writer.option("faults", f"{faults};pipeline.batch:run={uuid.uuid4().hex}")  # unique once-state
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:
        return exc
    return None


def _count(bootstrap: str, topic: str) -> int:
    return len(read_topic(bootstrap, topic, parse_json=False))


def _ok(bootstrap: str, src: str, out: str, sink_id: str, checkpoint: str, records: int, **kw: Any) -> None:
    report = verify_topic(
        bootstrap=bootstrap, source_topic=src, sink_topic=out, sink_id=sink_id, checkpoint=checkpoint, **kw
    )
    assert report.ok, report.table()
    assert report.info["sink_records"] == records


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_l_k1_an_older_savepoint_is_refused_and_the_latest_finishes(
    spark: Any, kafka_service: Any, tmp_path: Path, visibility: str
) -> None:
    b = kafka_service.bootstrap
    src, out, sink = _source(b, 400), _name("klc-out"), _name("k1")
    _create(b, out, 2)
    ck, saved = str(tmp_path / "ck"), str(tmp_path / "savepoint")
    assert _run(spark, b, src, out, sink, ck, visibility=visibility) is None  # batches 0-1 of 200
    shutil.copytree(ck, saved)  # the savepoint: batch 1 committed
    _source(b, 400, seed=1, topic=src)
    assert _run(spark, b, src, out, sink, ck, visibility=visibility, max_offsets=300) is None  # batches 2 (300), 3
    written = _count(b, out)
    assert written == 800
    failed = _run(spark, b, src, out, sink, saved, visibility=visibility)  # plans batch 2 as 200 records
    assert failed is not None and "later than batch 2" in str(failed) and "Nothing was written" in str(failed), failed
    assert "LineageMismatch" in connectors.error_cause(failed)
    assert _count(b, out) == written  # the refusal changed nothing
    assert _run(spark, b, src, out, sink, ck, visibility=visibility) is None  # the latest checkpoint: nothing to do
    _ok(b, src, out, sink, ck, 800)


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_l_k2_partitioning_changed_between_a_crash_and_the_restart(
    spark: Any, kafka_service: Any, tmp_path: Path, visibility: str
) -> None:
    b = kafka_service.bootstrap
    src, out, sink = _source(b, 400), _name("klc-out"), _name("k2")
    _create(b, out, 2)
    ck = str(tmp_path / "ck")
    # batch 0: slot 1 waits, then fails in both its attempts; slot 0 commits meanwhile (partition) or stages
    crash = (
        f"sink.before_write:batch=0:partition=1:attempt=0:sink={sink}:action=sleep:seconds=4:once;"
        f"sink.after_write:batch=0:partition=1:sink={sink}:action=raise"
    )
    failed = _run(spark, b, src, out, sink, ck, visibility=visibility, faults=crash)
    assert failed is not None and "fault injected at sink.after_write" in str(failed), failed
    partly = _count(b, out)
    assert (0 < partly < 200) if visibility == "partition" else partly == 0, partly
    # restarted with 4 tasks instead of 2: slot 0 would get other rows than it wrote
    changed = _run(spark, b, src, out, sink, ck, visibility=visibility, min_partitions=4)
    if visibility == "partition":
        assert changed is not None and "partitioning or its transformations changed" in str(changed), changed
        assert _count(b, out) == partly  # the other slots staged: nothing more is visible
        assert _run(spark, b, src, out, sink, ck, visibility=visibility) is None  # restored as it was
    else:
        assert changed is None, changed  # the publish is atomic: nothing of batch 0 was visible
    _ok(b, src, out, sink, ck, 400)


def test_l_k3_a_second_query_on_the_same_sink_id_is_refused(spark: Any, kafka_service: Any, tmp_path: Path) -> None:
    b = kafka_service.bootstrap
    src, out, sink = _source(b, 100), _name("klc-out"), _name("k3")
    _create(b, out, 2)
    assert _run(spark, b, src, out, sink, str(tmp_path / "ck"), visibility="batch") is None
    other = _source(b, 100)
    failed = _run(spark, b, other, out, sink, str(tmp_path / "ck2"), visibility="batch")
    assert failed is not None and "last wrote batch" in str(failed) and "its own sink.id" in str(failed), failed
    assert _count(b, out) == 100
    _ok(b, src, out, sink, str(tmp_path / "ck"), 100)


def test_l_k4_a_record_the_broker_refuses(spark: Any, kafka_service: Any, tmp_path: Path) -> None:
    b = kafka_service.bootstrap
    src, out, dlq, sink = _name("klc-in"), _name("klc-out"), _name("klc-dlq"), _name("k4")
    admin = AdminClient(kafka_service.admin_config())
    admin.create_topics([NewTopic(out, 2, 1, config={"max.message.bytes": "2000"})])[out].result(30)
    _APP["kafka"].grant_topic(out)
    _create(b, dlq, 1)
    _create(b, src, 2)
    records = make_records(300, seed=4, prefix=f"{src}-")
    records[150] = dict(records[150], pad="x" * 5000)  # over the sink topic's max.message.bytes
    produce_records(b, src, records, partitions=2)
    ck = str(tmp_path / "ck")
    failed = _run(spark, b, src, out, sink, ck, visibility="batch", max_offsets=1000)
    assert failed is not None and "over topic" in str(failed) and "max.message.bytes 2000" in str(failed), failed
    assert "DataRefused" in connectors.error_cause(failed)
    assert _count(b, out) == 0  # nothing of the batch is visible
    fixed = {"errors.tolerance": "all", "errors.topic": dlq}
    assert _run(spark, b, src, out, sink, ck, visibility="batch", max_offsets=1000, options=fixed) is None
    _ok(b, src, out, sink, ck, 299, errors_topic=dlq)
    (letter,) = read_topic(b, dlq, parse_json=False)
    assert json.loads(letter["value"])["id"] == records[150]["id"]


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_l_k5_batch_jobs_and_the_columns_sparks_sink_takes(spark: Any, kafka_service: Any, visibility: str) -> None:
    b = kafka_service.bootstrap
    out, other, sink = _name("klc-out"), _name("klc-other"), _name("k5")
    _create(b, out, 3)
    _create(b, other, 1)
    # every tenth row names its own topic (1 partition, the partitioner chooses), the rest their partition of out
    rows = [
        (f"k{i}", json.dumps({"id": f"r{i}"}), other, None)
        if i % 10 == 0
        else (f"k{i}", json.dumps({"id": f"r{i}"}), None, i % 3)
        for i in range(60)
    ]
    df = (
        spark.createDataFrame(rows, "key string, value string, topic string, partition int")
        .withColumn("topic", F.coalesce("topic", F.lit(out)))
        .withColumn("headers", F.array(F.struct(F.lit("h").alias("key"), F.col("key").cast("binary").alias("value"))))
        .repartition(2)
    )

    def write(batch_id: int) -> None:
        (
            df.write.format("kafka-eos")
            .options(**_kafka(b))
            .option("marker.topic", out)
            .option("sink.id", sink)
            .option("visibility", visibility)
            .option("batch.id", str(batch_id))
            .mode("append")
            .save()
        )

    write(5)
    write(5)  # the same batch id again: a no-op
    with pytest.raises(Exception, match="later than batch 4"):
        write(4)
    got = read_topic(b, out, with_position=True)
    assert sorted(r["id"] for r in got) == sorted(f"r{i}" for i in range(60) if i % 10)
    assert {r["_partition"] for r in got} == {0, 1, 2}
    assert all(r["_partition"] == int(r["id"][1:]) % 3 for r in got)  # the partition column decides
    assert sorted(json.loads(r["value"])["id"] for r in read_topic(b, other, parse_json=False)) == [
        f"r{i}" for i in range(0, 60, 10)
    ]


def test_l_k6_foreach_batch_replays_a_failed_batch_once(spark: Any, kafka_service: Any, tmp_path: Path) -> None:
    b = kafka_service.bootstrap
    src, out, sink = _source(b, 300), _name("klc-out"), _name("k6")
    _create(b, out, 2)
    ck = str(tmp_path / "ck")

    def run(faults: str | None) -> Exception | None:
        opts = {**_kafka(b), "topic": out, "sink.id": sink, "checkpointLocation": ck}
        if faults:
            opts["faults"] = f"{faults};pipeline.batch:run={uuid.uuid4().hex}"
        q = (
            spark.readStream.format("kafka-eos")
            .options(**_kafka(b))
            .option("subscribe", src)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "100")
            .load()
            .select("key", "value")
            .writeStream.foreachBatch(connectors.kafka_batch(**opts))
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination()
        except Exception as exc:
            return exc
        return None

    failed = run(f"sink.after_commit:batch=2:sink={sink}:action=raise:once")  # published, commits/n not
    assert failed is not None and "fault injected at sink.after_commit" in str(failed)
    assert run(None) is None
    _ok(b, src, out, sink, ck, 300)


def test_l_k7_operator_commands_show_the_markers_and_reset_them_knowingly(
    spark: Any, kafka_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from connectors import cli

    b = kafka_service.bootstrap
    out, sink = _name("klc-out"), _name("k7")
    _create(b, out, 2)
    df = spark.createDataFrame([(f"k{i}", json.dumps({"id": i})) for i in range(20)], "key string, value string")
    for batch in (3, 4):
        (
            df.write.format("kafka-eos")
            .options(**_kafka(b))
            .option("topic", out)
            .option("sink.id", sink)
            .option("batch.id", str(batch))
            .mode("append")
            .save()
        )
    common = ["--bootstrap", b, "--sink-id", sink]
    assert cli.main(["kafka-sink", "status", *common, "--marker-topic", out]) == 0
    shown = capsys.readouterr().out
    assert "visibility=batch" in shown and "batch 4 of a batch job, 20 rows" in shown, shown
    assert cli.main(["kafka-sink", "reset", *common]) == 64  # without --yes: refused, nothing deleted
    assert "add --yes" in capsys.readouterr().err
    assert cli.main(["kafka-sink", "status", *common, "--marker-topic", out]) == 0
    capsys.readouterr()
    assert cli.main(["kafka-sink", "reset", *common, "--yes"]) == 0
    assert "deleted 1 marker groups" in capsys.readouterr().out
    assert cli.main(["kafka-sink", "status", *common, "--marker-topic", out]) == 64
    assert "no consumer group of sink" in capsys.readouterr().err
    # reset knowingly: batch 3 (written before) is written again
    (
        df.write.format("kafka-eos")
        .options(**_kafka(b))
        .option("topic", out)
        .option("sink.id", sink)
        .option("batch.id", "3")
        .mode("append")
        .save()
    )
    # Kafka writes a committed transaction's markers to its partitions after the commit returns: a read at
    # once may find one partition's rows not yet readable (49 of 60, twice). Read until all are, never more.
    counts: list[int] = []
    wait_until(lambda: counts.append(_count(b, out)) or counts[-1] >= 60, timeout=60, what="batch 3 written again")
    assert counts[-1] == 60 and max(counts) == 60, counts
