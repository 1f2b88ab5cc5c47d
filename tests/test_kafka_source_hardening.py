"""Issue 27 item 10, the kafka-eos source: offsets past 64 bits refused at option parsing, secrets
kept out of the options' repr, the batch reader's driver client closed on every planning failure,
and (in tests/test_kafka_source.py) a replayed first batch of startingOffsets=earliest that reads from the pinned start."""

from __future__ import annotations

import pytest

from eos_core import kafka_clients
from eos_core.errors import ConfigError
from sources.kafka import parse_options
from sources.kafka.offsets import from_json

BS = {"kafka.bootstrap.servers": "127.0.0.1:9"}
TOO_BIG = 2**63


def refused(option: str, value: str, *, streaming: bool, **kw: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_options({**BS, "subscribe": "orders", option: value, **kw}, streaming=streaming)
    return info.value


# ---- 1. offsets beyond a Kafka long, negative offsets other than -1/-2 ---------------------


@pytest.mark.parametrize(
    ("option", "streaming"),
    [("startingOffsets", True), ("startingOffsets", False), ("endingOffsets", False)],
)
def test_offset_above_int64_refused_naming_option_topic_partition_value(option: str, streaming: bool) -> None:
    err = refused(option, f'{{"orders":{{"3":{TOO_BIG}}}}}', streaming=streaming)
    assert err.option == option
    text = str(err)
    assert f"'{option}'" in text and "orders" in text and "partition 3" in text and str(TOO_BIG) in text


def test_largest_long_offset_accepted() -> None:
    o = parse_options({**BS, "subscribe": "t", "startingOffsets": f'{{"t":{{"0":{TOO_BIG - 1}}}}}'}, streaming=True)
    assert o.starting_offsets is not None


@pytest.mark.parametrize(
    ("option", "value", "streaming"),
    [
        ("startingOffsets", -3, True),
        ("startingOffsets", -(2**63), True),
        ("endingOffsets", -7, False),
        ("startingOffsets", -3, False),
    ],
)
def test_negative_offsets_other_than_sentinels_refused(option: str, value: int, streaming: bool) -> None:
    err = refused(option, f'{{"orders":{{"0":{value}}}}}', streaming=streaming)
    assert err.option == option
    assert "orders-0" in str(err) and str(value) in str(err)


def test_partition_number_above_int32_refused() -> None:
    err = refused("startingOffsets", f'{{"orders":{{"{2**31}":5}}}}', streaming=True)
    assert err.option == "startingOffsets" and str(2**31) in str(err)


def test_timestamps_above_int64_refused() -> None:
    for option, streaming in (("startingTimestamp", True), ("endingTimestamp", False)):
        err = refused(option, str(TOO_BIG), streaming=streaming)
        assert err.option == option and str(TOO_BIG) in str(err)
    err = refused("startingOffsetsByTimestamp", f'{{"orders":{{"0":{TOO_BIG}}}}}', streaming=True)
    assert err.option == "startingOffsetsByTimestamp" and "partition 0" in str(err)


def test_checkpointed_offsets_above_int64_refused() -> None:
    with pytest.raises(ConfigError, match=f"t-0 is {TOO_BIG}"):
        from_json({"t": {"0": TOO_BIG}}, what="batch 4's end offsets")


# ---- 3. no secret in the repr or str of the options or of a pipeline's config ----------------

SECRETS = {
    "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="jaas-Pw-77";',
    "kafka.ssl.key.password": "keyPw-88",
    "kafka.sasl.password": "saslPw-99",
    "kafka.ssl.keystore.password": "storePw-11",
    "kafka.ssl.truststore.password": "trustPw-22",
    "kafka.sasl.oauthbearer.client.secret": "oauthSecret-33",
    "kafka.ssl.keystore.key": "-----BEGIN PRIVATE KEY-----pemKey-44",
}
SECRET_WORDS = ("jaas-Pw-77", "keyPw-88", "saslPw-99", "storePw-11", "trustPw-22", "oauthSecret-33", "pemKey-44")


def test_kafka_options_repr_hides_secrets() -> None:
    from sources.kafka.option_specs import KafkaSourceOptions

    o = KafkaSourceOptions(subscribe=("t",), kafka={**BS, **SECRETS, "kafka.sasl.username": "alice"})
    for text in (repr(o), str(o), f"{o}"):
        for word in SECRET_WORDS:
            assert word not in text
        assert "alice" in text and "127.0.0.1:9" in text and "kafka.sasl.jaas.config" in text


def test_pipeline_config_repr_hides_secrets() -> None:
    from connectors.pipelines.config import PipelineConfig

    cfg = PipelineConfig(
        pipeline="ledger",
        bootstrap="127.0.0.1:9092",
        topic="payments",
        dsn="postgresql://app:dsnPw-55@db:5432/ledger",
        table="ledger",
        checkpoint="/tmp/ck",
        source_options=dict(SECRETS),
        sink_options={"password": "sinkPw-66", "dsn": "host=db password=sinkDsnPw-67"},
        spark_conf={"spark.hadoop.fs.s3a.secret.key": "s3Secret-12", "spark.sql.shuffle.partitions": "2"},
    )
    for text in (repr(cfg), str(cfg)):
        for word in (*SECRET_WORDS, "dsnPw-55", "sinkPw-66", "sinkDsnPw-67", "s3Secret-12"):
            assert word not in text
        assert "payments" in text and "db:5432" in text and "spark.sql.shuffle.partitions" in text


# ---- 4. the batch reader closes its driver client whatever planning does ---------------------


class _Meta:
    def __init__(self, topics: dict) -> None:
        self.topics = topics


class _FakeConsumer:
    """A cluster that answers and holds no topic at all; counts what the source opens and closes."""

    opened = 0
    closed = 0

    def __init__(self, conf: dict) -> None:
        type(self).opened += 1

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> _Meta:
        from confluent_kafka import KafkaError

        class T:
            error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            partitions: dict = {}

        return _Meta({topic: T()} if topic else {})

    def close(self) -> None:
        type(self).closed += 1


def test_batch_reader_closes_its_client_when_planning_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from sources.kafka.readers import KafkaBatchReader

    monkeypatch.setattr(kafka_clients, "Consumer", _FakeConsumer)
    monkeypatch.setattr(_FakeConsumer, "opened", 0)
    monkeypatch.setattr(_FakeConsumer, "closed", 0)
    reader = KafkaBatchReader(parse_options({**BS, "subscribe": "no_such_topic"}, streaming=False))
    with pytest.raises(ConfigError, match="no_such_topic"):
        reader.partitions()
    assert _FakeConsumer.opened == 1
    assert _FakeConsumer.closed == 1
    assert reader.planner.client._consumer is None
