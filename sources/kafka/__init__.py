"""The kafka-eos source: a replayable Kafka source for PySpark with Spark's Kafka options and schema."""

from __future__ import annotations

from sources.kafka.alias import install_kafka_alias, jvm_kafka_available
from sources.kafka.datasource import FORMAT, KafkaBatchReader, KafkaEosDataSource, KafkaStreamReader, kafka_schema
from sources.kafka.offsets import EARLIEST, LATEST, TopicPartition
from sources.kafka.options import OPTIONS, KafkaSourceOptions, parse_options
from sources.kafka.split import KafkaInputPartition, OffsetRange, ReadSettings

__all__ = [
    "EARLIEST",
    "FORMAT",
    "LATEST",
    "OPTIONS",
    "KafkaBatchReader",
    "KafkaEosDataSource",
    "KafkaInputPartition",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "OffsetRange",
    "ReadSettings",
    "TopicPartition",
    "install_kafka_alias",
    "jvm_kafka_available",
    "kafka_schema",
    "parse_options",
]
