"""Pinned container images, the one place for their tags (docker/compose.yaml and the container provider)."""

from __future__ import annotations

__all__ = ["KAFKA_IMAGE", "POSTGRES_IMAGE", "POSTGRES_MAX_PREPARED_TRANSACTIONS"]

# Apache Kafka in KRaft mode (no ZooKeeper), single node. Keep in step with docker/compose.yaml.
KAFKA_IMAGE = "apache/kafka:3.9.1"
# PostgreSQL started with -c max_prepared_transactions=64 (2PC). Keep in step with docker/compose.yaml.
POSTGRES_IMAGE = "postgres:16.9"
POSTGRES_MAX_PREPARED_TRANSACTIONS = 64
