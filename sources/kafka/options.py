"""Options of the kafka-eos source: Spark's names, defaults and validation rules, parsed once."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import ConfigError
from connectors.core.options import OptionSet, option

__all__ = [
    "CONTEXT",
    "OPTIONS",
    "REJECTED_KAFKA_OPTIONS",
    "KafkaSourceOptions",
    "consumer_config",
    "parse_options",
]

log = logging.getLogger(__name__)

CONTEXT = "kafka-eos"
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark's default: spark.network.timeout (120 s)


# Spark refuses these Kafka options (KafkaSourceProvider); we say why in the same words.
REJECTED_KAFKA_OPTIONS: dict[str, str] = {
    "group.id": "",  # allowed, see below; listed so the loop below skips it
    "auto.offset.reset": "set the source option 'startingOffsets' instead (earliest, latest or JSON); the source "
    "manages offsets itself and an automatic reset would silently skip or repeat records",
    "key.deserializer": "keys are always read as bytes; cast or deserialize the 'key' column with DataFrame operations",
    "value.deserializer": "values are always read as bytes; cast or deserialize the 'value' column with DataFrame operations",
    "enable.auto.commit": "the source does not commit consumer offsets for correctness; offsets are kept in the "
    "Spark checkpoint (use commitOffsetsToGroup to publish progress to a group)",
    "interceptor.classes": "Kafka interceptors can break the source's read semantics (records are read more than once)",
}
del REJECTED_KAFKA_OPTIONS["group.id"]

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


@dataclass(frozen=True, kw_only=True)
class KafkaSourceOptions:
    """Every option of one kafka-eos source, typed; ``kafka`` holds the ``kafka.*`` passthrough."""

    subscribe: tuple[str, ...] | None = option(
        "subscribe",
        "list",
        description="Comma-separated topics to read (exactly one of subscribe, subscribePattern, assign).",
    )
    subscribe_pattern: str | None = option(
        "subscribePattern",
        "str",
        description="Regular expression; every topic it finds (unanchored search) is read; re-evaluated each trigger.",
    )
    assign: Any = option("assign", "json", description='JSON of topic -> partitions, e.g. {"t":[0,1]}.')
    starting_offsets: str | None = option(
        "startingOffsets",
        "str",
        description='earliest, latest, group or JSON {"t":{"0":12}} (-2 earliest, -1 latest). Default: latest for streams, earliest for batch.',
    )
    starting_timestamp: int | None = option(
        "startingTimestamp",
        "int",
        min=0,
        description="Epoch millis; every partition starts at the first offset with a timestamp >= it. Precedes startingOffsetsByTimestamp and startingOffsets.",
    )
    starting_offsets_by_timestamp: Any = option(
        "startingOffsetsByTimestamp",
        "json",
        description='JSON {"t":{"0":1700000000000}} of start timestamps per partition. Precedes startingOffsets.',
    )
    starting_offsets_by_timestamp_strategy: str = option(
        "startingOffsetsByTimestampStrategy",
        "choice",
        default="error",
        choices=("error", "latest"),
        description="When no offset matches a start timestamp: fail (error) or start at latest.",
    )
    starting_offsets_location: str | None = option(
        "startingOffsetsLocation",
        "str",
        description="File where the resolved start is persisted once (else batch 0 pins it in the checkpoint, see docs/kafka-source.md).",
    )
    ending_offsets: str | None = option(
        "endingOffsets", "str", description='Batch only: latest or JSON {"t":{"0":50}} (-1 latest). Default latest.'
    )
    ending_timestamp: int | None = option(
        "endingTimestamp",
        "int",
        min=0,
        description="Batch only: epoch millis end for every partition. Precedes endingOffsetsByTimestamp and endingOffsets.",
    )
    ending_offsets_by_timestamp: Any = option(
        "endingOffsetsByTimestamp",
        "json",
        description="Batch only: JSON of end timestamps per partition. Precedes endingOffsets.",
    )
    fail_on_data_loss: bool = option(
        "failOnDataLoss",
        "bool",
        default=True,
        description="Fail when records due to be read are gone (topic/partition deleted, aged out, offsets went back); false logs and skips.",
    )
    max_offsets_per_trigger: int | None = option(
        "maxOffsetsPerTrigger",
        "int",
        min=1,
        description="Most records per micro-batch, split across partitions in proportion to their backlog.",
    )
    min_offsets_per_trigger: int | None = option(
        "minOffsetsPerTrigger",
        "int",
        min=1,
        description="Fewest new records (counted to the topic's end, before maxOffsetsPerTrigger caps the batch) "
        "for a trigger to run a batch; waits up to maxTriggerDelay for them; the first trigger runs at once.",
    )
    max_trigger_delay_ms: int = option(
        "maxTriggerDelay",
        "time_ms",
        default=900_000,
        description="Longest wait for minOffsetsPerTrigger before a smaller batch runs: Spark's time string, "
        "a bare number is milliseconds (30s, 15m, 500); default 15m.",
    )
    max_bytes_per_trigger: int | None = option(
        "maxBytesPerTrigger",
        "int",
        min=1,
        description="Approximate most bytes per micro-batch (estimated from the sizes of at most 200 records "
        "sampled at the start of the backlog, in at most 1 s).",
    )
    min_partitions: int | None = option(
        "minPartitions",
        "int",
        min=1,
        description="Desired minimum number of Spark tasks; big offset ranges are split proportionally.",
    )
    max_records_per_partition: int | None = option(
        "maxRecordsPerPartition",
        "int",
        min=1,
        description="Most records one Spark task reads; bigger ranges are split.",
    )
    include_headers: bool = option(
        "includeHeaders",
        "bool",
        default=False,
        description="Add the headers column (array<struct<key:string,value:binary>>).",
    )
    group_id_prefix: str = option(
        "groupIdPrefix",
        "str",
        default="spark-kafka-source",
        description="Prefix of the generated consumer group id (unused when kafka.group.id is set).",
    )
    poll_timeout_ms: int = option(
        "kafkaConsumer.pollTimeoutMs",
        "int",
        default=DEFAULT_POLL_TIMEOUT_MS,
        min=1,
        description="Longest wait for data or metadata before a read or a metadata call fails with a clear error.",
    )
    fetch_offset_num_retries: int = option(
        "fetchOffset.numRetries",
        "int",
        default=3,
        min=0,
        description="Retries of an offset or metadata look-up on the driver.",
    )
    fetch_offset_retry_interval_ms: int = option(
        "fetchOffset.retryIntervalMs",
        "int",
        default=10,
        min=0,
        description="Pause between those retries.",
    )
    commit_offsets_to_group: bool = option(
        "commitOffsetsToGroup",
        "bool",
        default=False,
        description="After each completed batch, commit its end offsets to kafka.group.id for lag monitoring (never used for correctness).",
    )
    arrow_batch_rows: int = option(
        "arrowBatchRows",
        "int",
        default=10_000,
        min=1,
        description="Rows per Arrow record batch a read task yields (bounds a worker's memory).",
    )
    arrow_batch_bytes: int = option(
        "arrowBatchBytes",
        "int",
        default=8 * 1024 * 1024,
        min=1024,
        description="Payload bytes per Arrow record batch a read task yields (bounds a worker's memory).",
    )
    faults: str | None = option(
        "faults",
        "str",
        description="Fault-injection spec for tests (see connectors.core.faults); EOS_FAULTS adds to it.",
    )
    topic: str | None = option(
        "topic",
        "str",
        description="Spark's Kafka sink option (the topic written to): accepted so one options map serves "
        "the source and the sink; ignored on a read, with a log line.",
    )
    kafka: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return self.kafka.get("kafka.bootstrap.servers", "")

    @property
    def group_id(self) -> str | None:
        return self.kafka.get("kafka.group.id") or None

    @property
    def read_committed(self) -> bool:
        return self.kafka.get("kafka.isolation.level", "read_uncommitted").strip().lower() == "read_committed"

    @property
    def starting_is_group(self) -> bool:
        return (self.starting_offsets or "").strip().lower() == "group"


OPTIONS = OptionSet(CONTEXT, KafkaSourceOptions, passthrough=("kafka.",), passthrough_attr="kafka")


def _fail(message: str, option: str) -> ConfigError:
    return ConfigError(f"{CONTEXT}: {message}", option=option)


def parse_options(raw: Mapping[str, Any], *, streaming: bool) -> KafkaSourceOptions:
    """Parse and validate like Spark's KafkaSourceProvider; raise ConfigError naming the option."""
    opts = OPTIONS.build(raw)
    # Kafka options are case-sensitive in librdkafka; Spark lower-cases the whole key.
    opts = _replace(opts, kafka={"kafka." + k[len("kafka.") :].lower(): v for k, v in opts.kafka.items()})
    _validate_strategy(opts)
    _validate_kafka(opts)
    _validate_offsets(opts, streaming=streaming)
    if (
        opts.min_offsets_per_trigger
        and opts.max_offsets_per_trigger
        and opts.min_offsets_per_trigger > opts.max_offsets_per_trigger
    ):
        raise _fail(
            f"option 'minOffsetsPerTrigger' ({opts.min_offsets_per_trigger}) is greater than 'maxOffsetsPerTrigger' "
            f"({opts.max_offsets_per_trigger}); make min <= max",
            "minOffsetsPerTrigger",
        )
    if (opts.commit_offsets_to_group or opts.starting_is_group) and not opts.group_id:
        which = "commitOffsetsToGroup" if opts.commit_offsets_to_group else "startingOffsets"
        raise _fail(f"option '{which}' needs the consumer group named by option 'kafka.group.id'; set it", which)
    if opts.faults:
        from connectors.core.faults import parse_spec

        parse_spec(opts.faults)
    _log_ignored(raw, opts, streaming=streaming)
    return opts


# Options with no meaning in a batch read (Spark ignores them there too).
_STREAM_ONLY = (
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxBytesPerTrigger",
    "commitOffsetsToGroup",
    "startingOffsetsLocation",
)


def _log_ignored(raw: Mapping[str, Any], opts: KafkaSourceOptions, *, streaming: bool) -> None:
    """One log line per option Spark accepts that has no meaning for this read."""
    given = {str(k).lower() for k in raw}
    if opts.topic is not None:
        log.info(
            "%s: ignoring option 'topic': it is a Kafka sink option (the topic written to); "
            "the source reads what subscribe/subscribePattern/assign name",
            CONTEXT,
        )
    if not streaming:
        for name in _STREAM_ONLY:
            if name.lower() in given:
                log.info("%s: ignoring option '%s': it has no meaning in a batch read", CONTEXT, name)


def _replace(opts: KafkaSourceOptions, **changes: Any) -> KafkaSourceOptions:
    import dataclasses

    return dataclasses.replace(opts, **changes)


def _validate_strategy(opts: KafkaSourceOptions) -> None:
    given = [
        name
        for name, value in (
            ("subscribe", opts.subscribe),
            ("subscribePattern", opts.subscribe_pattern),
            ("assign", opts.assign),
        )
        if value is not None
    ]
    if len(given) != 1:
        what = "none is given" if not given else f"{', '.join(given)} are all given"
        raise _fail(
            f"exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must say which topics to read; {what}",
            given[0] if given else "subscribe",
        )
    if opts.subscribe is not None and not opts.subscribe:
        raise _fail("option 'subscribe' lists no topic; give a comma-separated list of topics", "subscribe")
    if opts.subscribe_pattern is not None:
        if not opts.subscribe_pattern.strip():
            raise _fail("option 'subscribePattern' is empty; give a regular expression", "subscribePattern")
        try:
            re.compile(opts.subscribe_pattern)
        except re.error as exc:
            raise _fail(
                f"option 'subscribePattern' {opts.subscribe_pattern!r} is not a valid regular expression: {exc}",
                "subscribePattern",
            ) from None
    if opts.assign is not None:
        a = opts.assign
        ok = (
            isinstance(a, dict)
            and a
            and all(
                isinstance(t, str)
                and t
                and isinstance(ps, list)
                and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in ps)
                for t, ps in a.items()
            )
        )
        if not ok:
            raise _fail(
                f"option 'assign' must be JSON mapping topics to lists of partition numbers, like {{\"t\":[0,1]}}; got {json.dumps(a)}",
                "assign",
            )


def _validate_kafka(opts: KafkaSourceOptions) -> None:
    if not opts.bootstrap.strip():
        raise _fail(
            "option 'kafka.bootstrap.servers' is required (host:port[,host:port...])", "kafka.bootstrap.servers"
        )
    for key in opts.kafka:
        name = key[len("kafka.") :]
        if name in REJECTED_KAFKA_OPTIONS:
            raise _fail(f"Kafka option '{name}' is not supported: {REJECTED_KAFKA_OPTIONS[name]}", key)
    level = opts.kafka.get("kafka.isolation.level")
    if level is not None and level.strip().lower() not in ("read_committed", "read_uncommitted"):
        raise _fail(
            f"option 'kafka.isolation.level' is {level!r}; expected read_committed or read_uncommitted",
            "kafka.isolation.level",
        )


def _check_offset_json(value: Any, option: str, *, allowed: tuple[int, ...], what: str) -> dict[str, dict[str, int]]:
    if not isinstance(value, dict) or not value:
        raise _fail(
            f'option \'{option}\' must be JSON like {{"topic":{{"0":{what}}}}}; got {json.dumps(value)}', option
        )
    for topic, parts in value.items():
        if not isinstance(parts, dict) or not parts:
            raise _fail(
                f"option '{option}': topic {topic!r} must map partition numbers to {what}s, got {json.dumps(parts)}",
                option,
            )
        for p, off in parts.items():
            if not str(p).lstrip("-").isdigit() or int(p) < 0:
                raise _fail(f"option '{option}': {p!r} of topic {topic!r} is not a partition number", option)
            if not isinstance(off, int) or isinstance(off, bool) or (off < 0 and off not in allowed):
                valid = " or ".join(str(a) for a in allowed)
                raise _fail(
                    f"option '{option}': {topic}-{p} is {json.dumps(off)}; expected a {what} >= 0"
                    + (f" or {valid}" if allowed else ""),
                    option,
                )
    return value


def _offsets_spec(raw: str | None, option: str, *, words: tuple[str, ...], allowed: tuple[int, ...]) -> Any:
    """'earliest' / 'latest' / 'group' (as allowed) or a validated JSON dict."""
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in words:
        return text.lower()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(
            f"option '{option}' is {raw!r}: neither {' nor '.join(words)} nor valid JSON ({exc.msg} at column {exc.colno})",
            option,
        ) from None
    return _check_offset_json(value, option, allowed=allowed, what="offset")


def _validate_offsets(opts: KafkaSourceOptions, *, streaming: bool) -> None:
    if streaming:
        for name, value in (
            ("endingOffsets", opts.ending_offsets),
            ("endingTimestamp", opts.ending_timestamp),
            ("endingOffsetsByTimestamp", opts.ending_offsets_by_timestamp),
        ):
            if value is not None:
                raise _fail(
                    f"option '{name}' is for batch queries only; a streaming query reads on and never ends", name
                )
    start = _offsets_spec(
        opts.starting_offsets, "startingOffsets", words=("earliest", "latest", "group"), allowed=(-2, -1)
    )
    if not streaming:
        if start == "latest":
            raise _fail(
                "option 'startingOffsets' cannot be latest for batch queries; use earliest, group or JSON offsets",
                "startingOffsets",
            )
        if isinstance(start, dict) and any(o == -1 for parts in start.values() for o in parts.values()):
            raise _fail("option 'startingOffsets' cannot use -1 (latest) for batch queries", "startingOffsets")
        end = _offsets_spec(opts.ending_offsets, "endingOffsets", words=("earliest", "latest"), allowed=(-2, -1))
        if end == "earliest":
            raise _fail(
                "option 'endingOffsets' cannot be earliest for batch queries; use latest or JSON offsets",
                "endingOffsets",
            )
        if isinstance(end, dict) and any(o == -2 for parts in end.values() for o in parts.values()):
            raise _fail("option 'endingOffsets' cannot use -2 (earliest) for batch queries", "endingOffsets")
        if opts.ending_offsets_by_timestamp is not None:
            _check_offset_json(
                opts.ending_offsets_by_timestamp, "endingOffsetsByTimestamp", allowed=(), what="timestamp"
            )
        if (
            opts.starting_timestamp is not None
            and opts.ending_timestamp is not None
            and opts.starting_timestamp > opts.ending_timestamp
        ):
            raise _fail(
                f"option 'startingTimestamp' ({opts.starting_timestamp}) is after 'endingTimestamp' ({opts.ending_timestamp})",
                "startingTimestamp",
            )
        if isinstance(start, dict) and isinstance(end, dict):
            for topic, parts in start.items():
                for p, s in parts.items():
                    e = end.get(topic, {}).get(p)
                    if e is not None and e >= 0 and s >= 0 and s > e:
                        raise _fail(
                            f"startingOffsets {s} is after endingOffsets {e} for {topic}-{p}; the start must not exceed the end",
                            "startingOffsets",
                        )
    if opts.starting_offsets_by_timestamp is not None:
        _check_offset_json(
            opts.starting_offsets_by_timestamp, "startingOffsetsByTimestamp", allowed=(), what="timestamp"
        )
    if opts.assign is not None:
        assigned = {(t, int(p)) for t, ps in opts.assign.items() for p in ps}
        for name, spec in (
            ("startingOffsets", start),
            ("startingOffsetsByTimestamp", opts.starting_offsets_by_timestamp),
        ):
            if isinstance(spec, dict):
                given = {(t, int(p)) for t, ps in spec.items() for p in ps}
                missing = sorted(assigned - given)
                if missing:
                    shown = ", ".join(f"{t}-{p}" for t, p in missing)
                    raise _fail(
                        f"option '{name}' does not cover the assigned partitions {shown}; give an offset for each", name
                    )
                extra = sorted(given - assigned)
                if extra:
                    shown = ", ".join(f"{t}-{p}" for t, p in extra)
                    raise _fail(f"option '{name}' names partitions that 'assign' does not: {shown}", name)


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
            raise _fail(f"option '{key}' cannot be mapped to librdkafka: {_NEEDS_REPLACEMENT[name]}", key)
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
            raise _fail(_JKS[name], "kafka." + name)
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
        raise _fail(
            f"option 'kafka.ssl.truststore.location' names the PKCS#12 trust store {location!r}; librdkafka reads CA "
            "certificates as PEM only: export them (openssl pkcs12 -in truststore.p12 -nokeys -out ca.pem) and set "
            "kafka.ssl.ca.location=ca.pem",
            "kafka.ssl.truststore.location",
        )
    raise _fail(
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
    raise _fail(
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
        raise _fail(
            "option 'kafka.sasl.jaas.config' could not be mapped to librdkafka: only PlainLoginModule/ScramLoginModule "
            "with username= and password=, and Krb5LoginModule with keyTab= and principal= are understood; set "
            "kafka.sasl.username and kafka.sasl.password (or kafka.sasl.kerberos.keytab and "
            "kafka.sasl.kerberos.principal, or kafka.sasl.oauthbearer.* for OAUTHBEARER) instead",
            "kafka.sasl.jaas.config",
        )
    return {"sasl.username": fields["username"], "sasl.password": fields["password"]}
