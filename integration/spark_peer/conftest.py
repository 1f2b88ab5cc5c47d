"""The peer run's fixtures: one Spark session with Spark's Kafka connector on its class path, a broker whose
log cleaner acts within a second.

These tests run only in the peer environment (``make peer-venv``: PySpark ``SPARK_KAFKA_VERSION`` from
PyPI, the version of Spark's Kafka connector Maven Central serves); ``make test`` runs them after the main
suite with ``make test-spark-peer``. The main run (PySpark 4.3, for which Maven Central has no connector)
does not collect them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyspark
import pytest

from connectors.services.apache_kafka import ApacheKafka
from connectors.services.spark import local_session
from connectors.services.spark_kafka import SPARK_KAFKA_VERSION, session_conf

if pyspark.__version__ != SPARK_KAFKA_VERSION:
    collect_ignore_glob = ["test_*.py"]  # run by `make test-spark-peer` in .venv-peer, not by the main run


@pytest.fixture(scope="session")
def kafka_service() -> Iterator[ApacheKafka]:
    """The embedded Apache Kafka, its log cleaner looking for work 5 times a second (the compacted-topic case)."""
    with ApacheKafka(config={"log.cleaner.backoff.ms": "200", "log.cleaner.dedupe.buffer.size": str(8 << 20)}) as k:
        yield k


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One session for the whole run: format("kafka") (Spark's connector jars) and format("kafka-eos")."""
    session = local_session("spark-eos-peer", **session_conf(avro=True))  # from_avro: test_avro_differential.py
    try:
        yield session
    finally:
        session.stop()
