"""Services the user names through environment variables: checked, reused, never started or stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from connectors.services.base import KafkaService, PostgresService, redact_dsn
from eos_core.conninfo import conninfo_error
from eos_core.errors import ServiceError
from eos_core.kafka_config import client_settings

__all__ = [
    "KAFKA_ENV",
    "POSTGRES_ENV",
    "EnvKafka",
    "EnvPostgres",
    "broker_is_tansu",
    "check_postgres",
    "env_timeout",
    "tansu_cluster",
]

KAFKA_ENV = "EOS_KAFKA_BOOTSTRAP"
POSTGRES_ENV = "EOS_POSTGRES_DSN"
TIMEOUT_ENV = "EOS_SERVICE_TIMEOUT"


def env_timeout(default: float = 15.0) -> float:
    """Seconds to wait for a named service (``EOS_SERVICE_TIMEOUT``, default 15)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ServiceError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds (e.g. {TIMEOUT_ENV}=30)") from None
    if value <= 0:
        raise ServiceError(f"{TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


class EnvKafka(KafkaService):
    """The broker at ``bootstrap`` (from ``EOS_KAFKA_BOOTSTRAP``), checked for reachability."""

    kind = "env"

    def __init__(self, bootstrap: str, *, timeout: float | None = None, source: str = KAFKA_ENV) -> None:
        from connectors.services.embedded_kafka import kafka_reachable

        if not bootstrap.strip():
            raise ServiceError(f"{source} is set but empty; give host:port of a Kafka broker or unset it")
        self.bootstrap = bootstrap.strip()
        wait = env_timeout() if timeout is None else timeout
        ok, last, cluster = kafka_reachable(self.bootstrap, wait, client_settings())  # EOS_KAFKA_CONFIG's security
        if not ok:
            raise ServiceError(
                f"{source}={self.bootstrap!r}: no Kafka broker answered within {wait:.0f}s ({last}). Start the broker, "
                f"fix the address, or unset {source} to let spark-eos start its own.",
                bootstrap=self.bootstrap,
            )
        self.is_tansu = tansu_cluster(cluster)
        self.cluster_id = cluster

    def client_config(self) -> dict[str, str]:
        """The security settings of ``EOS_KAFKA_CONFIG`` (librdkafka's names), none without it."""
        return client_settings()

    def java_config(self) -> dict[str, str]:
        from eos_core.kafka_config import CONFIG_ENV, read_properties

        named = os.environ.get(CONFIG_ENV)
        return {k: v for k, v in read_properties(named).items() if k != "bootstrap.servers"} if named else {}

    def client_properties(self) -> Path | None:
        from eos_core.kafka_config import CONFIG_ENV

        named = os.environ.get(CONFIG_ENV)
        return Path(named) if named else None


def tansu_cluster(cluster_id: str | None) -> bool:
    """Whether a broker with ``cluster_id`` is tansu: its default cluster id is "tansu_cluster";
    ``EOS_KAFKA_IS_TANSU=0/1`` overrides the guess."""
    forced = os.environ.get("EOS_KAFKA_IS_TANSU")
    return forced == "1" if forced in ("0", "1") else str(cluster_id or "").startswith("tansu")


def broker_is_tansu(client: Any, timeout: float = 10.0) -> bool:
    """Whether the broker a confluent-kafka ``client`` (Producer, AdminClient) talks to is tansu,
    whose high watermark is the base offset of the last record batch + 1: producers for it end each
    partition with a one-record batch so every record is below the watermark. Apache Kafka needs no
    such thing."""
    return tansu_cluster(client.list_topics(timeout=timeout).cluster_id)


def check_postgres(dsn: str, *, timeout: float, source: str = POSTGRES_ENV) -> int:
    """Wait until ``dsn`` accepts connections; require ``max_prepared_transactions`` > 0; return the port."""
    import psycopg
    import psycopg.conninfo

    from connectors.services.embedded_postgres import postgres_ready

    shown = redact_dsn(dsn)
    bad = None
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        bad = conninfo_error(dsn, option=source, context=source)  # libpq's text can quote the password
    if bad is not None:
        raise ServiceError(f"{source}={shown!r} is not a valid libpq DSN: {bad}")
    ok, last = postgres_ready(dsn, timeout)
    if not ok:
        raise ServiceError(
            f"{source}={shown!r}: Postgres did not accept connections within {timeout:.0f}s ({last}). Start it, "
            f"fix the DSN, or unset {source} to let spark-eos start its own.",
            dsn=shown,
        )
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    mpt = int(row[0]) if row else 0
    if mpt <= 0:
        raise ServiceError(
            f"{source}={shown!r}: max_prepared_transactions is {mpt}, so two-phase commit (PREPARE TRANSACTION) is "
            "disabled. Set it to at least the number of writer tasks, e.g. 64: "
            "'ALTER SYSTEM SET max_prepared_transactions = 64' and restart the server, or start it with "
            "'-c max_prepared_transactions=64' (docker: command: postgres -c max_prepared_transactions=64; a managed "
            "Postgres: docs/deployment.md#managed-postgres).",
            dsn=shown,
            max_prepared_transactions=mpt,
        )
    return int(str(params.get("port") or 5432).split(",")[0])


class EnvPostgres(PostgresService):
    """The server at ``dsn`` (from ``EOS_POSTGRES_DSN``), checked for reachability and 2PC support."""

    kind = "env"

    def __init__(self, dsn: str, *, timeout: float | None = None, source: str = POSTGRES_ENV) -> None:
        if not dsn.strip():
            raise ServiceError(
                f"{source} is set but empty; give a libpq DSN (postgresql://user:pw@host:port/db) or unset it"
            )
        self.dsn = dsn.strip()
        self.port = check_postgres(self.dsn, timeout=env_timeout() if timeout is None else timeout, source=source)
