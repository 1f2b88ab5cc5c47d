"""The Java client's settings as librdkafka's for the Kafka sink's producers (the source's consumers:
tests/test_kafka_source.py)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer

from eos_core.errors import ConfigError
from eos_core.kafka_config import admin_config, client_config, redact_options


def producer(**kafka: str) -> dict[str, str]:
    return client_config({"kafka." + k: v for k, v in kafka.items()}, role="producer", context="kafka-eos sink")


def test_java_producer_settings_map_to_librdkafka(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="sinks.kafka.options"):
        conf = producer(
            **{
                "bootstrap.servers": "127.0.0.1:1",
                "max.request.size": "2097152",
                "buffer.memory": "33554433",
                "linger.ms": "5",
                "compression.type": "zstd",
                "request.timeout.ms": "20000",
                "partitioner.class": "org.apache.kafka.clients.producer.internals.DefaultPartitioner",
                "max.block.ms": "1000",
                "group.id": "shared-with-the-source",
                "isolation.level": "read_committed",
                "acks": "all",
            }
        )
    assert conf["message.max.bytes"] == "2097152"
    assert conf["queue.buffering.max.kbytes"] == "32769"  # bytes rounded up to kB
    assert conf["partitioner"] == "murmur2_random"
    assert conf["request.timeout.ms"] == "20000"  # a producer's own, not the consumer's socket.timeout.ms
    assert "group.id" not in conf and "isolation.level" not in conf and "max.block.ms" not in conf
    said = caplog.text
    assert "kafka.group.id: a consumer (Kafka source) setting" in said and "kafka.max.block.ms" in said
    Producer(conf)  # every mapped name is one librdkafka knows


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("transactional.id", "mine", "derives its transactional ids from option 'sink.id'"),
        ("acks", "1", "needs acks=all"),
        ("enable.idempotence", "false", "idempotent producer"),
        ("partitioner.class", "org.apache.kafka.clients.producer.RoundRobinPartitioner", "kafka.partitioner"),
        ("buffer.memory", "lots", "number of bytes"),
    ],
)
def test_settings_that_would_break_exactly_once_are_refused_naming_them(setting: str, value: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as err:
        producer(**{setting: value})
    assert err.value.option == "kafka." + setting and str(err.value).startswith("kafka-eos sink: ")


def test_secrets_are_mapped_but_never_shown() -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret";'
    conf = producer(**{"sasl.jaas.config": jaas, "sasl.mechanism": "PLAIN"})
    assert conf["sasl.username"] == "u" and conf["sasl.password"] == "s3cret" and conf["sasl.mechanisms"] == "PLAIN"
    assert "s3cret" not in repr(redact_options({"kafka.sasl.jaas.config": jaas}))


def test_an_admin_client_gets_the_connection_and_security_settings_of_either_role(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    common = {
        "bootstrap.servers": "127.0.0.1:9",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "pw",
    }
    consumer = {**common, "group.id": "g", "isolation.level": "read_committed", "fetch.wait.max.ms": "500"}
    producer = {
        **common,
        "acks": "all",
        "linger.ms": "5",
        "transactional.id": "t",
        "sticky.partitioning.linger.ms": "0",
    }
    assert admin_config(consumer) == common == admin_config(producer)
    # the sink's marker reads make a consumer from its producer settings: nothing librdkafka warns of is left
    Consumer({**admin_config({**producer, "log_level": 0}), "group.id": "m", "log_level": 0}).close()
    AdminClient({**admin_config(consumer), "log_level": 0})
    assert "ignored" not in capsys.readouterr().err


def test_a_read_drops_a_producers_librdkafka_names_and_a_write_a_consumers() -> None:
    read = client_config({"kafka.sticky.partitioning.linger.ms": "0"}, role="consumer", context="kafka-eos")
    write = client_config({"kafka.fetch.message.max.bytes": "1048576"}, role="producer", context="kafka-eos sink")
    assert read == {} and write == {}
