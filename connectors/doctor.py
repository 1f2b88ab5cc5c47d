"""``spark-eos doctor``'s checks: a connector's options -> the ACLs and privileges it declares (each connector's
``privileges`` module) -> what the given principal and role hold, and the settings exactly-once needs.

- Kafka ACLs are asked of the cluster (DescribeAcls): with the principal's own settings when it may describe
  the cluster's ACLs, else with an admin's (``admin`` settings, ``--admin-config``); when neither may, each ACL
  is ``unchecked`` (never passed as held).
- Postgres privileges are asked of the server as the role itself (``has_*_privilege``), as the sinks ask at
  start (``sinks.postgres.privileges.missing_grants``).
- Settings: ``max_prepared_transactions`` (postgres-2pc), the broker's ``transaction.max.timeout.ms`` against the
  sink's ``kafka.transaction.timeout.ms``, the staging topic's ``max.message.bytes`` against the output topic's,
  and ``offsets.retention.minutes``: how long a stopped Kafka sink's markers outlive it.

Each finding says what is missing and the command that grants or sets it; ``Finding.status`` is ``ok``,
``missing``, ``warn`` or ``unchecked``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eos_core import kafka_clients
from eos_core.errors import ConfigError, EosError
from eos_core.kafka_config import admin_config, client_config
from eos_core.privileges import AclBinding, KafkaAcl, PgGrant, acl_command, acl_held, grant_command

__all__ = ["CONNECTORS", "Finding", "check", "needs"]

CONNECTORS = ("kafka-eos", "kafka-eos-sink", "postgres-upsert", "postgres-2pc")
_TIMEOUT = 10.0


@dataclass(frozen=True)
class Finding:
    status: str  # ok | missing | warn | unchecked
    what: str
    detail: str = ""
    fix: str = ""


def needs(connector: str, options: Mapping[str, str]) -> tuple[list[KafkaAcl], list[PgGrant], Any]:
    """The ACLs and grants ``connector`` declares for ``options`` (parsed as the connector parses them), and the
    parsed options."""
    raw = dict(options)
    if connector == "kafka-eos":
        from sources.kafka.options import parse_options
        from sources.kafka.privileges import source_acls

        src = parse_options(raw, streaming=True)
        return source_acls(src), [], src
    if connector == "kafka-eos-sink":
        from sinks.kafka.options import parse_options as sink_options
        from sinks.kafka.privileges import sink_acls

        sink = sink_options({"batch.id": "0", **raw}, streaming=False)
        return sink_acls(sink), [], sink
    if connector == "postgres-upsert":
        from sinks.postgres.options import UpsertOptions
        from sinks.postgres.privileges import upsert_grants

        up = UpsertOptions.from_options(raw)
        return [], upsert_grants(up), up
    if connector == "postgres-2pc":
        from sinks.postgres.privileges import twophase_grants
        from sinks.postgres.twophase.options import TwoPhaseOptions

        tp = TwoPhaseOptions.from_options(raw)
        return [], twophase_grants(tp, complete=raw.get("outputMode", "") == "complete"), tp
    raise ConfigError(f"spark-eos doctor: unknown connector {connector!r}; one of {', '.join(CONNECTORS)}")


def check(
    connector: str,
    options: Mapping[str, str],
    *,
    kafka: Mapping[str, str] | None = None,
    admin: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Every finding for ``connector`` with ``options``. ``kafka``: the principal's librdkafka settings (the
    ``kafka.*`` options, mapped, are added); ``admin``: an admin's, for DescribeAcls and the broker's configs."""
    acls, grants, opts = needs(connector, options)
    found: list[Finding] = []
    if acls:
        java = {k: v for k, v in options.items() if k.startswith("kafka.")}
        mapped = client_config(
            java, role="producer" if connector == "kafka-eos-sink" else "consumer", context="spark-eos doctor"
        )
        settings = {**(kafka or {}), **admin_config(mapped)}
        found += _kafka_acls(acls, settings, admin)
        found += _kafka_settings(connector, opts, settings, admin)
    if grants:
        found += _postgres(grants, opts, connector == "postgres-2pc")
    return found


# -- Kafka -------------------------------------------------------------------------------------------------


def _admin(settings: Mapping[str, Any]) -> Any:
    watch = kafka_clients.Watch(settings, "spark-eos doctor")
    client = kafka_clients.admin(dict(settings), watch)
    kafka_clients.connect(client, watch, _TIMEOUT)
    return client


def _bindings(settings: Mapping[str, Any], principal: str) -> list[AclBinding] | str:
    """The ACLs of ``principal`` and of ``User:*`` (DescribeAcls), or why they could not be listed."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {
        ResourceType.TOPIC: "topic",
        ResourceType.GROUP: "group",
        ResourceType.TRANSACTIONAL_ID: "transactional_id",
        ResourceType.BROKER: "cluster",
    }
    out: list[AclBinding] = []
    try:
        client = _admin(settings)
        for who in (f"User:{principal}", "User:*"):
            query = AclBindingFilter(
                ResourceType.ANY,
                None,  # type: ignore[arg-type]  # any name
                ResourcePatternType.ANY,
                who,
                None,  # type: ignore[arg-type]  # any host
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
            for b in client.describe_acls(query, request_timeout=_TIMEOUT).result(timeout=_TIMEOUT + 5):
                if b.restype not in kinds:
                    continue
                out.append(
                    AclBinding(
                        kinds[b.restype],
                        b.name,
                        b.resource_pattern_type == ResourcePatternType.PREFIXED,
                        b.principal,
                        b.operation.name,
                        b.permission_type.name,
                    )
                )
    except KafkaException as exc:
        return str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
    return out


def _kafka_acls(
    acls: Sequence[KafkaAcl], settings: Mapping[str, Any], admin: Mapping[str, Any] | None
) -> list[Finding]:
    principal = kafka_clients.principal(settings)
    where = str(settings.get("bootstrap.servers", "<bootstrap>"))
    # Kafka answers DescribeAcls of a principal that may not describe the cluster with no ACLs rather than an
    # error: a listing of its own proves what it holds, never what it lacks; an admin's listing proves both
    listed = _bindings({**admin, "bootstrap.servers": where}, principal) if admin else _bindings(settings, principal)
    found = []
    for a in acls:
        what = f"Kafka: User:{principal} {a.describe()}"
        if isinstance(listed, str) or (not admin and not acl_held(a, listed, principal)):
            why = f"could not be listed: {listed}" if isinstance(listed, str) else "were listed as the principal"
            found.append(
                Finding(
                    "unchecked",
                    what,
                    f"the cluster's ACLs {why}; give --admin-config, the properties of a principal that may describe "
                    "them, to know what it lacks",
                    acl_command(a, principal, where),
                )
            )
        elif acl_held(a, listed, principal):
            found.append(Finding("ok", what, a.why))
        else:
            found.append(Finding("missing", what, a.why, acl_command(a, principal, where)))
    return found


def _broker_config(settings: Mapping[str, Any], admin: Mapping[str, Any] | None) -> dict[str, str] | str:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    last = ""
    for who in (settings, {**admin, "bootstrap.servers": settings.get("bootstrap.servers")} if admin else None):
        if who is None:
            continue
        try:
            client = _admin(who)
            broker = next(iter(client.list_topics(timeout=_TIMEOUT).brokers))
            futures = client.describe_configs(
                [ConfigResource(ResourceType.BROKER, str(broker))], request_timeout=_TIMEOUT
            )
            entries = next(iter(futures.values())).result(timeout=_TIMEOUT + 5)
            return {k: str(v.value) for k, v in entries.items() if v.value is not None}
        except KafkaException as exc:
            last = str(exc)
    return last or "no broker"


def _kafka_settings(
    connector: str, opts: Any, settings: Mapping[str, Any], admin: Mapping[str, Any] | None
) -> list[Finding]:
    if connector != "kafka-eos-sink":
        return []
    from sinks.kafka.client import KafkaLookups
    from sinks.kafka.privileges import staging_size

    found: list[Finding] = []
    where = str(settings.get("bootstrap.servers", "<bootstrap>"))
    broker = _broker_config(settings, admin)
    wanted = opts.transaction_timeout_ms
    if isinstance(broker, str):
        found.append(
            Finding("unchecked", "Kafka: the broker's transaction.max.timeout.ms and offsets.retention.minutes", broker)
        )
    else:
        most = int(broker.get("transaction.max.timeout.ms", "900000"))
        status = "ok" if most >= wanted else "missing"
        found.append(
            Finding(
                status,
                f"Kafka: transaction.max.timeout.ms {most} >= kafka.transaction.timeout.ms {wanted}",
                "a transaction may last as long as the sink asks",
                ""
                if status == "ok"
                else "lower kafka.transaction.timeout.ms, or raise the brokers' transaction.max.timeout.ms",
            )
        )
        minutes = int(broker.get("offsets.retention.minutes", "10080"))
        found.append(
            Finding(
                "warn",
                f"Kafka: offsets.retention.minutes {minutes} ({minutes / 1440:g} days)",
                "the sink's markers are committed offsets: a sink stopped longer than this loses them, and its next "
                "start cannot tell what it wrote (it refuses a replay it cannot prove). Raise it for longer stops",
            )
        )
    if opts.visibility == "batch" and opts.topic:
        lookups = KafkaLookups(dict(settings), timeout=_TIMEOUT, context="spark-eos doctor")
        try:
            limits = lookups.limits([opts.topic, opts.staging_topic])
        except Exception as exc:  # the ACL rows above say what is missing; this one says what could not be read
            found.append(Finding("unchecked", "Kafka: max.message.bytes of the topic and the staging topic", str(exc)))
            return found
        target, staging = limits[opts.topic], limits[opts.staging_topic]
        if target is not None and staging is not None:
            need = staging_size(target.max_message_bytes)
            ok = staging.max_message_bytes >= need
            found.append(
                Finding(
                    "ok" if ok else "missing",
                    f"Kafka: staging topic {opts.staging_topic!r} max.message.bytes {staging.max_message_bytes} >= {need}",
                    "every record the output topic takes must fit with the staging header",
                    ""
                    if ok
                    else f"kafka-configs.sh --bootstrap-server {where} --command-config admin.properties --alter "
                    f"--entity-type topics --entity-name '{opts.staging_topic}' --add-config max.message.bytes={need}",
                )
            )
    return found


# -- Postgres ----------------------------------------------------------------------------------------------


def _postgres(grants: Sequence[PgGrant], opts: Any, twophase: bool) -> list[Finding]:
    from sinks.postgres.connection import close_quietly, connect
    from sinks.postgres.privileges import missing_grants

    try:
        conn = connect(opts.connection, autocommit=True, application_name="spark-eos doctor")
    except EosError as exc:  # no login: nothing else can be asked (a missing CONNECT names its GRANT)
        text, _, fix = str(exc).partition(". Grant it: ")
        return [Finding("missing", f"Postgres: log in as the dsn's role: {text}", "", fix)]
    try:
        role, database, ssl = conn.execute(
            "SELECT current_user, current_database(), coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)"
        ).fetchone()  # type: ignore[misc]
        missing = missing_grants(conn, grants)
        found = [
            Finding("missing", f"Postgres: role {role!r} {g.describe()}", g.why, grant_command(g, role, database))
            if g in missing
            else Finding("ok", f"Postgres: role {role!r} {g.describe()}", g.why)
            for g in grants
        ]
        found.append(
            Finding(
                "ok" if ssl else "warn",
                f"Postgres: the connection is {'TLS' if ssl else 'not encrypted'}",
                "" if ssl else "add sslmode=verify-full and sslrootcert to the dsn",
            )
        )
        if twophase:
            n = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])  # type: ignore[index]
            found.append(
                Finding(
                    "ok" if n > 0 else "missing",
                    f"Postgres: max_prepared_transactions {n} > 0",
                    "two-phase commit: one prepared transaction per task of a batch",
                    "" if n > 0 else "ALTER SYSTEM SET max_prepared_transactions = 64; -- then restart the server",
                )
            )
        return found
    finally:
        close_quietly(conn)
