"""Pinned container images, the one place for their tags (docker/compose.yaml and the container provider)."""

from __future__ import annotations

__all__ = ["KAFKA_IMAGE", "POSTGRES_IMAGE", "POSTGRES_MAX_PREPARED_TRANSACTIONS"]

# Apache Kafka in KRaft mode (no ZooKeeper), single node: the same version as the embedded broker
# (connectors/services/apache_kafka.py KAFKA_VERSION). apache/kafka tags are the bare release
# version (3.9.1, 4.0.0, ...), one per Apache Kafka release. Keep in step with docker/compose.yaml.
KAFKA_IMAGE = "apache/kafka:4.4.0"
# PostgreSQL started with -c max_prepared_transactions=64 (2PC). Keep in step with docker/compose.yaml.
POSTGRES_IMAGE = "postgres:16.9"
POSTGRES_MAX_PREPARED_TRANSACTIONS = 64
