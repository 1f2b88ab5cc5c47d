"""spark-eos: exactly-once Kafka -> Spark Structured Streaming -> Postgres connectors."""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

from eos_core.errors import CommitUnknown, ConfigError, EosError, FatalError, RetriableError, error_cause
from eos_core.kafka_config import SECRET_NAME_PATTERN

__all__ = [
    "FORMATS",
    "CommitUnknown",
    "ConfigError",
    "EosError",
    "FatalError",
    "RetriableError",
    "__version__",
    "error_cause",
    "kafka_batch",
    "kafka_options",
    "postgres_options",
    "query_error",
    "redact_secrets",
    "register",
    "twopc_batch",
    "upsert_batch",
]

try:
    __version__ = metadata.version("spark-eos")
except metadata.PackageNotFoundError:  # imported from a clone that was never installed
    __version__ = "0+unknown"

query_error = error_cause
"""``connectors.query_error(exc)``: the one-line cause of a failed query (``error_cause``)."""

FORMATS = ("kafka-eos", "postgres-upsert", "postgres-2pc")


REDACTED_OPTIONS = r"(?i)^(?:dsn|url|password|sslpassword)$|" + SECRET_NAME_PATTERN
"""Option keys whose values Spark hides in plans (``spark.sql.redaction.options.regex``): the sinks' ``dsn``,
``url`` (its alias; Spark's default hides it too, but a regex the user sets replaces that default) and
``password``, and every name ``eos_core.kafka_config`` takes for a secret (``kafka.sasl.jaas.config``, inline
PEM keys ``kafka.ssl.key.pem`` and ``kafka.ssl.keystore.key``, passwords, tokens)."""

REDACTED_STRINGS = (
    r"(?i)postgres(?:ql)?://[^:/@\s]*:[^@\s]*@|password\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S+)"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
)
"""What Spark hides in any plan text it prints (``spark.sql.redaction.string.regex``): the
``user:password@`` of a Postgres URL, a keyword ``password=...`` and a PEM private key."""

_OPTIONS_REGEX = "spark.sql.redaction.options.regex"
_STRING_REGEX = "spark.sql.redaction.string.regex"
_CORE_STRING_REGEX = "spark.redaction.string.regex"  # what the SQL conf falls back to when unset
_SPARK_OPTIONS_DEFAULT = "(?i)url"  # spark.sql.redaction.options.regex when the user set none


def register(spark: Any, *, kafka_alias: bool = False) -> None:
    """Register every spark-eos format with ``spark``, and have its plans hide Postgres passwords.

    Spark prints a sink's options in its plans (``explain``, the SQL page, the event log, a failed
    query's message) and by default hides only keys matching ``url`` or ``password``-like words;
    ``register`` extends the session's redaction (both are SQL confs a running session may change,
    read when a plan is printed; a streaming query copies them when it starts) so that the values
    of the ``dsn`` and ``password`` options and a ``postgresql://user:password@`` anywhere in a plan
    are shown as ``*********(redacted)``. A regex you set yourself is kept (ours is added to it).

    With ``kafka_alias=True`` the Python API's ``.format("kafka")`` also resolves to ``kafka-eos``
    when Spark's JVM Kafka connector is absent (SQL ``USING kafka`` cannot be served by Python).
    """
    from sinks.postgres import Postgres2pcDataSource, PostgresUpsertDataSource
    from sources.kafka import KafkaEosDataSource, install_kafka_alias

    for source in (KafkaEosDataSource, PostgresUpsertDataSource, Postgres2pcDataSource):
        spark.dataSource.register(source)
    redact_secrets(spark)
    if kafka_alias:
        install_kafka_alias(spark)


def redact_secrets(spark: Any) -> None:
    """Add ``REDACTED_OPTIONS`` and ``REDACTED_STRINGS`` to the session's redaction regexes (idempotent)."""
    for key, ours in ((_OPTIONS_REGEX, REDACTED_OPTIONS), (_STRING_REGEX, REDACTED_STRINGS)):
        current = spark.conf.get(key, None)
        if not current and key == _OPTIONS_REGEX:
            current = _SPARK_OPTIONS_DEFAULT  # unset: Spark's default hides url options; keep it hiding them
        if not current and key == _STRING_REGEX:
            current = _core_conf(spark, _CORE_STRING_REGEX)
        if current and ours in current:
            continue
        spark.conf.set(key, f"{current}|{ours}" if current else ours)


def _core_conf(spark: Any, key: str) -> str | None:
    try:
        return spark.sparkContext.getConf().get(key)  # type: ignore[no-any-return]
    except Exception:  # Spark Connect has no SparkContext: the SQL conf is all there is
        return None


def postgres_options(dsn: str) -> dict[str, str]:
    """The sink options for ``dsn`` with its password moved to the ``password`` option, which Spark
    redacts by key: ``.options(**connectors.postgres_options(os.environ["PG_DSN"]))``."""
    from sinks.postgres.connection import postgres_options as split

    return split(dsn)


def kafka_options(bootstrap: str, config: str | None = None) -> dict[str, str]:
    """The ``kafka.*`` options of a secured cluster from a Java client properties file (``config``, else the
    file ``EOS_KAFKA_CONFIG`` names, e.g. ``spark-eos services env``'s; else only the bootstrap):
    ``.options(**connectors.kafka_options(os.environ["EOS_KAFKA_BOOTSTRAP"]))``. Spark hides the secrets
    among them (``kafka.sasl.jaas.config``, passwords, PEM keys) once ``register`` ran."""
    from eos_core.kafka_config import CONFIG_ENV
    from eos_core.kafka_config import kafka_options as options

    return options(bootstrap, config or os.environ.get(CONFIG_ENV))


def upsert_batch(**options: Any) -> Any:
    """A ``foreachBatch`` function writing each micro-batch through the idempotent upsert sink."""
    from sinks.postgres import upsert_batch as make

    return make(**options)


def kafka_batch(**options: Any) -> Any:
    """A ``foreachBatch`` function writing each micro-batch exactly once into Kafka (the ``kafka-eos`` sink)."""
    from sinks.kafka import kafka_batch as make
    from sources.kafka import KafkaEosDataSource

    return make(KafkaEosDataSource, **options)


def twopc_batch(**options: Any) -> Any:
    """A ``foreachBatch`` function writing each micro-batch through the two-phase sink, keyed by batch id."""
    from sinks.postgres.twophase import twopc_batch as make

    return make(**options)
