"""Unit tests of the kafka-eos source without services: options, offsets, splits, limits, pickling, schema."""

from __future__ import annotations

import itertools
import json
import pickle
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

from eos_core import kafka_clients
from eos_core.errors import ConfigError, DataLossError
from sources.kafka import KafkaEosDataSource, kafka_schema, parse_options
from sources.kafka.offsets import EARLIEST, LATEST, TopicPartition, batch_start, dumps, from_json, to_json
from sources.kafka.options import OPTIONS, consumer_config
from sources.kafka.planner import Limits, limits_from, rate_limit
from sources.kafka.reader import _Columns, arrow_schema
from sources.kafka.readers import KafkaBatchReader, KafkaStreamReader
from sources.kafka.split import KafkaInputPartition, OffsetRange, ReadSettings, split_ranges

BS = {"kafka.bootstrap.servers": "127.0.0.1:9"}


def opts(streaming: bool = True, **kw: str):
    return parse_options({**BS, **kw}, streaming=streaming)


def bad(message: str, *, streaming: bool = True, **kw: str) -> ConfigError:
    with pytest.raises(ConfigError, match=message) as info:
        parse_options({**BS, **kw}, streaming=streaming)
    return info.value


# ---- options -------------------------------------------------------------------------------


def test_topic_selection_needs_exactly_one() -> None:
    bad("exactly one of .*none is given")
    err = bad("exactly one of .*subscribe, assign are all given", subscribe="a", assign='{"a":[0]}')
    assert err.option == "subscribe"
    bad("exactly one", subscribe="a", subscribePattern="a.*")
    bad("lists no topic", subscribe=" , ")
    bad("not a valid regular expression", subscribePattern="a(")
    bad("'assign' must be JSON mapping topics", assign='{"a":"0"}')
    bad("'assign' has an invalid value", assign="{not json")


def test_starting_offsets_json_checked() -> None:
    bad("neither earliest nor latest nor group nor valid JSON", subscribe="t", startingOffsets='{"t":{"0":1')
    bad("neither earliest", subscribe="t", startingOffsets="beginning")
    bad(r"t-0 is -3; expected a offset >= 0 or -2 or -1", subscribe="t", startingOffsets='{"t":{"0":-3}}')
    bad("is not a partition number", subscribe="t", startingOffsets='{"t":{"x":1}}')
    err = bad("does not cover the assigned partitions t-1", assign='{"t":[0,1]}', startingOffsets='{"t":{"0":5}}')
    assert err.option == "startingOffsets"
    bad("names partitions that 'assign' does not: u-0", assign='{"t":[0]}', startingOffsets='{"t":{"0":5},"u":{"0":1}}')
    bad("startingOffsetsByTimestamp' does not cover", assign='{"t":[0,1]}', startingOffsetsByTimestamp='{"t":{"0":5}}')
    o = opts(assign='{"t":[0,1]}', startingOffsets='{"t":{"0":5,"1":-2}}')
    assert o.assign == {"t": [0, 1]}


def test_streaming_refuses_ending_options() -> None:
    for name, value in (
        ("endingOffsets", "latest"),
        ("endingTimestamp", "5"),
        ("endingOffsetsByTimestamp", '{"t":{"0":1}}'),
    ):
        err = bad(f"option '{name}' is for batch queries only", subscribe="t", **{name: value})
        assert err.option == name


def test_batch_rules() -> None:
    bad("cannot be latest for batch", streaming=False, subscribe="t", startingOffsets="latest")
    bad("cannot use -1 .latest. for batch", streaming=False, subscribe="t", startingOffsets='{"t":{"0":-1}}')
    bad("cannot be earliest for batch", streaming=False, subscribe="t", endingOffsets="earliest")
    bad("cannot use -2", streaming=False, subscribe="t", endingOffsets='{"t":{"0":-2}}')
    bad(
        "startingOffsets 9 is after endingOffsets 3 for t-0",
        streaming=False,
        subscribe="t",
        startingOffsets='{"t":{"0":9}}',
        endingOffsets='{"t":{"0":3}}',
    )
    bad(
        "'startingTimestamp' .20. is after 'endingTimestamp' .10.",
        streaming=False,
        subscribe="t",
        startingTimestamp="20",
        endingTimestamp="10",
    )
    o = opts(streaming=False, subscribe="t", endingOffsets='{"t":{"0":3}}')
    assert o.ending_offsets == '{"t":{"0":3}}'


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("kafka.auto.offset.reset", "startingOffsets"),
        ("kafka.key.deserializer", "keys are always read as bytes"),
        ("kafka.value.deserializer", "values are always read as bytes"),
        ("kafka.enable.auto.commit", "offsets are kept in the Spark checkpoint"),
        ("kafka.interceptor.classes", "interceptors"),
        ("kafka.AUTO.OFFSET.RESET", "startingOffsets"),
    ],
)
def test_rejected_kafka_options_say_why(key: str, reason: str) -> None:
    err = bad(f"Kafka option '{key[6:].lower()}' is not supported: .*{reason}", subscribe="t", **{key: "x"})
    assert err.option == key.lower()


def test_other_option_errors() -> None:
    with pytest.raises(ConfigError, match=r"'kafka\.bootstrap\.servers' is required"):
        parse_options({"subscribe": "t"}, streaming=True)
    bad("kafka.isolation.level' is 'serializable'", subscribe="t", **{"kafka.isolation.level": "serializable"})
    bad(
        "'minOffsetsPerTrigger' .10. is greater than 'maxOffsetsPerTrigger' .5.",
        subscribe="t",
        minOffsetsPerTrigger="10",
        maxOffsetsPerTrigger="5",
    )
    bad("'maxOffsetsPerTrigger' is '0', out of range", subscribe="t", maxOffsetsPerTrigger="0")
    bad("'maxOffsetsPerTrigger' has an invalid value 'ten'", subscribe="t", maxOffsetsPerTrigger="ten")
    bad("'failOnDataLoss' has an invalid value 'maybe'", subscribe="t", failOnDataLoss="maybe")
    bad(
        "'startingOffsetsByTimestampStrategy' has an invalid value",
        subscribe="t",
        startingOffsetsByTimestampStrategy="skip",
    )
    bad("'commitOffsetsToGroup' needs the consumer group", subscribe="t", commitOffsetsToGroup="true")
    bad("'startingOffsets' needs the consumer group", subscribe="t", startingOffsets="group")
    bad(
        "unknown option 'maxOffsetPerTrigger'; did you mean 'maxOffsetsPerTrigger'",
        subscribe="t",
        maxOffsetPerTrigger="1",
    )
    bad("unknown fault point", subscribe="t", faults="source.nope")


def test_options_parsed_typed_and_case_insensitive() -> None:
    o = parse_options(
        {
            **BS,
            "SUBSCRIBE": "a, b",
            "maxoffsetspertrigger": "100",
            "failOnDataLoss": "false",
            "maxTriggerDelay": "30s",
            "kafka.Isolation.Level": "read_committed",
            "kafka.group.id": "g",
            "startingOffsets": "group",
            "kafkaConsumer.pollTimeoutMs": "500",
        },
        streaming=True,
    )
    assert o.subscribe == ("a", "b")
    assert o.max_offsets_per_trigger == 100 and o.fail_on_data_loss is False and o.max_trigger_delay_ms == 30_000
    assert o.read_committed and o.group_id == "g" and o.starting_is_group and o.poll_timeout_ms == 500


def test_java_names_mapped_to_librdkafka() -> None:
    o = opts(
        subscribe="t",
        **{
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p w";',
            "kafka.ssl.truststore.location": "/etc/ca.pem",
            "kafka.ssl.endpoint.identification.algorithm": "",
            "kafka.max.poll.records": "10",
        },
    )
    conf = consumer_config(o)
    assert conf == {
        "bootstrap.servers": "127.0.0.1:9",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p w",
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }
    with pytest.raises(ConfigError, match="not Java trust stores"):
        consumer_config(opts(subscribe="t", **{"kafka.ssl.truststore.location": "/etc/trust.jks"}))
    with pytest.raises(ConfigError, match="could not be mapped"):
        consumer_config(opts(subscribe="t", **{"kafka.sasl.jaas.config": "com.sun.Krb5LoginModule required;"}))


def test_options_markdown_lists_every_option() -> None:
    table = OPTIONS.markdown()
    for name in (
        "subscribePattern",
        "startingOffsetsByTimestampStrategy",
        "kafkaConsumer.pollTimeoutMs",
        "commitOffsetsToGroup",
    ):
        assert f"`{name}`" in table


# ---- offsets ---------------------------------------------------------------------------------


def test_offsets_canonical_like_spark() -> None:
    m = {TopicPartition("b", 10): 7, TopicPartition("b", 2): 3, TopicPartition("a", 0): 12}
    assert json.dumps(to_json(m)) == '{"a": {"0": 12}, "b": {"2": 3, "10": 7}}'
    assert dumps(m) == '{"a":{"0":12},"b":{"2":3,"10":7}}'
    shuffled = dict(reversed(list(m.items())))
    assert json.dumps(to_json(shuffled)) == json.dumps(to_json(m))  # Spark compares JSON text
    assert from_json(json.dumps(to_json(m))) == m
    assert from_json(to_json(m)) == m


def test_offsets_invariants() -> None:
    assert (EARLIEST, LATEST) == (-2, -1)
    with pytest.raises(ValueError, match="expected >= 0"):
        to_json({TopicPartition("a", 0): -1})
    assert to_json({TopicPartition("a", 0): LATEST}, symbolic=True) == {"a": {"0": -1}}
    with pytest.raises(ValueError, match="partition of 'a' must be an int >= 0"):
        to_json({TopicPartition("a", -1): 0})
    with pytest.raises(ConfigError, match="offset of a-0 must be an int"):
        from_json('{"a":{"0":"5"}}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        from_json("{")


# ---- splitting and admission control ----------------------------------------------------------


def r(p: int, s: int, e: int, t: str = "t") -> OffsetRange:
    return OffsetRange(t, p, s, e)


def test_split_ranges_like_spark_offset_range_calculator() -> None:
    assert split_ranges([r(0, 0, 10), r(1, 5, 5)]) == [r(0, 0, 10)]
    assert split_ranges([r(0, 0, 10), r(1, 0, 10)], min_partitions=2) == [r(0, 0, 10), r(1, 0, 10)]
    # one big and one small range: the small one stays whole, the big one takes the rest
    assert split_ranges([r(0, 0, 100), r(1, 0, 10)], min_partitions=5) == [
        r(0, 0, 25),
        r(0, 25, 50),
        r(0, 50, 75),
        r(0, 75, 100),
        r(1, 0, 10),
    ]
    assert split_ranges([r(0, 0, 4)], min_partitions=3) == [r(0, 0, 1), r(0, 1, 2), r(0, 2, 4)]
    assert split_ranges([r(0, 0, 10)], max_records_per_partition=4) == [r(0, 0, 3), r(0, 3, 6), r(0, 6, 10)]
    pieces = split_ranges([r(0, 3, 1003), r(1, 0, 7)], min_partitions=8, max_records_per_partition=300)
    assert sum(p.size for p in pieces) == 1007 and all(p.size <= 300 for p in pieces) and len(pieces) >= 8
    # contiguous, no gap, no overlap
    p0 = [p for p in pieces if p.partition == 0]
    assert p0[0].start == 3 and p0[-1].end == 1003 and all(a.end == b.start for a, b in itertools.pairwise(p0))


def test_split_counts_round_like_spark_and_key_small_ranges_by_partition() -> None:
    # Spark 4.2's getPartCount rounds (half up): 3 ranges of 15 with minPartitions=7 give 2 pieces each
    # (15/45 x 7 = 2.33), 6 tasks; ceil gave 9 (found by integration/spark_peer/test_differential.py)
    assert len(split_ranges([r(0, 0, 15), r(1, 0, 15), r(2, 0, 15)], min_partitions=7)) == 6
    assert len(split_ranges([r(0, 0, 10), r(1, 0, 10)], min_partitions=5)) == 6  # 2.5 rounds up to 3 each
    # after maxRecordsPerPartition, a topic-partition with one small piece keeps all its pieces whole
    assert split_ranges([r(0, 0, 1), r(1, 0, 3)], min_partitions=4, max_records_per_partition=2) == [
        r(0, 0, 1),
        r(1, 0, 1),
        r(1, 1, 3),
    ]


def test_offset_range_invariants() -> None:
    with pytest.raises(ValueError, match=r"\[5, 3\) is invalid"):
        r(0, 5, 3)
    with pytest.raises(ValueError, match="bad topic-partition"):
        r(-1, 0, 1)


def test_rate_limit_proportional_to_backlog() -> None:
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
    start = {a: 0, b: 100, c: 5}
    until = {a: 300, b: 200, c: 6}
    got = rate_limit(start, until, 100)
    assert got[a] == 0 + 74 and got[b] == 100 + 24  # floor(100*300/401), floor(100*100/401)
    assert got[c] == 6  # a share below one record is rounded up: never starve a partition
    assert rate_limit(start, until, 1000) == until
    assert sum(got[tp] - start[tp] for tp in start) <= 100


def test_limits_from_spark_read_limits() -> None:
    o = opts(subscribe="t", maxOffsetsPerTrigger="10", minOffsetsPerTrigger="5", maxBytesPerTrigger="1000")
    default = ReadMaxRows(10)
    got = limits_from(default, default, o, available_now=False)
    assert (got.max_rows, got.min_rows, got.max_bytes) == (10, 5, 1000)
    got = limits_from(default, default, o, available_now=True)
    assert got.min_rows is None  # AvailableNow never waits for min offsets
    assert vars(limits_from(ReadAllAvailable(), default, o, available_now=False)) == vars(Limits())
    assert limits_from(ReadMaxRows(3), default, o, available_now=False).max_rows == 3
    assert limits_from(ReadMinRows(3), default, o, available_now=False).min_rows == 3
    assert limits_from(ReadMaxBytes(3), default, o, available_now=False).max_bytes == 3


def test_default_read_limit_from_options() -> None:
    assert KafkaStreamReader(opts(subscribe="t", maxOffsetsPerTrigger="9")).getDefaultReadLimit() == ReadMaxRows(9)
    assert KafkaStreamReader(opts(subscribe="t", maxBytesPerTrigger="9")).getDefaultReadLimit() == ReadMaxBytes(9)
    assert KafkaStreamReader(opts(subscribe="t", minOffsetsPerTrigger="9")).getDefaultReadLimit() == ReadMinRows(9)
    assert KafkaStreamReader(opts(subscribe="t")).getDefaultReadLimit() == ReadAllAvailable()


# ---- pickling --------------------------------------------------------------------------------


def test_pickle_round_trips() -> None:
    part = KafkaInputPartition(
        r(1, 5, 9), ReadSettings({"bootstrap.servers": "x"}, include_headers=True, faults="source.read.mid")
    )
    assert pickle.loads(pickle.dumps(part)) == part
    reader = KafkaStreamReader(opts(subscribe="t", maxOffsetsPerTrigger="3"))
    reader.planner.client.__dict__["_admin"] = object()  # a live client must never travel
    back = pickle.loads(pickle.dumps(reader))
    assert back.opts == reader.opts and back.planner.client._admin is None
    batch = pickle.loads(pickle.dumps(KafkaBatchReader(opts(streaming=False, subscribe="t"))))
    assert batch.opts.subscribe == ("t",)
    err = pickle.loads(pickle.dumps(DataLossError("gone", topic_partition="t-0")))
    assert isinstance(err, DataLossError) and err.topic_partition == "t-0" and str(err) == "gone"
    ds = KafkaEosDataSource({**BS, "subscribe": "t"})
    assert pickle.loads(pickle.dumps(ds)).options["subscribe"] == "t"


# ---- schema ------------------------------------------------------------------------------------


def _record(off: int, key: bytes | None, value: bytes | None, ts: tuple[int, int], headers: list | None) -> object:
    from confluent_kafka import Message

    return Message(topic="t", partition=3, offset=off, key=key, value=value, timestamp=ts, headers=headers)


@pytest.mark.parametrize("headers", [False, True])
def test_arrow_schema_matches_spark(headers: bool) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    expected = to_arrow_schema(kafka_schema(headers), timezone="UTC", prefers_large_types=False)
    assert arrow_schema(headers).equals(expected, check_metadata=False) or [
        (f.name, f.type) for f in arrow_schema(headers)
    ] == [(f.name, f.type) for f in expected]
    assert [f.name for f in kafka_schema(headers).fields][:7] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


def test_columns_build_spark_rows() -> None:
    cols = _Columns("t", 3, True)
    cols.add(_record(7, b"k", b"v", (1, 1_700_000_000_123), [("h", b"x"), ("n", None)]), 7)
    cols.add(_record(9, None, None, (2, 5), None), 9)
    cols.add(_record(11, b"k", None, (0, 0), None), 11)  # no timestamp
    cols.add(_record(12, b"k", None, (1, -1), None), 12)  # CreateTime unknown
    batch = cols.flush()
    assert batch.schema == arrow_schema(True)
    rows = batch.to_pylist()
    assert rows[0]["offset"] == 7 and rows[0]["partition"] == 3 and rows[0]["timestampType"] == 0
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123)
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}, {"key": "n", "value": None}]
    assert rows[1]["key"] is None and rows[1]["timestampType"] == 1 and rows[1]["headers"] is None
    assert rows[1]["timestamp"].timestamp() == pytest.approx(0.005)
    assert (rows[2]["timestamp"], rows[2]["timestampType"]) == (None, -1)
    assert (rows[3]["timestamp"], rows[3]["timestampType"]) == (None, 0)
    assert len(cols) == 0 and isinstance(batch, pa.RecordBatch)


def test_custom_schema_refused() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    ds = KafkaEosDataSource({**BS, "subscribe": "t"})
    with pytest.raises(ConfigError, match="fixed schema"):
        ds.streamReader(StructType([StructField("value", StringType())]))
    assert isinstance(ds.streamReader(kafka_schema()), KafkaStreamReader)


# ---- stream planning without a broker (planner calls faked) ---------------------------------------


class _FakePlanner:
    def __init__(self, end: dict, resolved: dict) -> None:
        self.end, self.resolved, self.resolves = end, resolved, 0
        self.client = self

    def latest(self, tps: list) -> dict:
        return {tp: self.end.get(tp, self.resolved.get(tp, 0)) for tp in tps}

    def latest_end(self, start: dict, *, target: dict | None = None) -> tuple[dict, dict]:
        return dict(self.end), dict(self.end)

    def topic_ids(self, topics: object) -> dict[str, str]:
        return {}

    def planned_end(self, start: dict, recorded: dict, *, target: dict | None = None) -> tuple[dict, dict, dict, dict]:
        return (start, *self.latest_end(start, target=target), {})

    def replayable(self, start: dict, start_ids: dict, end: dict, end_ids: dict) -> tuple[dict, dict]:
        return start, end

    def cap(self, start: dict, end: dict, limits: Limits) -> dict:
        return dict(end)

    def resolve_start(self, tps: list) -> dict:
        self.resolves += 1
        return dict(self.resolved)

    def input_partitions(self, start: dict, end: dict) -> list:
        return [(tp, start[tp], e) for tp, e in end.items() if start.get(tp, e) < e]  # non-empty ranges


def test_symbolic_start_is_resolved_once_and_batch_zero_reads_from_it_recorded_in_its_end() -> None:
    reader = KafkaStreamReader(opts(subscribe="t"))
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    fake = _FakePlanner({tp0: 9, tp1: 3}, {tp0: 7, tp1: 3})
    reader.planner = fake  # type: ignore[assignment]
    reader._initial = to_json({tp0: LATEST, tp1: LATEST}, symbolic=True)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"kafka-eos:start:t=0:7,1:3": {}, "t": {"0": 9, "1": 3}}  # offsets/0: the end and its start
    assert reader.latestOffset(start, ReadAllAvailable()) == end and fake.resolves == 1  # resolved once
    assert reader.partitions(start, end) == [(tp0, 7, 9)]  # batch 0 reads at once, no empty pinning batch
    # nothing new after batch 0: its end as Spark gave it back (an end without the recorded start would be a
    # new end to Spark: an empty batch 1)
    assert reader.latestOffset(json.loads(json.dumps(end)), ReadAllAvailable()) == end
    fake.end = {tp0: 12, tp1: 3}
    assert reader.latestOffset(json.loads(json.dumps(end)), ReadAllAvailable()) == {"t": {"0": 12, "1": 3}}
    # a restart replays batch 0: initialOffset gives the symbolic start again, latest is elsewhere by now
    restarted = KafkaStreamReader(opts(subscribe="t"))
    restarted.planner = _FakePlanner({tp0: 20, tp1: 20}, {tp0: 20, tp1: 20})  # type: ignore[assignment]
    assert restarted.partitions(start, json.loads(json.dumps(end))) == [(tp0, 7, 9)]  # the range it was planned
    # a restart whose startingOffsets changed meanwhile replays batch 0 as planned too (Spark's source keeps
    # sources/0/0 whatever the options say then)
    assert restarted.partitions(to_json({tp0: 2, tp1: 1}), json.loads(json.dumps(end))) == [(tp0, 7, 9)]
    # offsets/0 of kafka-eos 0.1.0, whose empty batch 0 pinned the start (its end): its replay reads nothing
    assert restarted.partitions(start, {"t": {"0": 7, "1": 3}}) == []


def test_batch_zero_never_waits_for_min_offsets_its_end_is_concrete() -> None:
    """Spark builds batch 0 from whatever the first latestOffset gives: a symbolic end (the start given back by a
    wait) would be in offsets/0 for good, and every replay would fail on it."""
    import time as _time

    reader = KafkaStreamReader(opts(subscribe="t", minOffsetsPerTrigger="100", maxTriggerDelay="1h"))
    tp0 = TopicPartition("t", 0)
    reader.planner = _FakePlanner({tp0: 9}, {tp0: 7})  # type: ignore[assignment]
    reader._last_trigger = _time.monotonic()  # as if a trigger had just run: a later batch would wait
    start = to_json({tp0: LATEST}, symbolic=True)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"kafka-eos:start:t=0:7": {}, "t": {"0": 9}}, end


def test_min_offsets_wait_until_max_trigger_delay() -> None:
    reader = KafkaStreamReader(opts(subscribe="t", minOffsetsPerTrigger="10", maxTriggerDelay="60s"))
    tp = TopicPartition("t", 0)
    fake = _FakePlanner({tp: 5}, {})
    reader.planner = fake  # type: ignore[assignment]
    limit = reader.getDefaultReadLimit()
    assert reader.latestOffset(to_json({tp: 0}), limit) == {"t": {"0": 5}}  # the first trigger runs at once (Spark)
    fake.end = {tp: 10}
    start = to_json({tp: 5})
    assert reader.latestOffset(start, limit) == start  # 5 < 10 new records: wait
    assert reader._last_trigger is not None
    reader._last_trigger -= 61  # maxTriggerDelay has passed
    assert reader.latestOffset(start, limit) == {"t": {"0": 10}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 10}}  # the engine's limit wins


# ---- admission control with the real planner over a fake Kafka (issue 16) --------------------------


class _FakeClient:
    """The KafkaMetadataClient calls the planner makes; every offset look-up first lets producers write ``grow``."""

    bootstrap = "fake:9092"

    def __init__(self, ends: dict[TopicPartition, int], grow: int = 0) -> None:
        self.ends, self.grow = dict(ends), grow
        self.ids: dict[str, str] = {}  # topic -> id (none: the cluster gives no topic ids)

    def topic_ids(self, names: object) -> dict[str, str]:
        return {t: self.ids[t] for t in names if t in self.ids}  # type: ignore[attr-defined]

    def _tick(self) -> None:
        for tp in self.ends:
            self.ends[tp] += self.grow

    def partitions_for(self, **_: object) -> tuple[list[TopicPartition], list[TopicPartition]]:
        return sorted(self.ends), []

    def latest(self, tps: object) -> dict[TopicPartition, int]:
        self._tick()
        return {tp: self.ends[tp] for tp in tps}  # type: ignore[attr-defined]

    def earliest(self, tps: object) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in tps}  # type: ignore[attr-defined]

    def for_timestamps(self, stamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self.latest(stamps)  # the timestamp is "now": the records written from now on

    def committed(self, group: str, tps: object) -> dict[TopicPartition, int | None]:
        return dict(self.latest(tps))

    def close(self) -> None:
        pass


def _fake_reader(ends: dict[TopicPartition, int], grow: int = 0, **kw: str) -> tuple[KafkaStreamReader, _FakeClient]:
    reader = KafkaStreamReader(opts(subscribe="t", **kw))
    client = _FakeClient(ends, grow)
    reader.planner.client = client  # type: ignore[assignment]
    return reader, client


def _spark(offsets: dict) -> dict:
    return json.loads(json.dumps(offsets))  # what the engine hands back: JSON round trip


@pytest.mark.parametrize(
    "start",
    [{}, {"startingTimestamp": "1700000000000"}, {"startingOffsets": "group", "kafka.group.id": "g"}],
    ids=["latest", "startingTimestamp", "group"],
)
def test_available_now_resolves_the_start_before_the_snapshot(start: dict[str, str]) -> None:
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    reader, client = _fake_reader({tp0: 100, tp1: 50}, grow=10, **start)  # producers write all the time
    reader.prepareForTriggerAvailableNow()
    first = _spark(reader.initialOffset())
    limit = reader.getDefaultReadLimit()
    end = _spark(reader.latestOffset(first, limit))  # used to fail: "offsets of t-0 went back"
    resolved = batch_start(end)  # batch 0 reads from the start it resolved, recorded in its end
    assert reader._target is not None and from_json(end) == reader._target  # ends exactly at the snapshot
    assert all(reader._target[tp] >= resolved[tp] for tp in (tp0, tp1)), (resolved, end)
    assert {(p.range.partition, p.range.start) for p in reader.partitions(first, end)} == {  # type: ignore[attr-defined]
        (tp.partition, off) for tp, off in resolved.items()
    }
    client._tick()  # producers went on writing
    assert client.ends[tp0] > end["t"]["0"]
    assert reader.latestOffset(end, limit) == end  # caught up: no batch beyond the snapshot


@pytest.mark.parametrize("start", ["earliest", '{"t":{"0":-2,"1":4}}'], ids=["earliest", "json-with--2"])
def test_earliest_start_is_pinned_so_retention_cannot_move_a_replay(start: str) -> None:
    """A replay of the first data batch reads from the earliest offset found when it was planned, not the one
    retention has moved it to since: what is gone is then data loss for the reader (failOnDataLoss decides, F22),
    never a silent skip. Before earliest was pinned, batch 0 re-resolved it on replay and read [5, 10) unseen."""
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    reader, client = _fake_reader({tp0: 10, tp1: 10}, startingOffsets=start)
    first = _spark(reader.initialOffset())
    assert first == {"t": {"0": EARLIEST, "1": EARLIEST if start == "earliest" else 4}}
    end = _spark(reader.latestOffset(first, ReadAllAvailable()))
    assert batch_start(end) == {tp0: 0, tp1: 0 if start == "earliest" else 4}  # resolved, recorded in offsets/0
    assert from_json(end) == {tp0: 10, tp1: 10}
    client.earliest = lambda tps: {tp: 5 for tp in tps}  # type: ignore[method-assign]  # retention ran
    restarted, _ = _fake_reader({tp0: 10, tp1: 10}, startingOffsets=start)
    restarted.planner.client = client  # type: ignore[assignment]
    planned = restarted.partitions(first, end)  # Spark replays batch 0 from initialOffset() and offsets/0
    starts = {(p.range.partition, p.range.start) for p in planned}  # type: ignore[attr-defined]
    assert starts == {(0, 0), (1, 0 if start == "earliest" else 4)}
    end = {"t": end["t"]}  # an end that records no start: Spark's source's (below)
    # a batch 0 that Spark's format("kafka") planned from this start and did not commit (its start is in
    # sources/0/0, out of kafka-eos's reach): earliest partitions are read from their earliest offset, as Spark would
    spark_batch_0 = restarted.partitions(first, end)
    taken = {(p.range.partition, p.range.start, p.range.end) for p in spark_batch_0}  # type: ignore[attr-defined]
    assert taken == {(0, 5, 10), (1, 5 if start == "earliest" else 4, 10)}


def test_a_latest_start_cannot_take_over_sparks_uncommitted_batch_0() -> None:
    # Spark resolved "latest" when its query started and kept it in sources/0/0 only: nothing tells kafka-eos
    # where its batch 0 began, so it reads nothing there (documented: let Spark commit batch 0 before switching)
    tp0 = TopicPartition("t", 0)
    reader, _ = _fake_reader({tp0: 10})
    first = _spark(reader.initialOffset())
    assert first == {"t": {"0": LATEST}}
    assert reader.partitions(first, {"t": {"0": 10}}) == []


def test_min_offsets_compare_with_the_uncapped_latest_and_run_full_batches() -> None:
    # min = max = 1000 over 3 partitions and a 5,000-record backlog: the proportional split of a
    # capped batch is 999, so comparing min with the capped end waited out maxTriggerDelay forever
    tps = [TopicPartition("t", p) for p in range(3)]
    reader, _ = _fake_reader(
        dict(zip(tps, (1667, 1667, 1666), strict=True)),
        startingOffsets='{"t":{"0":0,"1":0,"2":0}}',
        minOffsetsPerTrigger="1000",
        maxOffsetsPerTrigger="1000",
    )
    limit = reader.getDefaultReadLimit()
    start = _spark(reader.initialOffset())
    sizes = []
    for _ in range(10):
        end = _spark(reader.latestOffset(start, limit))
        if end == start:
            break
        sizes.append(sum(end["t"][p] - start["t"][p] for p in end["t"]))
        start = end
    assert sizes == [999, 999, 999, 999, 998], sizes  # five full batches at once, none waits
    assert sum(sizes) <= 5000 and 5000 - sum(sizes) < 1000  # the rest waits for maxTriggerDelay


def test_max_trigger_delay_is_parsed_as_spark_parses_it() -> None:
    # Spark: Utils.timeStringAsMs; a bare number is milliseconds, the default 15m
    assert opts(subscribe="t").max_trigger_delay_ms == 900_000
    for text, ms in (("500", 500), ("30s", 30_000), ("15m", 900_000), ("2min", 120_000), ("1h", 3_600_000)):
        assert opts(subscribe="t", maxTriggerDelay=text).max_trigger_delay_ms == ms
    assert opts(subscribe="t", maxTriggerDelay=" 1D ").max_trigger_delay_ms == 86_400_000
    assert opts(subscribe="t", maxTriggerDelay="1500us").max_trigger_delay_ms == 1
    for text in ("1.5s", "10 seconds", "5x", "", "s"):
        bad("option 'maxTriggerDelay' has an invalid value", subscribe="t", maxTriggerDelay=text)


def test_report_latest_offset_is_the_topics_end_not_the_capped_end() -> None:
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    reader, _ = _fake_reader({tp0: 600, tp1: 400}, startingOffsets='{"t":{"0":0,"1":0}}', maxOffsetsPerTrigger="100")
    start = _spark(reader.initialOffset())
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 60, "1": 40}}
    assert reader.reportLatestOffset() == {"t": {"0": 600, "1": 400}}  # lag = latestOffset - endOffset = 900


class _Rec:
    def __init__(self, tp: TopicPartition, off: int, size: int) -> None:
        self._tp, self._off, self._size = tp, off, size

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._tp.topic

    def partition(self) -> int:
        return self._tp.partition

    def offset(self) -> int:
        return self._off

    def key(self) -> bytes:
        return b""

    def value(self) -> bytes:
        return b"x" * self._size

    def headers(self) -> None:
        return None


class _FakeConsumer:
    """Hands out the records of its assigned ranges; an empty consume() waits out its timeout on a
    fake clock, as librdkafka would on the real one (no test here measures wall time)."""

    def __init__(self, logs: dict[TopicPartition, list[int]], clock: list[float]) -> None:
        self.logs, self.pos = logs, {}  # type: dict[TopicPartition, list[int]], dict[TopicPartition, int]
        self.clock, self.waits = clock, 0

    def assign(self, parts: list) -> None:
        self.pos = {TopicPartition(p.topic, p.partition): p.offset for p in parts}

    def unassign(self) -> None:
        self.pos = {}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        out = []
        for tp, pos in self.pos.items():
            for off in self.logs[tp]:
                if off >= pos and len(out) < num_messages:
                    out.append(_Rec(tp, off, 10))
                    self.pos[tp] = off + 1
        if not out:
            self.waits += 1
            self.clock[0] += timeout
        return out


def test_max_bytes_sampling_returns_as_soon_as_a_small_backlog_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    from sources.kafka import planner as planner_mod

    clock = [1000.0]
    monkeypatch.setattr(planner_mod.time, "monotonic", lambda: clock[0])
    tp = TopicPartition("t", 0)
    reader, client = _fake_reader({tp: 3}, startingOffsets='{"t":{"0":0}}', maxBytesPerTrigger="25")
    fake = _FakeConsumer({tp: [0, 1, 2]}, clock)
    client.consumer = lambda: fake  # type: ignore[attr-defined]
    assert reader.planner._avg_record_bytes({tp: 0}, {tp: 3}) == 10
    assert fake.waits == 0  # sampled whole, no wait (it used to wait up to 5 s for 200 records that do not exist)
    assert reader.latestOffset(_spark(reader.initialOffset()), reader.getDefaultReadLimit()) == {"t": {"0": 2}}
    assert fake.waits == 0
    # a range that ends in a gap (a transaction marker at offset 2) is given up after the budget
    fake.logs[tp] = [0, 1]
    began = clock[0]
    assert reader.planner._avg_record_bytes({tp: 0}, {tp: 3}) == 10
    assert fake.waits >= 1 and clock[0] - began <= reader.planner.SAMPLE_BUDGET_S + 0.1


# ---- stale latest, metadata errors, unknown topics, authorization (issue 16 item 4) --------------------


class _StaleClient(_FakeClient):
    """latest() answers from ``answers`` (one map per call, the last one repeated): a broker that has just
    become leader may report a stale end below what the query has already read (KAFKA-7703)."""

    def __init__(self, ends: dict[TopicPartition, int], answers: list[dict[TopicPartition, int]]) -> None:
        super().__init__(ends)
        self.answers, self.calls = answers, 0

    def latest(self, tps: object) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return {tp: answer[tp] for tp in tps}  # type: ignore[attr-defined]


def _stale_reader(answers: list[dict[TopicPartition, int]], **kw: str) -> tuple[KafkaStreamReader, _StaleClient]:
    reader = KafkaStreamReader(opts(subscribe="t", startingOffsets='{"t":{"0":100}}', **kw))
    client = _StaleClient({TopicPartition("t", 0): 100}, answers)
    reader.planner.client = client  # type: ignore[assignment]
    return reader, client


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    from sources.kafka import planner as planner_mod

    slept: list[float] = []
    monkeypatch.setattr(planner_mod.time, "sleep", slept.append)
    return slept


def test_stale_latest_is_fetched_again_not_taken_for_data_loss(no_sleep: list[float]) -> None:
    tp = TopicPartition("t", 0)
    reader, client = _stale_reader([{tp: 90}, {tp: 120}])  # stale once, then the real end
    start = _spark(reader.initialOffset())
    assert start == {"t": {"0": 100}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 120}}  # used to fail: "went back"
    assert client.calls == 2 and no_sleep == [0.01]  # re-fetched once, fetchOffset.retryIntervalMs apart


def test_stale_latest_that_stays_never_moves_the_checkpoint_back(no_sleep: list[float]) -> None:
    tp = TopicPartition("t", 0)
    reader, client = _stale_reader([{tp: 90}], failOnDataLoss="false", **{"fetchOffset.numRetries": "2"})
    start = _spark(reader.initialOffset())
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 100}}  # used to be 90: offsets 90..99 would have been read twice
    assert client.calls == 3 and len(no_sleep) == 2  # bounded: fetchOffset.numRetries re-fetches
    reader, client = _stale_reader([{tp: 90}])
    with pytest.raises(DataLossError, match=r"went back from 100 to 90 \(still so after 3 re-fetch"):
        reader.latestOffset(_spark(reader.initialOffset()), ReadAllAvailable())
    assert client.calls == 4


class _Topic:
    def __init__(self, partitions: int, error: object = None) -> None:
        self.partitions = {p: object() for p in range(partitions)}
        self.error = error


class _Metadata:
    def __init__(self, topics: dict[str, _Topic]) -> None:
        self.topics = topics


class _MetaConsumer:
    """list_topics() of a cluster whose topics are given per call (the last state repeated)."""

    def __init__(self, states: list[dict[str, _Topic]]) -> None:
        self.states, self.calls = states, []  # type: list[dict[str, _Topic]], list[str | None]

    def poll(self, timeout: float = -1) -> None:  # serves callbacks: a fake has none
        return None

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        state = self.states[min(len(self.calls), len(self.states) - 1)]
        self.calls.append(topic)
        if topic is None:
            return _Metadata(dict(state))
        from confluent_kafka import KafkaError

        return _Metadata({topic: state.get(topic, _Topic(0, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))})


def _meta_planner(states: list[dict[str, _Topic]], **kw: str):  # type: ignore[no-untyped-def]
    from sources.kafka.planner import KafkaPlanner

    planner = KafkaPlanner(opts(**{"fetchOffset.retryIntervalMs": "0", **kw}), streaming=True)
    fake = _MetaConsumer(states)
    planner.client._consumer = fake  # type: ignore[assignment]
    planner.client._connected = True  # no login to wait for: the fake answers metadata
    return planner, fake


def test_unknown_subscribed_topic_fails_at_once_naming_topic_and_option() -> None:
    planner, fake = _meta_planner([{"t": _Topic(2)}], subscribe="t,nope")
    with pytest.raises(
        ConfigError, match=r"option 'subscribe' names topic\(s\) that do not exist at .*: 'nope'"
    ) as info:
        planner.discover()
    assert info.value.option == "subscribe" and "Create them first" in str(info.value)
    assert fake.calls == ["t", "nope"]  # only the subscribed topics are described, once each: no retry


@pytest.mark.parametrize("option", ["subscribe", "assign", "subscribePattern"])
def test_authorization_error_fails_at_once_naming_the_topic(option: str) -> None:
    from confluent_kafka import KafkaError

    from eos_core.errors import FatalError

    value = {"subscribe": "t", "assign": '{"t":[0]}', "subscribePattern": "^t$"}[option]
    denied = _Topic(0, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    planner, fake = _meta_planner([{"t": denied}], **{option: value})
    with pytest.raises(
        FatalError,
        match=r"refused access \(TOPIC_AUTHORIZATION_FAILED.*lacks READ on topic 't'.*--operation Read --topic 't'",
    ):
        planner.discover()
    assert len(fake.calls) == 1  # not retried for fetchOffset.numRetries x pollTimeoutMs


def test_metadata_error_is_not_a_deleted_topic(no_sleep: list[float]) -> None:
    from confluent_kafka import KafkaError

    from eos_core.errors import ServiceError

    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    sick = {"t": _Topic(2, KafkaError(KafkaError.LEADER_NOT_AVAILABLE))}
    for option, value in (("subscribe", "t"), ("subscribePattern", "^t$")):
        # a transient error is retried and the partitions stay (it used to drop them as "deleted")
        planner, fake = _meta_planner([sick, {"t": _Topic(2)}], failOnDataLoss="false", **{option: value})
        planner.client.latest = lambda got: {tp: 7 for tp in got}  # type: ignore[method-assign]
        end, _ = planner.latest_end({tp: 5 for tp in tps})
        assert end == {tp: 7 for tp in tps} and len(fake.calls) == 2, option
        # one that persists fails clearly, never drops partitions nor re-reads them from earliest later
        planner, fake = _meta_planner([sick], failOnDataLoss="false", **{option: value})
        with pytest.raises(ServiceError, match=r"topic 't' has a metadata error: LEADER_NOT_AVAILABLE.*not a deleted"):
            planner.latest_end({tp: 5 for tp in tps})
        assert len(fake.calls) == 4  # 1 + fetchOffset.numRetries


def test_deleted_topic_is_still_judged_by_fail_on_data_loss() -> None:
    planner, _ = _meta_planner([{"other": _Topic(1)}], subscribe="t", failOnDataLoss="false")
    planner.client.latest = lambda got: {}  # type: ignore[method-assign]
    planner.client.earliest = lambda got: {}  # type: ignore[method-assign]
    assert planner.latest_end({TopicPartition("t", 0): 5}) == ({}, {})  # gone: logged and dropped
    planner, _ = _meta_planner([{"other": _Topic(1)}], subscribe="t")
    planner.client.latest = lambda got: {}  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="is gone"):
        planner.latest_end({TopicPartition("t", 0): 5})


def test_a_partition_new_in_a_batch_is_read_from_earliest_like_spark() -> None:
    # Spark's own source reads a partition that first appears in a batch from its earliest offset in that
    # batch; kafka-eos pins it there (end = earliest, nothing read). Replaying either reads [earliest, end).
    reader, _ = _fake_reader({TopicPartition("t", 0): 10, TopicPartition("t", 1): 3})
    parts = reader.partitions({"t": {"0": 5}}, {"t": {"0": 10, "1": 3}})
    assert sorted(p.value for p in parts) == [("t", 0, 5, 10), ("t", 1, 0, 3)]
    assert [p.value for p in reader.partitions({"t": {"0": 5}}, {"t": {"0": 5, "1": 0}})] == []


def _err_msg(code: int, topic: str = "t", partition: int = 0) -> object:
    from confluent_kafka import KafkaError, Message

    return Message(topic=topic, partition=partition, offset=0, error=KafkaError(code))


class _ErrConsumer:
    def __init__(self, code: int, exists: bool = True) -> None:
        self.code, self.exists, self.consumes = code, exists, 0

    def get_watermark_offsets(self, tp: object, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return 0, 10

    def assign(self, parts: list) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        self.consumes += 1
        return [_err_msg(self.code)]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        return _Metadata({"t": _Topic(1)} if self.exists else {})


def _read_with(consumer: _ErrConsumer, monkeypatch: pytest.MonkeyPatch, **kw: object) -> list:
    from sources.kafka import reader as reader_mod

    monkeypatch.setattr(reader_mod, "_consumer", lambda settings: consumer)
    settings = ReadSettings({"bootstrap.servers": "b:9"}, poll_timeout_ms=300, **kw)  # type: ignore[arg-type]
    return list(reader_mod.read_partition(KafkaInputPartition(r(0, 0, 10), settings)))


def test_reader_fails_at_once_on_authorization_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import KafkaError

    from eos_core.errors import FatalError

    consumer = _ErrConsumer(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(FatalError, match=r"b:9 refused access \(TOPIC_AUTHORIZATION_FAILED.*lacks READ on topic 't'"):
        _read_with(consumer, monkeypatch)
    assert consumer.consumes == 1  # it used to poll until kafkaConsumer.pollTimeoutMs: "no record arrived"


def test_reader_tells_a_deleted_topic_from_a_transient_unknown_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import KafkaError

    gone = _ErrConsumer(KafkaError.UNKNOWN_TOPIC_OR_PART, exists=False)
    with pytest.raises(DataLossError, match=r"t-0 is gone \(topic or partition deleted\) while reading \[0, 10\)"):
        _read_with(gone, monkeypatch)
    assert (
        _read_with(_ErrConsumer(KafkaError.UNKNOWN_TOPIC_OR_PART, exists=False), monkeypatch, fail_on_data_loss=False)
        == []
    )
    still_there = _ErrConsumer(KafkaError.UNKNOWN_TOPIC_OR_PART, exists=True)  # metadata not yet propagated
    from eos_core.errors import RetriableError

    with pytest.raises(RetriableError, match="no record of t-0 arrived"):
        _read_with(still_there, monkeypatch)  # retried until the poll timeout, never taken for data loss
    assert still_there.consumes > 1


# ---- drop-in options (issue 16 item 5) ------------------------------------------------------------

SPARK_OPTIONS = Path(__file__).parent / "data" / "spark_kafka_source_options.html"
# A valid value for each option Spark documents (keys lower-cased); a name Spark adds to its docs and that
# is missing here fails the test below, so the list can never silently fall behind.
_SAMPLES = {
    "assign": '{"t":[0]}',
    "subscribe": "t",
    "subscribepattern": "t.*",
    "kafka.bootstrap.servers": "127.0.0.1:9",
    "startingtimestamp": "1000",
    "startingoffsetsbytimestamp": '{"t":{"0":1000}}',
    "startingoffsets": "earliest",
    "endingtimestamp": "2000",
    "endingoffsetsbytimestamp": '{"t":{"0":2000}}',
    "endingoffsets": "latest",
    "failondataloss": "false",
    "kafkaconsumer.polltimeoutms": "5000",
    "fetchoffset.numretries": "2",
    "fetchoffset.retryintervalms": "20",
    "maxoffsetspertrigger": "100",
    "minoffsetspertrigger": "10",
    "maxtriggerdelay": "30s",
    "minpartitions": "4",
    "maxrecordsperpartition": "1000",
    "groupidprefix": "mine",
    "kafka.group.id": "g",
    "includeheaders": "true",
    "startingoffsetsbytimestampstrategy": "latest",
    "topic": "out",
}


def _spark_documented_options() -> list[tuple[str, str]]:
    """(option, query type) of every row of the option tables copied from Spark's documentation."""
    import re

    text = SPARK_OPTIONS.read_text()
    rows = re.findall(r"<tr>\s*<td>([^<]+)</td>(.*?)</tr>", text, re.S)
    out = []
    for name, rest in rows:
        cells = re.findall(r"<td>(.*?)</td>", rest, re.S)
        kind = next((c for c in cells if c in ("streaming and batch", "batch query", "streaming query")), "")
        out.append((name.strip(), kind))
    return out


def test_every_option_spark_documents_is_accepted() -> None:
    documented = _spark_documented_options()
    names = {n for n, _ in documented}
    assert len(names) == 24 and {"topic", "includeHeaders", "kafka.group.id", "groupIdPrefix"} <= names
    for name, kind in documented:
        assert name.lower() in _SAMPLES, f"Spark documents option {name!r}: add a sample value and support it"
        selection = {} if name in ("assign", "subscribe", "subscribePattern") else {"subscribe": "t"}
        raw = {**BS, **selection, name: _SAMPLES[name.lower()]}
        for streaming in (False,) if kind == "batch query" else (True, False):
            got = parse_options(raw, streaming=streaming)  # never "unknown option"
            assert got.bootstrap == "127.0.0.1:9", name
    bad("unknown option 'subscibe'; did you mean 'subscribe'", subscibe="t")  # truly unknown ones still fail


def test_sink_topic_is_accepted_and_ignored_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="sources.kafka.options"):
        o = parse_options({**BS, "subscribe": "in", "topic": "out", "includeHeaders": "true"}, streaming=True)
    assert o.subscribe == ("in",) and o.include_headers
    assert any("ignoring option 'topic': it is a Kafka sink option" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sources.kafka.options"):
        parse_options({**BS, "subscribe": "in", "maxOffsetsPerTrigger": "5"}, streaming=False)
    assert any("'maxOffsetsPerTrigger': it has no meaning in a batch read" in r.getMessage() for r in caplog.records)


def test_java_client_settings_map_to_librdkafka_or_say_what_replaces_them(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from confluent_kafka import Consumer

    secret = "s3cr3t-Pw"
    java = {
        "kafka.receive.buffer.bytes": "65536",
        "kafka.send.buffer.bytes": "131072",
        "kafka.ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
        "kafka.ssl.protocol": "TLSv1.3",
        "kafka.request.timeout.ms": "30000",
        "kafka.fetch.max.wait.ms": "100",
        "kafka.max.poll.records": "500",
        "kafka.retry.backoff.ms": "200",
        "kafka.reconnect.backoff.max.ms": "5000",
        "kafka.acks": "all",  # sink settings in an options map shared with Spark's Kafka sink
        "kafka.linger.ms": "5",
        "kafka.partitioner.class": "org.apache.kafka.clients.producer.RoundRobinPartitioner",
        "kafka.buffer.memory": "1000000",
        "kafka.partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor",
    }
    with caplog.at_level(logging.INFO, logger="sources.kafka.options"):
        conf = consumer_config(opts(subscribe="t", **java))
    assert conf == {
        "bootstrap.servers": "127.0.0.1:9",
        "socket.receive.buffer.bytes": "65536",
        "socket.send.buffer.bytes": "131072",
        "socket.timeout.ms": "30000",
        "fetch.wait.max.ms": "100",
        "retry.backoff.ms": "200",
        "reconnect.backoff.max.ms": "5000",
    }
    Consumer({**conf, "group.id": "g"}).close()  # every mapped name is one librdkafka knows
    logged = " | ".join(r.getMessage() for r in caplog.records)
    for key in ("ssl.enabled.protocols", "ssl.protocol", "max.poll.records", "acks", "partitioner.class"):
        assert f"ignoring option kafka.{key}" in logged, key

    # key stores: PKCS#12 passes (with its password), PEM maps to certificate + key, JKS says what replaces it
    p12 = consumer_config(
        opts(subscribe="t", **{"kafka.ssl.keystore.location": "/k/client.p12", "kafka.ssl.keystore.password": secret})
    )
    assert p12["ssl.keystore.location"] == "/k/client.p12" and p12["ssl.keystore.password"] == secret
    pem = consumer_config(
        opts(subscribe="t", **{"kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": "/k/client.pem"})
    )
    assert pem == {
        "bootstrap.servers": "127.0.0.1:9",
        "ssl.certificate.location": "/k/client.pem",
        "ssl.key.location": "/k/client.pem",
    }
    caplog.clear()
    for extra, key in (
        ({"kafka.ssl.keystore.type": "JKS", "kafka.ssl.keystore.location": "/k/ks"}, "kafka.ssl.keystore.location"),
        ({"kafka.ssl.keystore.location": "/k/client.jks"}, "kafka.ssl.keystore.location"),
        ({"kafka.ssl.keystore.type": "JKS"}, "kafka.ssl.keystore.type"),
    ):
        with caplog.at_level(logging.INFO):
            with pytest.raises(
                ConfigError,
                match=r"PKCS#12.*kafka\.ssl\.keystore\.location=keystore\.p12 with kafka\.ssl\.keystore\.password",
            ) as info:
                consumer_config(opts(subscribe="t", **{**extra, "kafka.ssl.keystore.password": secret}))
        assert info.value.option == key and secret not in str(info.value)
    for extra in (
        {"kafka.ssl.truststore.type": "JKS", "kafka.ssl.truststore.location": "/k/trust"},
        {"kafka.ssl.truststore.type": "JKS"},
    ):
        with pytest.raises(ConfigError, match=r"keytool -exportcert -rfc.*kafka\.ssl\.ca\.location=ca\.pem"):
            consumer_config(opts(subscribe="t", **{**extra, "kafka.ssl.truststore.password": secret}))
    with pytest.raises(ConfigError, match=r"openssl pkcs12 .*-nokeys.*kafka\.ssl\.ca\.location"):
        consumer_config(opts(subscribe="t", **{"kafka.ssl.truststore.location": "/k/trust.p12"}))
    assert consumer_config(
        opts(subscribe="t", **{"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/k/ca.bundle"})
    ) == {"bootstrap.servers": "127.0.0.1:9", "ssl.ca.location": "/k/ca.bundle"}
    with pytest.raises(
        ConfigError, match=r"cannot load Java classes; for OAUTHBEARER set kafka\.sasl\.oauthbearer\.method=oidc"
    ):
        consumer_config(opts(subscribe="t", **{"kafka.sasl.login.callback.handler.class": "com.x.Handler"}))
    krb = consumer_config(
        opts(
            subscribe="t",
            **{
                "kafka.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
                'keyTab="/etc/k.keytab" principal="spark@EXAMPLE.COM";'
            },
        )
    )
    assert krb["sasl.kerberos.keytab"] == "/etc/k.keytab" and krb["sasl.kerberos.principal"] == "spark@EXAMPLE.COM"
    assert all(secret not in r.getMessage() for r in caplog.records)  # no secret in any log line


# ---- Python workers that cannot import the package (issue 16 item 7) ---------------------------------------


class _Context:
    """The SparkContext attributes the worker check reads."""

    def __init__(self, python: str, master: str = "local[2]") -> None:
        self.pythonExec, self.master, self.environment, self._python_includes = python, master, {}, []


def test_workers_without_confluent_kafka_fail_at_registration_naming_interpreter_and_fix() -> None:
    import subprocess
    import sys

    from sources.kafka.workers import check_python_workers

    system = "/usr/bin/python3"
    lacks = subprocess.run([system, "-c", "import confluent_kafka"], capture_output=True, check=False).returncode
    assert lacks != 0, f"{system} has confluent_kafka here: the test needs an interpreter without it"
    with pytest.raises(ConfigError) as info:
        check_python_workers(_Context(system))
    text = str(info.value)
    assert f"Spark's Python workers run {system}" in text and "No module named 'confluent_kafka'" in text
    assert "set PYSPARK_PYTHON to the interpreter that has spark-eos installed" in text
    assert f"export PYSPARK_PYTHON={sys.executable}" in text and "source .venv/bin/activate" in text
    with pytest.raises(ConfigError, match=r"the interpreter '/no/such/python' does not exist"):
        check_python_workers(_Context("/no/such/python"))
    check_python_workers(_Context(sys.executable))  # this interpreter has everything: no error
    check_python_workers(_Context(system, master="spark://elsewhere:7077"))  # remote workers: not probed here


# ---- per-trigger cost (issue 16 item 8) ---------------------------------------------------------------


def test_commit_offsets_to_group_reuses_one_consumer(monkeypatch: pytest.MonkeyPatch) -> None:

    made: list[dict] = []
    commits: list[list] = []

    class _Committer:
        def __init__(self, conf: dict) -> None:
            made.append(conf)
            self.closed = False
            self.on_commit = conf["on_commit"]
            self.pending: list = []

        def commit(self, offsets: list, asynchronous: bool) -> None:
            assert asynchronous  # answered through on_commit, waited for within a bound
            commits.append([(o.topic, o.partition, o.offset) for o in offsets])
            self.pending = offsets

        def poll(self, timeout: float) -> None:
            if self.pending:
                self.on_commit(None, self.pending)
                self.pending = []

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(kafka_clients, "Consumer", _Committer)
    reader = KafkaStreamReader(opts(subscribe="t", commitOffsetsToGroup="true", **{"kafka.group.id": "g"}))
    for end in ({"t": {"0": 5}}, {"t": {"0": 9}}, {"t": {"0": 12}}):
        reader.commit(end)
    assert commits == [[("t", 0, 5)], [("t", 0, 9)], [("t", 0, 12)]]
    assert len(made) == 1 and made[0]["group.id"] == "g"  # one consumer for every batch (it used to be one each)
    committer = reader.planner.client._committer[1]  # type: ignore[index]
    reader.stop()
    assert committer.closed and reader.planner.client._committer is None


def test_a_group_commit_nobody_answers_holds_the_batch_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka's synchronous commit has no timeout: a dead coordinator (issue 46) would hold the query's trigger.
    The commit is left after COMMIT_WAIT_S, and the next batch commits from a fresh consumer, which looks the
    coordinator up again."""
    from sources.kafka import client as client_module

    made: list = []

    class _Silent:
        def __init__(self, conf: dict) -> None:
            made.append(self)
            self.closed = False
            self.polls = 0

        def commit(self, offsets: list, asynchronous: bool) -> None:
            pass

        def poll(self, timeout: float) -> None:
            self.polls += 1

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(kafka_clients, "Consumer", _Silent)
    monkeypatch.setattr(client_module, "COMMIT_WAIT_S", 0.3)
    reader = KafkaStreamReader(opts(subscribe="t", commitOffsetsToGroup="true", **{"kafka.group.id": "g"}))
    began = time.monotonic()
    with caplog.at_level("WARNING"):
        reader.commit({"t": {"0": 5}})
        reader.commit({"t": {"0": 9}})
    assert time.monotonic() - began < 5  # not the minutes librdkafka waits
    assert len(made) == 2 and all(c.closed and c.polls > 0 for c in made)  # each left, the next one fresh
    assert "got no answer within 0.3s (monitoring only, ignored" in caplog.text


# ---- the record loop's fast path (issue 16 item 8) --------------------------------------------------


class _ChunkConsumer:
    """Hands out scripted chunks of real confluent_kafka Messages, then EOF."""

    def __init__(self, chunks: list[list]) -> None:
        self.chunks = list(chunks)

    def get_watermark_offsets(self, tp: object, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return 0, 10_000

    def assign(self, parts: list) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        return self.chunks.pop(0) if self.chunks else []


def _msg(offset: int, size: int = 10) -> object:
    from confluent_kafka import Message

    return Message(
        topic="t",
        partition=0,
        offset=offset,
        key=b"k%d" % offset,
        value=b"v" * size,
        timestamp=(1, 1_700_000_000_000 + offset),
    )


def _eof(offset: int) -> object:
    from confluent_kafka import KafkaError, Message

    return Message(topic="t", partition=0, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


@pytest.mark.parametrize("fast", [True, False])
def test_record_loop_fast_path_yields_the_per_record_loops_batches(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    from sources.kafka import reader as reader_mod

    def script() -> list[list]:
        return [
            [_msg(o) for o in range(0, 700)],  # clean: fast path
            [_msg(o) for o in range(650, 1200)],  # starts below the position: per-record loop skips 650..699
            [_msg(o, size=5000) for o in range(1200, 2200)],  # big records: the bytes limit cuts inside the chunk
            [*[_msg(o) for o in range(2200, 2300)], _eof(2300)],  # an EOF inside: per-record loop
            [_msg(o) for o in range(2400, 3000)],  # a gap of 100 offsets (compaction), then clean
        ]

    def run(use_fast: bool) -> tuple[list, list]:
        consumer = _ChunkConsumer(script())
        monkeypatch.setattr(reader_mod, "_consumer", lambda settings: consumer)
        if not use_fast:
            monkeypatch.setattr(reader_mod, "_clean_run", lambda msgs, position, end: None)
        marks: list = []
        monkeypatch.setattr(reader_mod.faults, "point", lambda name, **kw: marks.append(name))
        extend = reader_mod._Columns.extend

        def counted(self: object, run: object, lo: int, hi: int, size: int) -> None:
            marks.append("extend")
            extend(self, run, lo, hi, size)  # type: ignore[arg-type]

        monkeypatch.setattr(reader_mod._Columns, "extend", counted)
        settings = ReadSettings(
            {"bootstrap.servers": "b:9"},
            poll_timeout_ms=300,
            arrow_batch_rows=400,  # type: ignore[arg-type]
            arrow_batch_bytes=1_000_000,
        )
        batches = list(reader_mod.read_partition(KafkaInputPartition(r(0, 0, 3000), settings)))
        return batches, marks

    got, marks = run(fast)
    monkeypatch.undo()
    want, want_marks = run(False)
    assert [b.num_rows for b in got] == [b.num_rows for b in want]  # the same flush boundaries
    assert [b.to_pydict() for b in got] == [b.to_pydict() for b in want]
    offsets = [o for b in got for o in b.column("offset").to_pylist()]
    assert offsets == [*range(0, 2300), *range(2400, 3000)]  # each record once, in order, the gap skipped
    assert max(b.nbytes for b in got) < 3_000_000  # 1000 records of 5 KB never went into one batch
    assert ("extend" in marks) is fast and "extend" not in want_marks  # the fast path really ran (or not)
    assert [m for m in marks if m != "extend"] == want_marks and marks.count("source.read.mid") == 1
    first = got[0]
    assert first.column("topic").to_pylist()[:2] == ["t", "t"] and first.column("partition").to_pylist()[0] == 0
    assert first.column("timestampType").to_pylist()[0] == 0


class _LogConsumer:
    """A partition whose records [low, high) exist: a fetch below ``low`` (retention) or at/after ``high``
    (truncation) is out of range, as a broker answers with auto.offset.reset=error; counts watermark calls."""

    def __init__(self, low: int, high: int, transient: int = 0) -> None:
        self.low, self.high, self.transient = low, high, transient
        self.at, self.watermark_calls, self.assigned = 0, 0, []

    def get_watermark_offsets(self, tp: object, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        self.watermark_calls += 1
        return self.low, self.high

    def assign(self, parts: list) -> None:
        self.at = parts[0].offset
        self.assigned.append(self.at)

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        from confluent_kafka import KafkaError, Message

        if self.transient or not self.low <= self.at < self.high:
            self.transient = max(0, self.transient - 1)
            return [Message(topic="t", partition=0, offset=self.at, error=KafkaError(KafkaError._AUTO_OFFSET_RESET))]
        got = [_msg(o) for o in range(self.at, min(self.at + num_messages, self.high))]
        self.at += len(got)
        return got


def _read_log(consumer: _LogConsumer, monkeypatch: pytest.MonkeyPatch, end: int, **kw: object) -> list[int]:
    from sources.kafka import reader as reader_mod

    monkeypatch.setattr(reader_mod, "_consumer", lambda settings: consumer)
    settings = ReadSettings({"bootstrap.servers": "b:9"}, poll_timeout_ms=300, **kw)  # type: ignore[arg-type]
    batches = reader_mod.read_partition(KafkaInputPartition(r(0, 0, end), settings))
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_reader_asks_for_no_watermarks_when_the_range_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16 item 8: no watermark round trip per task; the fetch itself reports a missing start."""
    consumer = _LogConsumer(0, 1000)
    assert _read_log(consumer, monkeypatch, 600) == list(range(600))
    assert consumer.watermark_calls == 0 and consumer.assigned == [0]


def test_reader_start_removed_by_retention_is_a_loss_named_by_its_records(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataLossError, match=r"records 0\.\.399 of t-0 are gone \(earliest offset is now 400\)"):
        _read_log(_LogConsumer(400, 1000), monkeypatch, 600)
    consumer = _LogConsumer(400, 1000)
    assert _read_log(consumer, monkeypatch, 600, fail_on_data_loss=False) == list(range(400, 600))
    assert consumer.assigned == [0, 400] and consumer.watermark_calls == 1
    consumer = _LogConsumer(700, 1000)  # the whole range is gone
    assert _read_log(consumer, monkeypatch, 600, fail_on_data_loss=False) == []
    with pytest.raises(DataLossError, match=r"records 0\.\.599 of t-0 are gone \(earliest offset is now 700\)"):
        _read_log(_LogConsumer(700, 1000), monkeypatch, 600)


def test_reader_out_of_range_inside_the_log_is_retried_and_truncation_is_a_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = _LogConsumer(0, 1000, transient=2)  # e.g. a leader change: the offset is there after all
    assert _read_log(consumer, monkeypatch, 600) == list(range(600))
    assert consumer.assigned == [0, 0, 0] and consumer.watermark_calls == 2
    with pytest.raises(DataLossError, match=r"records 300\.\.599 of t-0 are gone: the partition now ends at 300"):
        _read_log(_LogConsumer(0, 300), monkeypatch, 600)
    assert _read_log(_LogConsumer(0, 300), monkeypatch, 600, fail_on_data_loss=False) == list(range(300))


def test_read_consumer_settings_bound_the_prefetch_and_never_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read task's consumer: bounded prefetch, no 1 s wait when its queue fills (librdkafka's default
    fetch.queue.backoff.ms), no 500 ms wait behind a fetch past the range's end (fetch.wait.max.ms), never a
    silent offset jump; a user's kafka.* value wins where it may."""
    from sources.kafka import reader as reader_mod

    made: list[dict] = []
    monkeypatch.setattr(reader_mod, "_CONSUMERS", {})
    monkeypatch.setattr(reader_mod.kafka_clients, "consumer", lambda conf, watch: made.append(conf) or object())
    reader_mod._consumer(ReadSettings({"bootstrap.servers": "b:9"}))
    reader_mod._consumer(
        ReadSettings(
            {
                "bootstrap.servers": "b:9",
                "fetch.queue.backoff.ms": "500",
                "fetch.wait.max.ms": "100",
                "auto.offset.reset": "earliest",
            }
        )
    )
    default, user = made
    assert default["fetch.queue.backoff.ms"] == 10 and default["queued.max.messages.kbytes"] == 16384
    assert default["fetch.wait.max.ms"] == 10 and user["fetch.wait.max.ms"] == "100"
    assert default["auto.offset.reset"] == "error" and default["enable.auto.commit"] is False
    assert user["fetch.queue.backoff.ms"] == "500" and user["auto.offset.reset"] == "error"
    reader_mod._consumer(ReadSettings({"bootstrap.servers": "b:9"}))
    assert len(made) == 2  # one consumer per configuration, reused


# ---- issue 45, item 8: a topic deleted and re-created under its name (topic ids in the offsets) -------------


def _spark_partition_offsets(text: str) -> dict[tuple[str, int], int]:
    """Spark's own source reads an offset as Map[String, Map[Int, Long]] and flattens it into TopicPartitions
    (``JsonUtils.partitionOffsets``): every value must be an object of int keys and long values."""
    out = {}
    for topic, parts in json.loads(text).items():
        assert isinstance(parts, dict), (topic, parts)
        for p, off in parts.items():
            assert isinstance(int(p), int) and isinstance(off, int)
            out[(topic, int(p))] = off
    return out


def test_offsets_record_topic_ids_where_sparks_source_sees_no_partition() -> None:
    from sources.kafka.offsets import kafka_uuid, topic_ids, with_ids

    tp0, tp1, u0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
    written = with_ids(to_json({tp0: 5, tp1: 7, u0: 1}), {"t": "AAAAAAAAAAAAAAAAAAAAAA", "u": "x-_Y", "v": "no"})
    text = json.dumps(written, separators=(",", ":"))
    assert _spark_partition_offsets(text) == {("t", 0): 5, ("t", 1): 7, ("u", 0): 1}  # Spark reads the offsets
    assert from_json(text) == {tp0: 5, tp1: 7, u0: 1}  # so does kafka-eos, and an earlier kafka-eos
    assert topic_ids(text) == {"t": "AAAAAAAAAAAAAAAAAAAAAA", "u": "x-_Y"}  # only the offsets' topics
    assert list(written) == sorted(written)  # one text for equal offsets
    assert topic_ids({"t": {"0": 5}}) == {}  # Spark's offsets: no ids
    assert kafka_uuid("muRobJfERH6n/OvY7UJojA") == "muRobJfERH6n_OvY7UJojA"  # Kafka's own text of an id


def test_a_first_batchs_end_records_its_start_where_sparks_source_sees_no_partition() -> None:
    from sources.kafka.offsets import with_ids, with_start

    tp0, tp1, u0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
    written = with_start(with_ids(to_json({tp0: 50, tp1: 70, u0: 1}), {"t": "ID"}), {tp0: 5, tp1: 7, u0: 0})
    assert list(written) == sorted(written)  # one text for equal offsets
    text = json.dumps(written, separators=(",", ":"))
    assert "kafka-eos:start:t=0:5,1:7" in written and "kafka-eos:start:u=0:0" in written
    assert _spark_partition_offsets(text) == {("t", 0): 50, ("t", 1): 70, ("u", 0): 1}  # Spark reads the end
    assert from_json(text) == {tp0: 50, tp1: 70, u0: 1}  # so does kafka-eos (and 0.1.0: a topic with no partition)
    assert batch_start(text) == {tp0: 5, tp1: 7, u0: 0}
    assert batch_start({"t": {"0": 5}}) == {} and batch_start("not json") == {}  # a later batch's end, Spark's
    with pytest.raises(ConfigError, match="kafka-eos:start:t=0:x"):
        batch_start({"kafka-eos:start:t=0:x": {}})
    with pytest.raises(ConfigError, match=">= 0"):
        batch_start({"kafka-eos:start:t=0:-2": {}})  # a recorded start is concrete


def _ids_reader(fail_on_data_loss: str) -> tuple[KafkaStreamReader, _FakeClient, dict]:
    tp = TopicPartition("t", 0)
    reader, client = _fake_reader({tp: 10}, failOnDataLoss=fail_on_data_loss)
    client.ids = {"t": "OLD"}
    first = _spark(reader.latestOffset(_spark({"t": {"0": 4}}), ReadAllAvailable()))
    assert first == {"kafka-eos:topic-id:t=OLD": {}, "t": {"0": 10}}  # the end records the topic's id
    return reader, client, first


def test_a_recreated_topic_past_the_checkpoint_fails_naming_the_topic_and_both_ids() -> None:
    reader, client, start = _ids_reader("true")
    client.ids["t"], client.ends[TopicPartition("t", 0)] = "NEW", 25  # deleted, re-created, past offset 10
    with pytest.raises(DataLossError) as e:
        reader.latestOffset(start, ReadAllAvailable())
    said = str(e.value)
    assert "topic 't' was deleted and re-created" in said and "topic id OLD" in said and "has id NEW" in said
    assert "failOnDataLoss=false" in said and "new checkpoint" in said


def test_without_fail_on_data_loss_a_recreated_topic_is_read_from_its_earliest_offset_as_a_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader, client, start = _ids_reader("false")
    tp = TopicPartition("t", 0)
    client.ids["t"], client.ends[tp] = "NEW", 25
    with caplog.at_level("WARNING", logger="sources.kafka.planner"):
        pinned = _spark(reader.latestOffset(start, ReadAllAvailable()))
    assert pinned == {"kafka-eos:topic-id:t=NEW": {}, "t": {"0": 0}}  # pinned at the new topic's earliest
    assert "re-created" in caplog.text and "OLD" in caplog.text and "NEW" in caplog.text
    assert reader.partitions(start, pinned) == []  # the batch that finds it reads nothing of it (10 -> 0 is no range)
    nxt = _spark(reader.latestOffset(pinned, ReadAllAvailable()))
    (part,) = reader.partitions(pinned, nxt)
    assert (part.range.start, part.range.end) == (0, 25)  # then every record of the new topic, once


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_batch_replayed_after_its_topic_was_recreated_is_refused_or_reads_nothing_of_it(fail: str) -> None:
    reader, client, start = _ids_reader(fail)
    client.ends[TopicPartition("t", 0)] = 18
    end = _spark(reader.latestOffset(start, ReadAllAvailable()))  # planned: 10 -> 18 of topic OLD
    client.ids["t"] = "NEW"  # the driver died; the topic is re-created; the restart replays the batch
    if fail == "true":
        with pytest.raises(DataLossError, match=r"topic id OLD.*has id NEW"):
            reader.partitions(start, end)
    else:
        assert reader.partitions(start, end) == []


def test_offsets_without_ids_are_read_on_and_get_them() -> None:
    tp = TopicPartition("t", 0)
    reader, client = _fake_reader({tp: 10})
    client.ids = {"t": "NOW"}
    end = _spark(reader.latestOffset({"t": {"0": 4}}, ReadAllAvailable()))  # Spark's source wrote the start
    assert end == {"kafka-eos:topic-id:t=NOW": {}, "t": {"0": 10}}
    (part,) = reader.partitions({"t": {"0": 4}}, end)
    assert (part.range.start, part.range.end) == (4, 10)


def test_topic_ids_leave_out_missing_topics_and_brokers_without_ids() -> None:
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException

    from sources.kafka.client import KafkaMetadataClient

    def answer(value: object) -> Any:
        def result(timeout: float) -> Any:
            if isinstance(value, KafkaError):
                raise KafkaException(value)
            return SimpleNamespace(topic_id=value)

        return SimpleNamespace(result=result)

    answers: dict[str, object] = {
        "t": "muRobJfERH6n/OvY7UJojA",
        "gone": KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART),
        "old": "AAAAAAAAAAAAAAAAAAAAAA",  # a broker before Kafka 2.8: the zero id
    }
    client = KafkaMetadataClient({}, timeout_ms=1000, retries=0, retry_interval_ms=1, read_committed=True)
    client._admin = SimpleNamespace(  # type: ignore[assignment]
        describe_topics=lambda topics, request_timeout: {t: answer(answers[t]) for t in topics.topic_names}
    )
    assert client.topic_ids(["t", "gone", "old"]) == {"t": "muRobJfERH6n_OvY7UJojA"}
    answers["t"] = KafkaError(KafkaError._UNSUPPORTED_FEATURE)
    assert client.topic_ids(["t"]) == {} and client.topic_ids(["gone"]) == {}  # no ids from these brokers
