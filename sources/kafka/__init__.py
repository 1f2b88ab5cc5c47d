"""The kafka-eos source: a replayable Kafka source for PySpark with Spark's Kafka options and schema."""

from __future__ import annotations

from eos_core.faults import Points
from sources.kafka.alias import install_kafka_alias, jvm_kafka_available
from sources.kafka.datasource import FORMAT, KafkaBatchReader, KafkaEosDataSource, KafkaStreamReader, kafka_schema
from sources.kafka.offsets import EARLIEST, LATEST, TopicPartition
from sources.kafka.options import OPTIONS, KafkaSourceOptions, parse_options
from sources.kafka.split import KafkaInputPartition, OffsetRange, ReadSettings

__all__ = [
    "EARLIEST",
    "FAULT_POINTS",
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

FAULT_POINTS = Points(
    (
        "source.plan",  # driver: latestOffset computed a batch's end offsets (on every trigger)
        "source.read.start",  # a read task, before its first record
        "source.read.mid",  # a read task, half of its range yielded
    ),
    hold="source.read.start",
    # a kill at source.plan lands on any trigger, an idle one too, and one at the start of a read has read
    # nothing: a chaos run kills mid-read
    drawn=("source.read.mid",),
)
"""The fault points ``kafka-eos`` fires when it reads (``eos_core.faults``)."""
