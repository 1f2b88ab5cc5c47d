"""Opt-in shim: the Python API's .format("kafka") resolves to kafka-eos when Spark's JVM Kafka source is absent."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from eos_core.errors import ConfigError
from eos_core.spark_connect import over_connect

__all__ = ["install_kafka_alias", "jvm_kafka_available"]

log = logging.getLogger(__name__)

_SESSIONS: weakref.WeakSet[Any] = weakref.WeakSet()
_PATCHED = False


def jvm_kafka_available(spark: Any) -> bool:
    """True when Spark's own Kafka connector (spark-sql-kafka-0-10) is on the driver's class path."""
    try:
        spark._jvm.java.lang.Class.forName("org.apache.spark.sql.kafka010.KafkaSourceProvider")
        return True
    except Exception:  # no class, or no JVM gateway (Spark Connect): treat as absent
        return False


def install_kafka_alias(spark: Any) -> bool:
    """Make ``spark.read/readStream.format("kafka")`` use kafka-eos for this session.

    Returns False (and changes nothing) when Spark's JVM Kafka connector is present. Only the
    Python DataFrameReader/DataStreamReader are redirected: SQL ``USING kafka`` and other
    languages still look up the JVM source, which Python cannot serve.
    """
    global _PATCHED
    if over_connect(spark):
        raise ConfigError(
            "kafka_alias=True: format('kafka') cannot be redirected to kafka-eos on a Spark Connect session (the "
            "alias patches the classic session's Python readers; over Connect the server resolves the format). "
            "Write .format('kafka-eos') with the same options, and register without kafka_alias",
            option="kafka_alias",
        )
    if jvm_kafka_available(spark):
        log.info("kafka-eos: Spark's JVM Kafka connector is present; format('kafka') left to it")
        return False
    _SESSIONS.add(spark)
    if not _PATCHED:
        from pyspark.sql.readwriter import DataFrameReader
        from pyspark.sql.streaming.readwriter import DataStreamReader

        for cls in (DataFrameReader, DataStreamReader):
            _wrap(cls)
        _PATCHED = True
    return True


def _wrap(cls: Any) -> None:
    original = cls.format

    def format(self: Any, source: str) -> Any:
        if isinstance(source, str) and source.lower() == "kafka" and getattr(self, "_spark", None) in _SESSIONS:
            source = "kafka-eos"
        return original(self, source)

    format.__doc__ = original.__doc__
    format.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, "format", format)  # noqa: B010 - patching a class attribute on purpose
