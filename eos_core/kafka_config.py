"""The Java client's settings (Spark's ``kafka.*`` options) as librdkafka's, for the Kafka source and sink.

``client_config(kafka, role=..., context=...)``: a Java setting with a librdkafka equivalent is renamed;
one that changes nothing the role relies on is dropped with a log line saying why; one librdkafka cannot
honour (JKS stores, Java classes) is an error naming the librdkafka setting that replaces it. Values are
never logged (they may be secrets): ``is_secret_option`` and ``redact_options`` say which are.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from eos_core.errors import ConfigError
from eos_core.options import redact, redact_userinfo

__all__ = [
    "CONFIG_ENV",
    "SECRET_NAME_PATTERN",
    "Role",
    "admin_config",
    "client_config",
    "client_settings",
    "is_secret_option",
    "read_properties",
    "redact_options",
    "redacted_repr",
]

Role = Literal["consumer", "producer"]

# Option names whose values are secrets (Kafka's, librdkafka's, Spark's, Hadoop's, libpq's): passwords,
# JAAS configs (they embed the password), keys, tokens, PEM contents, a Schema Registry's basic auth user info
# (user:password). Matching more than the truth is fine.
SECRET_NAME_PATTERN = (
    r"pass(?:word|wd|phrase)?(?:$|[._])|secret|jaas|token|credential|private|[._]key$|[._]pem$|keystore\.key|dsn$"
    r"|user[._]info$"
)
"""The pattern (Python's and Java's regex alike) of the names of options whose values are secrets."""
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.I)


def is_secret_option(name: str) -> bool:
    """Whether the value of option ``name`` (e.g. ``kafka.sasl.jaas.config``) may be a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the value of every secret option shown as ``***``, for repr and logs."""
    return {k: redact(v) if is_secret_option(str(k)) else v for k, v in options.items()}


def redacted_repr(opts: Any) -> str:
    """The repr of a Kafka connector's options dataclass: every option, the secret ones (a field declared
    secret, e.g. ``schema.registry.basic.auth.user.info``; under ``kafka``: ``kafka.sasl.jaas.config``,
    ``kafka.ssl.key.password``, ...) as ``***``."""
    import dataclasses

    shown = []
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if f.name == "kafka":
            value = redact_options(value)
        elif not f.repr and value is not None:  # a secret option's value
            value = "***"
        elif isinstance(value, str) and "://" in value:  # a URL may carry user:password@
            value = redact_userinfo(value)
        shown.append(f"{f.name}={value!r}")
    return f"{type(opts).__name__}({', '.join(shown)})"


class _Refused(Exception):
    """A setting librdkafka cannot honour: the reason and the option; the caller adds its context."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


def fail(message: str, option: str) -> _Refused:
    return _Refused(message, option)


_LOGGERS = {"consumer": "sources.kafka.options", "producer": "sinks.kafka.options"}  # where each role's options log

# Java client name -> librdkafka name where they differ.
_RENAMED = {
    "sasl.mechanism": "sasl.mechanisms",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "request.timeout.ms": "socket.timeout.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",  # ssl.keystore.type=PEM, inline
    "ssl.keystore.key": "ssl.key.pem",
    "ssl.truststore.certificates": "ssl.ca.pem",  # ssl.truststore.type=PEM, inline
}
# Java client settings that librdkafka does not have and that change nothing a read relies on: dropped
# with a log line that says why (a read's; the write's are in _JAVA_ONLY_PRODUCER).
_JAVA_ONLY = {
    "max.poll.records": "librdkafka hands over records as they arrive; the source reads exact ranges",
    "ssl.truststore.password": "librdkafka's CA file (ssl.ca.location) is PEM and has no password",
    "ssl.truststore.type": "the trust store is read as PEM (see kafka.ssl.truststore.location)",
    "ssl.keystore.type": "the key store is read as PKCS#12 (ssl.keystore.location) or PEM",
    "ssl.enabled.protocols": "librdkafka negotiates the highest TLS version OpenSSL allows (TLS 1.2+ by default); "
    "restrict it in OpenSSL's configuration (MinProtocol) if needed",
    "ssl.protocol": "librdkafka negotiates the highest TLS version OpenSSL allows (TLS 1.2+ by default)",
    "ssl.keymanager.algorithm": "a Java security provider setting",
    "ssl.trustmanager.algorithm": "a Java security provider setting",
    "ssl.secure.random.implementation": "a Java security provider setting",
    "ssl.provider": "a Java security provider setting (librdkafka: ssl.providers names OpenSSL providers)",
    "security.providers": "a Java security provider setting",
    "default.api.timeout.ms": "the source bounds every call with kafkaConsumer.pollTimeoutMs",
    "exclude.internal.topics": "internal topics are never read",
    "allow.auto.create.topics": "the source never creates topics",
    "client.dns.lookup": "librdkafka resolves every address of a bootstrap name",
    "partition.assignment.strategy": "the source never joins a consumer group (assign + seek)",
    "key.serializer": "a producer (sink) setting: keys are read as bytes",
    "value.serializer": "a producer (sink) setting: values are read as bytes",
    "metric.reporters": "a Java metrics setting",
    "metrics.num.samples": "a Java metrics setting",
    "metrics.recording.level": "a Java metrics setting",
    "metrics.sample.window.ms": "a Java metrics setting",
    "auto.include.jmx.reporter": "a Java metrics setting",
}
# The settings only one kind of client takes, by the names users give them (Java's, or librdkafka's own), in
# one place: a read drops a producer's (users keep one options map for Spark's Kafka source and sink), a write
# a consumer's, each with a log line, and an admin client gets neither (``admin_config``).
_PRODUCER_ONLY = frozenset(
    {
        # librdkafka's own names of producer settings
        "sticky.partitioning.linger.ms",
        "enable.gapless.guarantee",
        "delivery.report.only.error",
        "queuing.strategy",
        "message.send.max.retries",
        "partitioner",
        "produce.offset.report",
        # Java's (many are librdkafka's too)
        "acks",
        "linger.ms",
        "batch.size",
        "batch.num.messages",
        "buffer.memory",
        "compression.type",
        "compression.codec",
        "compression.level",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "retries",
        "delivery.timeout.ms",
        "max.in.flight.requests.per.connection",
        "enable.idempotence",
        "transactional.id",
        "transaction.timeout.ms",
        "max.block.ms",
        "max.request.size",
        "partitioner.class",
        "partitioner.ignore.keys",
        "partitioner.adaptive.partitioning.enable",
        "partitioner.availability.timeout.ms",
        "queue.buffering.max.ms",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "message.timeout.ms",
        "request.required.acks",
    }
)
# Java settings that name a Java class or file format librdkafka cannot use: the replacement, said exactly.
_NEEDS_REPLACEMENT = {
    "sasl.login.callback.handler.class": "librdkafka cannot load Java classes; for OAUTHBEARER set "
    "kafka.sasl.oauthbearer.method=oidc with kafka.sasl.oauthbearer.client.id, "
    "kafka.sasl.oauthbearer.client.secret and kafka.sasl.oauthbearer.token.endpoint.url",
    "sasl.client.callback.handler.class": "librdkafka cannot load Java classes; use kafka.sasl.username / "
    "kafka.sasl.password (PLAIN, SCRAM) or kafka.sasl.oauthbearer.* (OAUTHBEARER)",
    "sasl.login.class": "librdkafka cannot load Java classes; use kafka.sasl.username / kafka.sasl.password, "
    "kafka.sasl.kerberos.* or kafka.sasl.oauthbearer.*",
    "ssl.engine.factory.class": "librdkafka cannot load Java classes; use kafka.ssl.engine.location "
    "(an OpenSSL engine) or kafka.ssl.providers",
}
# Set by the source itself; a user value would break exactly-once reading.
_OWNED_CONSUMER = {"enable.partition.eof", "enable.auto.offset.store"}
_JAAS = re.compile(r"""(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|(\S+?))\s*(?=\s|;|$)""")


# A write's Java-only settings: the common ones of _JAVA_ONLY and the producer's own.
_JAVA_ONLY_PRODUCER = {
    **{k: v for k, v in _JAVA_ONLY.items() if k.startswith(("ssl.", "security.", "metric", "auto.include", "client."))},
    "max.block.ms": "librdkafka never blocks a produce call; the sink bounds each of its waits with "
    "kafka.transaction.timeout.ms",
    "key.serializer": "the sink writes the key column's bytes (string columns as UTF-8)",
    "value.serializer": "the sink writes the value column's bytes (string columns as UTF-8)",
    "default.api.timeout.ms": "the sink bounds each of its waits with kafka.transaction.timeout.ms",
    "allow.auto.create.topics": "the sink never creates the topics it writes; they must exist",
}
# Consumer (source) settings: no meaning on a write (see _PRODUCER_ONLY).
_CONSUMER_ONLY = frozenset(
    {
        # librdkafka's own names of consumer settings
        "coordinator.query.interval.ms",
        "fetch.message.max.bytes",
        "fetch.error.backoff.ms",
        "offset.store.method",
        "consume.callback.max.messages",
        "group.protocol.type",
        # Java's (many are librdkafka's too)
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "isolation.level",
        "auto.offset.reset",
        "enable.auto.commit",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "fetch.max.wait.ms",
        "fetch.wait.max.ms",
        "fetch.queue.backoff.ms",
        "max.partition.fetch.bytes",
        "max.poll.records",
        "max.poll.interval.ms",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "partition.assignment.strategy",
        "key.deserializer",
        "value.deserializer",
        "check.crcs",
        "exclude.internal.topics",
        "client.rack",
        "queued.min.messages",
        "queued.max.messages.kbytes",
    }
)
_PRODUCER_RENAMED = {**_RENAMED, "max.request.size": "message.max.bytes"}
_PRODUCER_RENAMED.pop("request.timeout.ms")  # a producer's request.timeout.ms is librdkafka's own (the ack timeout)
# Java's partitioners that librdkafka has: the default hashes keys with murmur2 as librdkafka's murmur2_random does.
_JAVA_PARTITIONERS = {
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner": "murmur2_random",
    "org.apache.kafka.clients.producer.internals.BuiltInPartitioner": "murmur2_random",
    "org.apache.kafka.clients.producer.UniformStickyPartitioner": "random",
}
# Set by the sink itself; a user value would break exactly-once writing: the reason.
_OWNED_PRODUCER = {
    "transactional.id": "the sink derives its transactional ids from option 'sink.id' (one per task slot, or one "
    "for the publish); drop kafka.transactional.id",
    "transactional.id.prefix": "the sink derives its transactional ids from option 'sink.id'; drop it",
}


def client_config(kafka: Mapping[str, str], *, role: Role, context: str) -> dict[str, str]:
    """librdkafka configuration of a ``role`` client from the ``kafka.*`` options, Java names mapped.

    A Java setting with a librdkafka equivalent is renamed; one that changes nothing the role relies on
    is dropped with a log line saying why; one librdkafka cannot honour (JKS stores, Java classes) or
    that would break exactly-once (a producer's own ``transactional.id``, ``acks`` other than all) is a
    ConfigError naming it and what replaces it. Values are never logged (they may be secrets).
    """
    try:
        return _translate(kafka, role=role, context=context)
    except _Refused as exc:
        raise ConfigError(f"{context}: {exc}", option=exc.option) from None


CONFIG_ENV = "EOS_KAFKA_CONFIG"
"""A Java client properties file (``security.protocol``, ``sasl.*``, ``ssl.*`` ...) for spark-eos's own
clients: the CLI (``--kafka-config``), the chaos toolkit's producer and checkers, the services' probes."""


def read_properties(path: str) -> dict[str, str]:
    r"""A ``java.util.Properties`` file: ``key=value`` or ``key: value`` lines, ``#``/``!`` comments, a ``\``
    at a line's end continuing it, ``\`` escapes. A missing file is a ConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(
            f"Kafka client properties {path!r}: cannot read it ({exc.strerror})", option=CONFIG_ENV
        ) from None
    out: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes at the end: the line goes on
            logical += line[:-1]
            continue
        logical += line
        m = re.match(r"((?:\\.|[^\\=:\s])+)\s*[=:\s]\s*(.*)$", logical) or re.match(r"((?:\\.|[^\\=:\s])+)()$", logical)
        if m:
            out[_unescape(m.group(1))] = _unescape(m.group(2))
        logical = ""
    return out


def _escape(text: str, *, key: bool) -> str:
    """java.util.Properties escaping (keys also escape separators and a leading comment sign)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\f":
            out.append("\\f")
        elif (key and ch in " =:#!") or (not key and i == 0 and ch in " #!"):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def render_properties(props: Mapping[str, str], header: str = "") -> str:
    """A ``.properties`` file holding ``props`` in their order."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{_escape(k, key=True)}={_escape(v, key=False)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def _unescape(text: str) -> str:
    escapes = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(1)), text)


def kafka_options(bootstrap: str, path: str | None = None) -> dict[str, str]:
    """The ``kafka.*`` options of a kafka-eos source or sink on a cluster: ``kafka.bootstrap.servers`` and the
    settings of the Java client properties file ``path`` (none: a plaintext cluster)."""
    settings = read_properties(path) if path else {}
    return {"kafka.bootstrap.servers": bootstrap, **{f"kafka.{k}": v for k, v in settings.items()}}


def client_settings(path: str | None = None, *, context: str = "spark-eos") -> dict[str, str]:
    """librdkafka's settings (security and connection ones) from a Java client properties file: ``path``,
    else the file ``EOS_KAFKA_CONFIG`` names, else none ({}). Java names are mapped as the connectors map
    their ``kafka.*`` options; a setting only one kind of client takes is left out."""
    named = path or os.environ.get(CONFIG_ENV)
    if not named:
        return {}
    java = read_properties(named)
    mapped = client_config({f"kafka.{k}": v for k, v in java.items()}, role="consumer", context=context)
    return {k: v for k, v in admin_config(mapped).items() if k != "bootstrap.servers"}


def admin_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A consumer's or a producer's librdkafka configuration as an admin client (or a consumer made from a
    producer's settings) takes it: the connection and security settings, without any only one kind of
    client knows (librdkafka warns of those, or refuses them)."""
    return {k: v for k, v in conf.items() if k not in _CONSUMER_ONLY and k not in _PRODUCER_ONLY}


def _dropped(role: Role, name: str) -> str | None:
    """Why ``name`` means nothing to a ``role`` client (a log line), or None."""
    if role == "consumer":
        if name in _JAVA_ONLY:
            return f"(a Java client setting): {_JAVA_ONLY[name]}"
        if name in _PRODUCER_ONLY:
            return ": a producer (Kafka sink) setting, no meaning on a read"
        return None
    if name in _JAVA_ONLY_PRODUCER:
        return f"(a Java client setting): {_JAVA_ONLY_PRODUCER[name]}"
    if name in _CONSUMER_ONLY:
        return ": a consumer (Kafka source) setting, no meaning on a write"
    return None


def _producer_setting(name: str, value: str) -> dict[str, str] | None:
    """A producer setting the sink checks or maps itself ({} drops it), or None for the common path."""
    if name in _OWNED_PRODUCER:
        raise fail(f"option 'kafka.{name}' is set by the sink: {_OWNED_PRODUCER[name]}", "kafka." + name)
    if name in ("acks", "request.required.acks") and value.strip().lower() not in ("all", "-1"):
        raise fail(
            f"option 'kafka.{name}' is {value!r}; a transactional producer needs acks=all (every in-sync replica "
            "has each record before its transaction commits): drop the option or set it to all",
            "kafka." + name,
        )
    if name == "enable.idempotence" and value.strip().lower() in ("false", "0", "no", "off"):
        raise fail(
            "option 'kafka.enable.idempotence' is false; the sink's transactions need the idempotent producer "
            "(a retried send is written once): drop the option",
            "kafka.enable.idempotence",
        )
    if name == "buffer.memory":
        try:
            kbytes = max(1, -(-int(value) // 1024))
        except ValueError:
            raise fail(
                f"option 'kafka.buffer.memory' is {value!r}; expected a number of bytes", "kafka." + name
            ) from None
        return {"queue.buffering.max.kbytes": str(kbytes)}
    if name == "partitioner.class":
        mapped = _JAVA_PARTITIONERS.get(value.strip())
        if mapped is None:
            raise fail(
                f"option 'kafka.partitioner.class' names {value!r}; librdkafka cannot load Java classes: set "
                "kafka.partitioner to one of murmur2_random (Java's default for keyed records), murmur2, "
                "consistent_random, consistent, fnv1a, fnv1a_random or random, or write a partition column",
                "kafka." + name,
            )
        return {"partitioner": mapped}
    return None


def _translate(kafka: Mapping[str, str], *, role: Role, context: str) -> dict[str, str]:
    log = logging.getLogger(_LOGGERS[role])
    conf: dict[str, str] = {}
    settings = {key[len("kafka.") :]: value for key, value in kafka.items()}
    renamed = _RENAMED if role == "consumer" else _PRODUCER_RENAMED
    for name, value in settings.items():
        key = "kafka." + name
        if role == "consumer" and name in _OWNED_CONSUMER:
            log.warning("%s: ignoring option %s; the source sets it itself", context, key)
            continue
        why = _dropped(role, name)
        if why is not None:
            log.info("%s: ignoring option %s%s", context, key, why)
            continue
        if name in _NEEDS_REPLACEMENT:
            raise fail(f"option '{key}' cannot be mapped to librdkafka: {_NEEDS_REPLACEMENT[name]}", key)
        if role == "producer":
            own = _producer_setting(name, value)
            if own is not None:
                conf.update(own)
                continue
        if name == "sasl.jaas.config":
            conf.update(_jaas(value))
            continue
        if name == "ssl.endpoint.identification.algorithm" and not value.strip():
            conf[name] = "none"  # Java spells 'off' as an empty string
            continue
        if name == "ssl.truststore.location":
            conf["ssl.ca.location"] = _truststore(value, settings.get("ssl.truststore.type"))
            continue
        if name == "ssl.keystore.location":
            conf.update(_keystore(value, settings.get("ssl.keystore.type")))
            continue
        conf[renamed.get(name, name)] = value
    for name in ("ssl.truststore.type", "ssl.keystore.type"):
        kind = (settings.get(name) or "").strip().upper()
        if kind == "JKS" and name.replace("type", "location") not in settings:
            raise fail(_JKS[name], "kafka." + name)
    return conf


_JKS = {
    "ssl.truststore.type": "option 'kafka.ssl.truststore.type' is JKS; librdkafka cannot read Java key stores. "
    "Export the CA certificates to PEM (keytool -exportcert -rfc -keystore truststore.jks -alias <ca> -file ca.pem) "
    "and set kafka.ssl.ca.location=ca.pem (or kafka.ssl.truststore.location=ca.pem with "
    "kafka.ssl.truststore.type=PEM); drop kafka.ssl.truststore.password",
    "ssl.keystore.type": "option 'kafka.ssl.keystore.type' is JKS; librdkafka cannot read Java key stores. "
    "Convert it to PKCS#12 (keytool -importkeystore -srckeystore keystore.jks -destkeystore keystore.p12 "
    "-deststoretype PKCS12) and set kafka.ssl.keystore.location=keystore.p12 with kafka.ssl.keystore.password "
    "(or PEM files: kafka.ssl.certificate.location, kafka.ssl.key.location and kafka.ssl.key.password)",
}


def _truststore(location: str, kind: str | None) -> str:
    """The PEM CA file for librdkafka's ssl.ca.location from a Java trust store setting, or an error."""
    kind = (kind or "").strip().upper()
    if kind == "PEM" or (not kind and location.lower().endswith((".pem", ".crt", ".cer"))):
        return location
    if kind in ("PKCS12", "P12") or (not kind and location.lower().endswith((".p12", ".pfx"))):
        raise fail(
            f"option 'kafka.ssl.truststore.location' names the PKCS#12 trust store {location!r}; librdkafka reads CA "
            "certificates as PEM only: export them (openssl pkcs12 -in truststore.p12 -nokeys -out ca.pem) and set "
            "kafka.ssl.ca.location=ca.pem",
            "kafka.ssl.truststore.location",
        )
    raise fail(
        f"option 'kafka.ssl.truststore.location' names {location!r}, a Java trust store (JKS); librdkafka reads PEM "
        "CA files, not Java trust stores: convert it (keytool -exportcert -rfc -keystore truststore.jks -alias <ca> "
        "-file ca.pem) and set kafka.ssl.ca.location=ca.pem (or kafka.ssl.truststore.type=PEM if the file is PEM)",
        "kafka.ssl.truststore.location",
    )


def _keystore(location: str, kind: str | None) -> dict[str, str]:
    """librdkafka's client certificate settings from a Java key store setting, or an error."""
    kind = (kind or "").strip().upper()
    if kind in ("PKCS12", "P12") or (not kind and location.lower().endswith((".p12", ".pfx"))):
        return {"ssl.keystore.location": location}  # librdkafka reads PKCS#12 key stores (+ ssl.keystore.password)
    if kind == "PEM" or (not kind and location.lower().endswith(".pem")):
        # a PEM key store file holds the certificate chain and the private key
        return {"ssl.certificate.location": location, "ssl.key.location": location}
    raise fail(
        f"option 'kafka.ssl.keystore.location' names {location!r}"
        + (f" (ssl.keystore.type {kind})" if kind else ", a Java key store (JKS)")
        + "; librdkafka cannot read JKS. "
        + _JKS["ssl.keystore.type"].split("; librdkafka cannot read Java key stores. ", 1)[1],
        "kafka.ssl.keystore.location",
    )


def _jaas(text: str) -> dict[str, str]:
    """Map a Java sasl.jaas.config to librdkafka: PLAIN / SCRAM login modules to sasl.username/password,
    Kerberos (Krb5LoginModule with keyTab= and principal=) to sasl.kerberos.keytab/principal."""
    fields = {m.group(1): next(g for g in m.groups()[1:] if g is not None) for m in _JAAS.finditer(text)}
    if "Krb5LoginModule" in text and "keyTab" in fields and "principal" in fields:
        return {"sasl.kerberos.keytab": fields["keyTab"], "sasl.kerberos.principal": fields["principal"]}
    if "username" not in fields or "password" not in fields:
        raise fail(
            "option 'kafka.sasl.jaas.config' could not be mapped to librdkafka: only PlainLoginModule/ScramLoginModule "
            "with username= and password=, and Krb5LoginModule with keyTab= and principal= are understood; set "
            "kafka.sasl.username and kafka.sasl.password (or kafka.sasl.kerberos.keytab and "
            "kafka.sasl.kerberos.principal, or kafka.sasl.oauthbearer.* for OAUTHBEARER) instead",
            "kafka.sasl.jaas.config",
        )
    return {"sasl.username": fields["username"], "sasl.password": fields["password"]}
