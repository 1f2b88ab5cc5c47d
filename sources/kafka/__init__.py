"""The kafka-eos source: a replayable Kafka source for PySpark with Spark's Kafka options and schema."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eos_core import lazy
from eos_core.faults import Points

if TYPE_CHECKING:
    from sources.kafka.alias import install_kafka_alias, jvm_kafka_available
    from sources.kafka.datasource import FORMAT, KafkaEosDataSource, kafka_schema
    from sources.kafka.offsets import EARLIEST, LATEST, TopicPartition
    from sources.kafka.options import OPTIONS, KafkaSourceOptions, parse_options
    from sources.kafka.readers import KafkaBatchReader, KafkaStreamReader
    from sources.kafka.split import KafkaInputPartition, OffsetRange, ReadSettings

# each name imported when first asked for (eos_core.lazy): Spark's planner processes import this package on
# the way to the data source's class (sources.kafka.datasource) and need nothing else of it; a read imports
# the readers, the planner and confluent-kafka itself
__getattr__ = lazy.exports(
    __name__,
    {
        "install_kafka_alias": "sources.kafka.alias",
        "jvm_kafka_available": "sources.kafka.alias",
        "FORMAT": "sources.kafka.datasource",
        "KafkaEosDataSource": "sources.kafka.datasource",
        "kafka_schema": "sources.kafka.datasource",
        "EARLIEST": "sources.kafka.offsets",
        "LATEST": "sources.kafka.offsets",
        "TopicPartition": "sources.kafka.offsets",
        "OPTIONS": "sources.kafka.options",
        "KafkaSourceOptions": "sources.kafka.options",
        "parse_options": "sources.kafka.options",
        "KafkaBatchReader": "sources.kafka.readers",
        "KafkaStreamReader": "sources.kafka.readers",
        "KafkaInputPartition": "sources.kafka.split",
        "OffsetRange": "sources.kafka.split",
        "ReadSettings": "sources.kafka.split",
    },
)


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
