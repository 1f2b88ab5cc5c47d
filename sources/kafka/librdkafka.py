"""The Java client's consumer settings (Spark's ``kafka.*`` options) as librdkafka's.

``consumer_config(opts)``: a Java setting with a librdkafka equivalent is renamed; one that changes
nothing a read relies on is dropped with a log line saying why; one librdkafka cannot honour (JKS
stores, Java classes) is an error naming the librdkafka setting that replaces it.
"""

from __future__ import annotations

import logging
import re

from sources.kafka.option_specs import CONTEXT, KafkaSourceOptions, fail

__all__ = ["consumer_config"]

log = logging.getLogger("sources.kafka.options")  # one logger for what the options do, as before this module

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
# with a log line that says why.
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
# Producer (sink) settings users keep in an options map shared with Spark's Kafka sink: no meaning on a read.
_PRODUCER_ONLY = frozenset(
    {
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
_OWNED = {"enable.partition.eof", "enable.auto.offset.store"}
_JAAS = re.compile(r"""(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|(\S+?))\s*(?=\s|;|$)""")


def consumer_config(opts: KafkaSourceOptions) -> dict[str, str]:
    """librdkafka consumer configuration from the ``kafka.*`` options, Java names mapped.

    A Java setting with a librdkafka equivalent is renamed; one that changes nothing a read relies on
    is dropped with a log line saying why; one librdkafka cannot honour (JKS stores, Java classes) is an
    error naming the librdkafka setting that replaces it. Values are never logged (they may be secrets).
    """
    conf: dict[str, str] = {}
    kafka = {key[len("kafka.") :]: value for key, value in opts.kafka.items()}
    for name, value in kafka.items():
        key = "kafka." + name
        if name in _OWNED:
            log.warning("%s: ignoring option %s; the source sets it itself", CONTEXT, key)
            continue
        if name in _JAVA_ONLY:
            log.info("%s: ignoring option %s (a Java client setting): %s", CONTEXT, key, _JAVA_ONLY[name])
            continue
        if name in _PRODUCER_ONLY:
            log.info("%s: ignoring option %s: a producer (Kafka sink) setting, no meaning on a read", CONTEXT, key)
            continue
        if name in _NEEDS_REPLACEMENT:
            raise fail(f"option '{key}' cannot be mapped to librdkafka: {_NEEDS_REPLACEMENT[name]}", key)
        if name == "sasl.jaas.config":
            conf.update(_jaas(value))
            continue
        if name == "ssl.endpoint.identification.algorithm" and not value.strip():
            conf[name] = "none"  # Java spells 'off' as an empty string
            continue
        if name == "ssl.truststore.location":
            conf["ssl.ca.location"] = _truststore(value, kafka.get("ssl.truststore.type"))
            continue
        if name == "ssl.keystore.location":
            conf.update(_keystore(value, kafka.get("ssl.keystore.type")))
            continue
        conf[_RENAMED.get(name, name)] = value
    for name in ("ssl.truststore.type", "ssl.keystore.type"):
        kind = (kafka.get(name) or "").strip().upper()
        if kind == "JKS" and name.replace("type", "location") not in kafka:
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
