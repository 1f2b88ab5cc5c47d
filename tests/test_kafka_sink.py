"""The kafka-eos sink without a broker: options, names, markers and the rules writers meet them with (K1),
the rows' digest (K2), the columns Spark's Kafka sink takes, and the screen for what a broker refuses (K3)."""

from __future__ import annotations

import dataclasses
import pickle
import time
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType

from eos_core.errors import ConfigError, FatalError
from sinks.kafka.markers import Marker, publish_name, sink_names, slot_name
from sinks.kafka.options import parse_options
from sinks.kafka.plan import BATCH_JOB, KafkaSinkMessage, KafkaSinkPlan, LineageMismatch, meet_marker
from sinks.kafka.records import RowBatch, RowDigest, TopicLimits, check_schema, record_size
from sinks.kafka.screen import Screen, dead_letter
from sources.kafka.datasource import write_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "sink.id": "orders", "topic": "out"}


def opts(streaming: bool = True, **extra: str) -> Any:
    raw = {**BASE, **({"checkpointLocation": "/tmp/ck"} if streaming else {"batch.id": "1"}), **extra}
    return parse_options(raw, streaming=streaming)


# ---- options --------------------------------------------------------------------------------------


def test_defaults_and_what_spark_users_bring(caplog: pytest.LogCaptureFixture) -> None:
    # one options map for a read and a write: the format drops the source's options from the write, each with a
    # log line, and keeps the sink's own (topic, faults) and kafka.*; the query name Spark hands a sink is ignored
    shared = {
        "subscribe": "in",
        "StartingOffsets": "earliest",
        "kafka.acks": "all",
        "kafka.linger.ms": "5",
        "topic": "out",
        "faults": "",
        "maxOffsetsPerTrigger": "9",
    }
    with caplog.at_level("INFO", logger="sources.kafka.datasource"):
        kept = write_options(shared)
    assert kept == {"kafka.acks": "all", "kafka.linger.ms": "5", "topic": "out", "faults": ""}
    dropped = sorted(r.getMessage().split("'")[1] for r in caplog.records if "ignoring option" in r.getMessage())
    assert dropped == ["StartingOffsets", "maxOffsetsPerTrigger", "subscribe"], caplog.text
    o = opts(**kept, queryName="q")
    assert o.visibility == "batch" and o.staged and o.markers_on == "out" and o.staging_topic == "spark-eos-staging"
    conf = o.producer_config()
    assert conf["partitioner"] == "murmur2_random" and conf["linger.ms"] == "5"
    assert o.transaction_timeout_ms == 60_000


@pytest.mark.parametrize(
    ("raw", "option", "said"),
    [
        ({"sink.id": ""}, "sink.id", "printable name"),
        ({"visibility": "task"}, "visibility", "one of batch, partition"),
        ({"topic": "bad topic"}, "topic", "not a Kafka topic name"),
        ({"errors.tolerance": "all"}, "errors.topic", "needs option 'errors.topic'"),
        ({"errors.topic": "dlq"}, "errors.tolerance", "errors.tolerance is none"),
        ({"staging.topic": "out"}, "staging.topic", "a topic of their own"),
        ({"kafka.transactional.id": "x"}, "kafka.transactional.id", "derives its transactional ids"),
        ({"kafka.bootstrap.servers": ""}, "kafka.bootstrap.servers", "is required"),
        ({"batch.id": "3"}, "batch.id", "batch writes only"),
        ({"topic": None}, "marker.topic", "needs option 'marker.topic'"),
        ({"sinkid": "x"}, "sinkid", "sink.id"),
    ],
)
def test_bad_options_are_refused_naming_them(raw: dict[str, Any], option: str, said: str) -> None:
    merged = {**BASE, "checkpointLocation": "/tmp/ck", **raw}
    merged = {k: v for k, v in merged.items() if v is not None}
    with pytest.raises(ConfigError, match=said) as err:
        parse_options(merged, streaming=True)
    assert getattr(err.value, "option", None) == option


def test_streaming_needs_the_checkpoint_and_batch_writes_a_batch_id() -> None:
    with pytest.raises(ConfigError, match="checkpointLocation"):
        parse_options(BASE, streaming=True)
    with pytest.raises(ConfigError, match=r"batch\.id"):
        parse_options(BASE, streaming=False)


def test_secrets_stay_out_of_the_options_repr() -> None:
    o = opts(**{"kafka.sasl.password": "hunter2", "kafka.sasl.username": "u"})
    assert "hunter2" not in repr(o) and "***" in repr(o)
    # the registry's basic auth too (a secret option of its own, not under kafka.*)
    o = opts(
        **{
            "value.format": "avro",
            "schema.registry.url": "http://r",
            "schema.registry.basic.auth.user.info": "me:hunter2",
        }
    )
    assert "hunter2" not in repr(o) and "schema_registry_user_info='***'" in repr(o) and "hunter2" not in str(o)


# ---- names and markers (K1) -------------------------------------------------------------------------


def test_no_sink_id_names_a_part_of_anothers() -> None:
    ids = ["a", "a:task:1", "a:publish", "a%3Atask", "a:", "ä", "a b"]
    names = {i: {slot_name(i, 1), slot_name(i, 12), publish_name(i)} for i in ids}
    for one in ids:
        for other in ids:
            if one != other:
                assert not names[one] & names[other], (one, other)
                assert not any(n.startswith(sink_names(other)) for n in names[one]), (one, other)


def test_a_marker_round_trips_and_a_foreign_offset_is_refused() -> None:
    m = Marker(batch=7, lineage="ab" * 16, query="q-1", rows=10, digest="d" * 32, mode="partition")
    assert Marker.parse(8, m.metadata(), group="g") == m
    with pytest.raises(FatalError, match="not a marker of the sink"):
        Marker.parse(8, "someone else's commit", group="g")
    with pytest.raises(FatalError, match="not a marker"):
        Marker.parse(9, m.metadata(), group="g")  # the offset must be batch + 1


def plan(lineage: str | None = "L1", query: str = "q-1", **extra: str) -> KafkaSinkPlan:
    return KafkaSinkPlan(opts(**extra), ("value",), lineage, "batch n planned as ...", query, "n0nce")


def marker(batch: int, lineage: str | None = "L1", query: str | None = "q-1") -> Marker:
    return Marker(batch=batch, lineage=lineage, query=query, rows=1, digest="d", mode="partition")


def test_a_marker_of_this_lineage_says_written_or_not_yet() -> None:
    p = plan()
    assert meet_marker(p, None, 0, "slot 0") is False
    assert meet_marker(p, marker(4), 5, "slot 0") is False
    assert meet_marker(p, marker(5), 5, "slot 0") is True


@pytest.mark.parametrize(
    ("found", "said"),
    [
        (marker(5, lineage="L0"), "planned batch 5 differently"),  # an older savepoint replanned batch 5
        (marker(6), "later than batch 5"),  # an older savepoint restored after the sink went on
        (marker(2, query="q-0"), "this is query q-1"),  # a fresh checkpoint, or two queries, on one sink id
    ],
)
def test_k1_a_marker_of_another_lineage_is_refused_never_skipped(found: Marker, said: str) -> None:
    with pytest.raises(LineageMismatch, match=said) as err:
        meet_marker(plan(), found, 5, "slot 0")
    assert "kafka-sink reset" in str(err.value) and "Nothing was written" in str(err.value)


def test_batch_jobs_rerun_a_batch_id_as_a_no_op_and_refuse_a_lower_one() -> None:
    p = plan(lineage=None, query=BATCH_JOB)
    mine = marker(20240601, lineage=None, query=BATCH_JOB)
    assert meet_marker(p, mine, 20240601, "the publish") is True
    assert meet_marker(p, mine, 20240602, "the publish") is False
    with pytest.raises(LineageMismatch, match="later than batch 20240531"):
        meet_marker(p, mine, 20240531, "the publish")


def test_plans_and_messages_cross_processes() -> None:
    p = plan()
    assert pickle.loads(pickle.dumps(p)) == p
    msg = KafkaSinkMessage(slot=1, batch=2, attempt=0, rows=3, digest="d", tag="t", staged=((0, 5, 7, 3),))
    assert pickle.loads(pickle.dumps(msg)) == msg
    err = pickle.loads(pickle.dumps(LineageMismatch("x", batch_id=3)))
    assert isinstance(err, LineageMismatch) and err.batch_id == 3  # type: ignore[attr-defined]


# ---- columns, rows, digest (K2) ----------------------------------------------------------------------

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def schema(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(n, t) for n, t in fields])


def test_columns_as_sparks_kafka_sink_takes_them() -> None:
    full = schema(
        ("key", StringType()),
        ("value", BinaryType()),
        ("topic", StringType()),
        ("partition", IntegerType()),
        ("headers", HEADERS),
        ("extra", LongType()),
    )
    assert check_schema(full, topic_option=None, context="c") == ("topic", "key", "value", "headers", "partition")
    assert "topic" not in check_schema(full, topic_option="out", context="c")  # the option overrides the column


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ((("key", StringType()),), "no 'value' column"),
        ((("value", LongType()),), "must be string or binary"),
        ((("Value", StringType()),), "must be named 'value'"),
        ((("value", StringType()), ("partition", LongType())), "must be int"),
        ((("value", StringType()), ("headers", ArrayType(StringType()))), "array<struct<key:string,value:binary>>"),
    ],
)
def test_columns_spark_would_refuse_are_refused_with_the_fix(fields: Any, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        check_schema(schema(*fields), topic_option="out", context="c")
    with pytest.raises(ConfigError, match="set option 'topic'"):
        check_schema(schema(("value", StringType())), topic_option=None, context="c")


def arrow(n: int, start: int = 0, *, nulls: bool = False) -> pa.RecordBatch:
    keys = [None if nulls and i % 3 == 0 else f"k{i}" for i in range(start, start + n)]
    values = [None if nulls and i % 5 == 0 else f"value-{i}".encode() * (i % 4) for i in range(start, start + n)]
    headers = [[{"key": "h", "value": str(i).encode()}] if i % 2 else None for i in range(start, start + n)]
    htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.string()),
            pa.array(values, pa.binary()),
            pa.array(headers, htype),
            pa.array([i % 3 for i in range(start, start + n)], pa.int32()),
        ],
        names=["key", "value", "headers", "partition"],
    )


COLS = ("key", "value", "headers", "partition")


def digest_of(batches: list[pa.RecordBatch]) -> str:
    d = RowDigest()
    for b in batches:
        d.add(RowBatch(b, COLS, "out"))
    return d.hexdigest()


@pytest.mark.parametrize("nulls", [False, True])
def test_k2_the_digest_depends_on_neither_the_batches_cuts_nor_the_rows_order(nulls: bool) -> None:
    whole = arrow(100, nulls=nulls)
    cuts = [whole.slice(0, 7), whole.slice(7, 50), whole.slice(57, 43)]
    assert digest_of([whole]) == digest_of(cuts) == digest_of([arrow(30, nulls=nulls), arrow(70, 30, nulls=nulls)])
    # a shuffle's partition fetched in another order (Spark randomises the blocks' fetch order)
    table = pa.Table.from_batches([whole])
    shuffled = table.take(list(reversed(range(100)))).to_batches(max_chunksize=33)
    assert digest_of(shuffled) == digest_of([whole])
    # ... and changes with any row: one row fewer, one row twice, a field of two rows swapped, a value,
    # a key turned null, a value turned empty from null
    assert digest_of([whole]) != digest_of([arrow(99, nulls=nulls)])
    assert digest_of([whole]) != digest_of([whole, whole.slice(5, 1)])
    assert digest_of([whole, whole]) != digest_of([whole])
    keys = table.column("key").to_pylist()
    keys[1], keys[2] = keys[2], keys[1]  # rows 1 and 2 swap keys: the same keys, values and order otherwise
    swapped = table.set_column(0, "key", pa.chunked_array([pa.array(keys, pa.string())]))
    assert digest_of(swapped.to_batches()) != digest_of([whole])
    assert digest_of([whole]).startswith("m1:")
    for column, value in (
        ("value", pa.array([b"X"] + [None] * 99).fill_null(b"")),
        ("key", pa.array([None] * 100, pa.string())),
    ):
        changed = table.set_column(
            table.schema.get_field_index(column),
            column,
            pa.chunked_array([value.cast(table.schema.field(column).type)]),
        )
        assert digest_of(changed.to_batches()) != digest_of([whole]), column


def test_rows_come_out_as_the_producer_sends_them() -> None:
    rows = RowBatch(arrow(4), COLS, "out")
    rec = rows.record(1)
    assert (rec.topic, rec.key, rec.value, rec.headers, rec.partition) == ("out", b"k1", b"value-1", [("h", b"1")], 1)
    # key + value + header "h" (varint 1, 1 byte, varint 1, 1 byte) + librdkafka's 36 bytes of record overhead
    assert list(rows.producer_sizes()) == [
        len(f"k{i}") + len(f"value-{i}") * (i % 4) + (4 if i % 2 else 0) + 36 for i in range(4)
    ]


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize(
    "headers", [None, [("h", b"v" * 10)], [("h", b"v" * 10), ("hh", b"v" * 100), ("x", None), ("\u00e9", b"")]]
)
def test_k3_the_screens_size_is_the_size_librdkafka_refuses_a_record_at(headers: Any, staged: bool) -> None:
    """A row exactly at the producer's message.max.bytes by the screen's count is produced, one byte more
    is refused by librdkafka itself (no broker needed: it checks in produce()); staged rows with their
    staging header."""
    from confluent_kafka import KafkaException, Producer

    from sinks.kafka.records import STAGE_HEADER, stage_route

    limit, tag = 2000, "a1b2c3d4e5f6:3:0"
    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": str(limit), "log_level": 0})
    htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    wire = [{"key": k, "value": v} for k, v in headers] if headers else None

    def row(n: int) -> RowBatch:
        b = pa.RecordBatch.from_arrays(
            [pa.array(["out"]), pa.array([b"key"]), pa.array([b"v" * n]), pa.array([wire], htype)],
            names=["topic", "key", "value", "headers"],
        )
        return RowBatch(b, ("topic", "key", "value", "headers"), None)

    extra = [(STAGE_HEADER, stage_route(tag, "out", None))] if staged else []
    base = int(row(0).producer_sizes(tag if staged else None)[0])
    at_limit = row(limit - base)
    assert int(at_limit.producer_sizes(tag if staged else None)[0]) == limit
    rec = at_limit.record(0)
    producer.produce("out", rec.value, rec.key, headers=[*(rec.headers or []), *extra])  # accepted
    rec = row(limit - base + 1).record(0)
    with pytest.raises(KafkaException, match="MSG_SIZE_TOO_LARGE"):
        producer.produce("out", rec.value, rec.key, headers=[*(rec.headers or []), *extra])
    assert screen_at(limit).refused(row(limit - base + 1), stage_tag=tag if staged else None)
    assert not screen_at(limit).refused(at_limit, stage_tag=tag if staged else None)
    producer.purge()


# ---- the screen (K3) ----------------------------------------------------------------------------------


class FakeLookups:
    def __init__(self, limits: dict[str, TopicLimits | None]) -> None:
        self._limits = limits

    def limits(self, topics: list[str]) -> dict[str, TopicLimits | None]:
        return {t: self._limits.get(t) for t in topics}


def screen(**limits: TopicLimits | None) -> Screen:
    return Screen(FakeLookups(limits), 1000, "kafka-eos sink 'x'")  # type: ignore[arg-type]


def screen_at(message_max_bytes: int) -> Screen:
    big = TopicLimits(partitions=1, max_message_bytes=10 * message_max_bytes, compacted=False)
    return Screen(FakeLookups({"out": big}), message_max_bytes, "kafka-eos sink 'x'")  # type: ignore[arg-type]


def batch_of(rows: list[tuple[Any, ...]]) -> RowBatch:
    topic, key, value, partition = zip(*rows, strict=True)
    b = pa.RecordBatch.from_arrays(
        [
            pa.array(topic, pa.string()),
            pa.array(key, pa.binary()),
            pa.array(value, pa.binary()),
            pa.array(partition, pa.int32()),
        ],
        names=["topic", "key", "value", "partition"],
    )
    return RowBatch(b, ("topic", "key", "value", "partition"), None)


def test_k3_what_a_broker_refuses_is_found_row_by_row() -> None:
    plain = TopicLimits(partitions=2, max_message_bytes=500, compacted=False)
    compacted = TopicLimits(partitions=1, max_message_bytes=10_000, compacted=True)
    rows = batch_of(
        [
            ("out", b"k", b"ok", None),
            ("out", b"k", b"v" * 480, None),  # payload 481 fits, a one-record batch of it does not (61 + framing)
            ("big", b"k", b"v" * 1200, None),  # over the producer's message.max.bytes (1000)
            ("big", None, b"v", None),  # no key on a compacted topic
            ("out", b"k", b"v", 2),  # partition 2 of a 2-partition topic
            ("gone", b"k", b"v", None),  # no such topic
            (None, b"k", b"v", None),  # no topic at all
            ("out", b"k", b"v", 1),
        ]
    )
    found = screen(out=plain, big=compacted).refused(rows)
    assert sorted(found) == [1, 2, 3, 4, 5, 6]
    assert "max.message.bytes 500" in found[1] and "message.max.bytes 1000" in found[2]
    assert "compacted" in found[3] and "partition 2 does not exist" in found[4]
    assert "'gone' does not exist" in found[5] and "null" in found[6]
    assert record_size(rows.record(1))[1] > 500 >= record_size(rows.record(0))[1]


def test_k3_a_clean_batch_is_screened_without_looking_at_each_row() -> None:
    plain = TopicLimits(partitions=2, max_message_bytes=1_000_000, compacted=False)
    rows = batch_of([("out", b"k", b"v" * 10, None)] * 1000)
    s = screen(out=plain)
    assert s._suspects(rows, {"out": plain}, rows.producer_sizes()) == []
    assert s.refused(rows) == {}


def test_a_dead_letter_keeps_the_row_where_it_fits_and_says_why() -> None:
    rows = batch_of([("out", b"key", b"v" * 600, None)])
    rec = rows.record(0)
    kept = dead_letter(rec, "too big", "dlq", 10_000)
    assert kept.topic == "dlq" and kept.value == rec.value and ("eos.error.reason", b"too big") in (kept.headers or [])
    cut = dead_letter(rec, "too big", "dlq", 300)
    assert cut.value is None and ("eos.error.truncated", b"true") in (cut.headers or [])
    assert ("eos.error.size", b"600") in (cut.headers or []) and record_size(cut)[1] <= 300
    assert dataclasses.replace(cut, headers=None).key == b"key"


def test_a_task_slots_producer_stays_warm_in_its_worker_but_never_for_a_retried_attempt() -> None:
    from sinks.kafka import client

    conf = {"bootstrap.servers": "127.0.0.1:9", "transactional.id": "spark-eos:s:task:0", "log_level": "0"}
    first, warm = client.slot_producer(conf, "spark-eos:s:task:0", timeout=1, context="t")
    assert not warm  # a new producer: the caller initialises it (fencing older ones)
    again, warm = client.slot_producer(conf, "spark-eos:s:task:0", timeout=1, context="t")
    assert warm and again is first  # the slot's next task in this worker: no init
    retried, warm = client.slot_producer(conf, "spark-eos:s:task:0", timeout=1, context="t", fresh=True)
    assert not warm and retried is not first  # a retried attempt initialises, whatever this worker holds
    after, warm = client.slot_producer(conf, "spark-eos:s:task:0", timeout=1, context="t")
    assert warm and after is retried
    client.forget(after)  # failed or fenced: gone from the cache
    assert not client.slot_producer(conf, "spark-eos:s:task:0", timeout=1, context="t")[1]
    client._WARM.clear()


def test_a_transactional_step_ends_within_kafka_producer_timeout_ms_even_when_each_try_nearly_exhausts_it() -> None:
    """Each try of a blocking step gets what is left of kafkaProducer.timeoutMs, not the whole of it again: a
    coordinator that answers each try retriably just before its time is up (a broker back from a crash, its
    transactions still loading) cannot stretch the step to twice the bound (CI once: a task's steps after F27's
    broker restart outlasted the run's 400 s)."""
    from confluent_kafka import KafkaError, KafkaException

    from sinks.kafka import client
    from sinks.kafka.client import TxnProducer

    given: list[float] = []

    class Coordinator:  # stands in for librdkafka: every try waits 90 % of its time, then says "retriable"
        def poll(self, timeout: float) -> int:
            return 0

        def init_transactions(self, timeout: float) -> None:
            given.append(timeout)
            time.sleep(timeout * 0.9)
            raise KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=True))

    producer = TxnProducer(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": "0"}, "spark-eos:s:task:0", timeout=1.0, context="t"
    )
    producer.producer = Coordinator()  # type: ignore[assignment]
    with pytest.raises(client.RetriableError) as err:
        producer.init()
    assert "within 1 s (kafkaProducer.timeoutMs)" in str(err.value)
    assert len(given) >= 2 and given[0] > 0.95 and sum(given) <= 1.25, given  # never the whole second again


def test_a_send_offsets_call_that_ignores_its_timeout_is_given_up_and_its_producer_takes_no_other_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka's send_offsets_to_transaction can block for good when the group coordinator's broker goes away
    (confluentinc/librdkafka#5456; CI: a task waited 380 s after F27's broker restart with a 30 s bound): the step
    fails retriably a few seconds past kafkaProducer.timeoutMs, and the given-up producer is not asked to abort
    (librdkafka would refuse, or block too)."""
    import threading

    from sinks.kafka import client
    from sinks.kafka.client import TxnProducer

    monkeypatch.setattr(client, "_GRACE", 0.5)
    release = threading.Event()
    calls: list[str] = []

    class Stuck:  # stands in for librdkafka: the call never returns until the test ends
        def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
            calls.append(f"send_offsets {timeout:.1f}")
            release.wait(60)

        def abort_transaction(self, timeout: float) -> None:
            calls.append("abort")

        def flush(self, timeout: float) -> int:
            return 0

    producer = TxnProducer(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": "0"}, "spark-eos:s:task:0", timeout=1.0, context="t"
    )
    producer._group_metadata["g"] = object()
    producer.producer = Stuck()  # type: ignore[assignment]
    started = time.monotonic()
    try:
        with pytest.raises(client.RetriableError) as err:
            producer.add_markers([([], "g")])
        took = time.monotonic() - started
        assert 1.4 <= took < 3.0, took  # the 1 s bound and the 0.5 s grace, not the call's own (endless) wait
        assert "send_offsets_to_transaction did not return within 1 s (kafkaProducer.timeoutMs)" in str(err.value)
        assert producer.stuck == "send_offsets_to_transaction"
        producer.abort_quietly()
        assert calls == ["send_offsets 1.0"], calls  # no abort on a producer with a call in progress
    finally:
        release.set()


def test_a_bounded_call_hands_back_its_result_and_its_kafka_error() -> None:
    """The thread of a bounded call returns what the call returned and raises what it raised (the retry loop
    sorts librdkafka's errors by kind), and a call that returns leaves the producer usable."""
    from confluent_kafka import KafkaError, KafkaException

    from sinks.kafka.client import TxnProducer

    producer = TxnProducer(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": "0"}, "spark-eos:s:task:0", timeout=1.0, context="t"
    )
    assert producer._bounded("x", lambda: 42, 1.0) == 42
    error = KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=True))

    def fails() -> None:
        raise error

    with pytest.raises(KafkaException) as raised:
        producer._bounded("x", fails, 1.0)
    assert raised.value is error and producer.stuck is None


class _FakeTxn:
    """Stands in for the publish's transactional producer: records what the publish did."""

    calls: list[str] = []

    def __init__(self, *args: Any, **kw: Any) -> None:
        pass

    def init(self) -> None:
        self.calls.append("init")

    def begin(self) -> None:
        self.calls.append("begin")

    def commit(self, markers: Any) -> None:
        self.calls.append("commit")

    def abort_quietly(self) -> None:
        self.calls.append("abort")

    def close(self) -> None:
        pass


class _FakeLookupsAdmin:
    def __init__(self, *args: Any, **kw: Any) -> None:
        self.admin = object()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("replayed_slots", [(0, 1), (0, 1, 2)])
def test_k2_a_replay_without_a_slot_that_wrote_the_batch_is_refused_before_the_publish(
    monkeypatch: pytest.MonkeyPatch, replayed_slots: tuple[int, ...]
) -> None:
    """visibility=partition: slots 2 and 3 of a 4-task attempt committed batch 7, then the batch failed. A
    replay with fewer tasks (2, or 3) must not publish the slots it has: their rows would join rows the
    vanished slot 3 (and 2) made visible already. The driver refuses before its transaction begins."""
    from sinks.kafka import committer

    written = {2: marker(7), 3: marker(7), 0: marker(6), 1: marker(6)}
    monkeypatch.setattr(committer, "TxnProducer", _FakeTxn)
    monkeypatch.setattr(committer, "KafkaLookups", _FakeLookupsAdmin)
    monkeypatch.setattr(committer, "read_slot_markers", lambda admin, conf, sink_id, topic, timeout: written)
    monkeypatch.setattr(committer, "read_marker", lambda *a, **k: marker(6))
    _FakeTxn.calls = []
    p = dataclasses.replace(plan(visibility="partition"), batch=7)
    messages = [
        KafkaSinkMessage(slot=s, batch=7, attempt=0, rows=1, digest="d", skipped=s in written and s >= 2)
        if s >= 2
        else KafkaSinkMessage(slot=s, batch=7, attempt=0, rows=1, digest="d", tag=f"t{s}", staged=((0, 0, 0, 1),))
        for s in replayed_slots
    ]
    with pytest.raises(FatalError, match=r"slots \[2, 3\] committed their rows.*slots \[3\]|slots \[2, 3\] are not"):
        committer.commit_batch(p, messages, 7)
    assert "begin" not in _FakeTxn.calls and "commit" not in _FakeTxn.calls  # nothing published


def test_k2_a_replay_with_every_slot_that_wrote_the_batch_publishes_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    from sinks.kafka import committer

    written = {2: marker(7), 3: marker(7), 0: marker(6), 1: marker(6)}
    monkeypatch.setattr(committer, "TxnProducer", _FakeTxn)
    monkeypatch.setattr(committer, "KafkaLookups", _FakeLookupsAdmin)
    monkeypatch.setattr(committer, "read_slot_markers", lambda admin, conf, sink_id, topic, timeout: written)
    monkeypatch.setattr(committer, "read_marker", lambda *a, **k: marker(6))
    monkeypatch.setattr(committer._Publish, "_copy", lambda self, producer, staged: len(staged))
    _FakeTxn.calls = []
    p = dataclasses.replace(plan(visibility="partition"), batch=7)
    messages = [
        KafkaSinkMessage(slot=0, batch=7, attempt=0, rows=1, digest="d", tag="t0", staged=((0, 0, 0, 1),)),
        KafkaSinkMessage(slot=1, batch=7, attempt=0, rows=1, digest="d", tag="t1", staged=((0, 1, 1, 1),)),
        KafkaSinkMessage(slot=2, batch=7, attempt=0, rows=1, digest="d", skipped=True),
        KafkaSinkMessage(slot=3, batch=7, attempt=0, rows=1, digest="d", skipped=True),
    ]
    committer.commit_batch(p, messages, 7)
    assert _FakeTxn.calls == ["init", "begin", "commit"]
    with pytest.raises(FatalError, match="writer it built for batch 7"):  # a commit for another batch's plan
        committer.commit_batch(p, messages, 8)


def test_k1_the_survey_fails_when_a_broker_did_not_list_its_groups() -> None:
    """A broker that does not answer ListGroups hides the groups it coordinates: a written slot unseen would
    let the others write the batch directly. The listing's errors fail the survey (retriable)."""
    from types import SimpleNamespace

    from eos_core.errors import RetriableError
    from sinks.kafka.markers import read_slot_markers

    listed = SimpleNamespace(valid=[], errors=[RuntimeError("broker 2: COORDINATOR_NOT_AVAILABLE")])
    admin = SimpleNamespace(list_consumer_groups=lambda request_timeout: SimpleNamespace(result=lambda t: listed))
    with pytest.raises(RetriableError, match="no answer from every broker: broker 2"):
        read_slot_markers(admin, {}, "orders", "out", timeout=1)  # type: ignore[arg-type]


def test_the_sink_alone_refuses_a_source_option_the_format_did_not_drop() -> None:
    # the sink knows only its own options: a read's option reaching it is a mistake, named with what to do
    with pytest.raises(ConfigError) as e:
        opts(subscribe="in")
    assert e.value.option == "subscribe" and "subscribe" in str(e.value)


def test_kafka_batch_drops_a_reads_options_as_the_format_does() -> None:
    from sinks.kafka.spark import kafka_batch
    from sources.kafka.datasource import KafkaEosDataSource

    write = kafka_batch(
        KafkaEosDataSource, **BASE, checkpointLocation="/tmp/ck", subscribe="in", startingOffsets="earliest"
    )
    assert write.__name__ == "kafka_batch[orders]"


def test_the_formats_writer_takes_a_shared_options_map(monkeypatch: pytest.MonkeyPatch) -> None:
    # write of format("kafka-eos") with the read's options in the same map: built, not refused (writeStream goes
    # through the same write_options; its plan needs a checkpoint Spark wrote, which the integration tests have)
    import sinks.kafka.spark as spark_sink
    from sources.kafka.datasource import KafkaEosDataSource

    monkeypatch.setattr(spark_sink, "check_services", lambda opts: ())  # no broker here
    shared = {**BASE, "subscribe": "in", "startingOffsets": "earliest", "batch.id": "3"}
    writer = KafkaEosDataSource(shared).writer(StructType([StructField("value", StringType())]), False)
    assert writer.plan.opts.topic == "out" and writer.plan.opts.batch_id == 3


# ---- issue 45: internal topics, the staging header, non-deterministic replays ------------------------------


def test_k3_a_row_bound_for_an_internal_topic_is_refused_row_by_row() -> None:
    plain = TopicLimits(partitions=1, max_message_bytes=1_000_000, compacted=False)
    internal = TopicLimits(partitions=50, max_message_bytes=1_000_000, compacted=True, internal=True)
    rows = batch_of([("out", b"k", b"v", None), ("__consumer_offsets", b"k", b"v", None)])
    found = screen(out=plain, __consumer_offsets=internal).refused(rows)
    assert list(found) == [1] and "is internal to Kafka" in found[1]


def test_kafkas_internal_topics_are_known_by_name_without_a_look_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A principal that may not describe __transaction_state still gets its row diverted, not a FatalError: the
    internal topics' names are known, so limits() asks the cluster nothing of them."""
    from sinks.kafka import client

    lookups = client.KafkaLookups({"bootstrap.servers": "127.0.0.1:1"}, timeout=1, context="t")

    def no_admin(self: object) -> None:
        raise AssertionError("an internal topic was looked up")

    monkeypatch.setattr(client.KafkaLookups, "admin", property(no_admin))
    found = lookups.limits(["__transaction_state", "__consumer_offsets", "__share_group_state"])
    assert all(lim is not None and lim.internal for lim in found.values()), found
    with pytest.raises(ConfigError, match="internal to Kafka") as e:
        lookups.require("__transaction_state", "errors.topic")
    assert e.value.option == "errors.topic"
    with pytest.raises(ConfigError, match="internal to Kafka") as e:
        lookups.ensure_topic("__consumer_offsets", 1, {}, "staging.topic")
    assert e.value.option == "staging.topic"
    with pytest.raises(AssertionError, match="looked up"):  # any other name is asked of the cluster
        lookups.limits(["__my_topic"])


def test_only_the_sinks_own_staging_header_is_taken_off_a_staged_record() -> None:
    from sinks.kafka.records import STAGE_HEADER, split_stage_header

    mine = [(STAGE_HEADER, b"the user's"), ("a", b"1")]
    assert split_stage_header([*mine, (STAGE_HEADER, b"route")]) == (b"route", mine)
    assert split_stage_header(mine) == (None, mine)  # not appended last: not the sink's
    assert split_stage_header([]) == (None, [])


def test_k2_the_refusal_of_a_changed_replay_names_non_deterministic_queries_and_the_way_out() -> None:
    """Issue 45, item 7: a non-deterministic query's partly written batch is refused on every replay; the
    refusal says so, and that only a reset (duplicates) finishes it and visibility=batch avoids it."""
    from eos_core.spark_task import TaskIdentity
    from sinks.kafka.writer import _TaskRun

    p = dataclasses.replace(plan(visibility="partition"), batch=7)
    run = _TaskRun(p, TaskIdentity(partition=2, stream_batch=7), 7, object(), {})  # type: ignore[arg-type]
    rows = pa.RecordBatch.from_pylist([{"value": b"x"}], schema=pa.schema([("value", pa.binary())]))
    with pytest.raises(FatalError) as e:
        run._replayed(iter([rows]), marker(7))
    said = str(e.value)
    for words in ("not deterministic", "rand()", "stream-static join", "kafka-sink reset --sink-id 'orders'"):
        assert words in said, words
    assert "visibility=batch" in said and "written again" in said


def test_a_staging_topic_made_by_a_sink_without_a_topic_takes_a_default_topics_records() -> None:
    """The staging topic is shared by the cluster's sinks: made by a sink without a ``topic`` option (its records
    name their topics) at 1,004,096 bytes, it refused the next sink, whose target had Kafka's default 1,048,588
    (seen when the suite ran in another order)."""
    from sinks.kafka.privileges import staging_size
    from sinks.kafka.records import TopicLimits
    from sinks.kafka.spark import KAFKA_DEFAULT_MAX_MESSAGE_BYTES, ensure_staging

    class Lookups:
        def __init__(self) -> None:
            self.made: dict[str, dict[str, str]] = {}

        def require(self, topic: str, option: str) -> TopicLimits:
            return TopicLimits(2, KAFKA_DEFAULT_MAX_MESSAGE_BYTES, False)

        def ensure_topic(self, topic: str, partitions: int, config: dict[str, str], option: str) -> TopicLimits:
            made = self.made.setdefault(topic, config)
            return TopicLimits(partitions, int(made["max.message.bytes"]), False)

    lookups = Lookups()
    no_topic = parse_options(
        {**{k: v for k, v in BASE.items() if k != "topic"}, "checkpointLocation": "/tmp/ck", "marker.topic": "out"},
        streaming=True,
    )
    ensure_staging(lookups, no_topic, {"bootstrap.servers": "b:9"})  # type: ignore[arg-type]  # makes it
    made = int(lookups.made[no_topic.staging_topic]["max.message.bytes"])
    assert made >= staging_size(KAFKA_DEFAULT_MAX_MESSAGE_BYTES), made
    ensure_staging(lookups, opts(), {"bootstrap.servers": "b:9"})  # type: ignore[arg-type]  # used to refuse
