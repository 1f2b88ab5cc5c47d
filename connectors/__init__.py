"""spark-eos: exactly-once Kafka -> Spark Structured Streaming -> Postgres connectors."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from connectors.core.errors import CommitUnknown, ConfigError, EosError, FatalError, RetriableError

__all__ = [
    "FORMATS",
    "CommitUnknown",
    "ConfigError",
    "EosError",
    "FatalError",
    "RetriableError",
    "__version__",
    "register",
    "twopc_batch",
    "upsert_batch",
]

try:
    __version__ = metadata.version("spark-eos")
except metadata.PackageNotFoundError:  # imported from a clone that was never installed
    __version__ = "0+unknown"

FORMATS = ("kafka-eos", "postgres-upsert", "postgres-2pc")


def register(spark: Any, *, kafka_alias: bool = False) -> None:
    """Register every spark-eos format with ``spark``.

    With ``kafka_alias=True`` the Python API's ``.format("kafka")`` also resolves to ``kafka-eos``
    when Spark's JVM Kafka connector is absent (SQL ``USING kafka`` cannot be served by Python).
    """
    from sinks.postgres import Postgres2pcDataSource, PostgresUpsertDataSource
    from sources.kafka import KafkaEosDataSource, install_kafka_alias

    for source in (KafkaEosDataSource, PostgresUpsertDataSource, Postgres2pcDataSource):
        spark.dataSource.register(source)
    if kafka_alias:
        install_kafka_alias(spark)


def upsert_batch(**options: Any) -> Any:
    """A ``foreachBatch`` function writing each micro-batch through the idempotent upsert sink."""
    from sinks.postgres import upsert_batch as make

    return make(**options)


def twopc_batch(**options: Any) -> Any:
    """A ``foreachBatch`` function writing each micro-batch through the two-phase sink, keyed by batch id."""
    from sinks.postgres.twophase import twopc_batch as make

    return make(**options)
