"""Options of the ``kafka-eos`` sink (the Kafka format on writes): Spark's Kafka sink options plus the
exactly-once ones, declared once and parsed into ``KafkaSinkOptions``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eos_core.errors import ConfigError
from eos_core.kafka_config import client_config, redacted_repr
from eos_core.options import REQUIRED, OptionSet, option
from eos_core.registry_options import RegistryOptions

__all__ = ["CONTEXT", "OPTIONS", "KafkaSinkOptions", "parse_options"]

CONTEXT = "kafka-eos sink"
STAGING_TOPIC = "spark-eos-staging"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's legal topic names


def _topic_name(option_name: str) -> Any:
    def check(value: str) -> None:
        if not _TOPIC.fullmatch(value) or value in (".", ".."):
            raise ValueError(
                f"not a Kafka topic name (letters, digits, '.', '_', '-'; at most 249) for option '{option_name}'"
            )

    return check


# subject naming strategies: ours, and the class names Confluent's serializers (and Kafka Connect) are configured with
_STRATEGIES = {
    "topic": "topic",
    "record": "record",
    "topic-record": "topic-record",
    "topicnamestrategy": "topic",
    "recordnamestrategy": "record",
    "topicrecordnamestrategy": "topic-record",
}


def _strategy(name: str) -> Any:
    """The ``convert`` of option ``name`` (a subject naming strategy)."""

    def convert(value: str, context: str) -> str:
        found = _STRATEGIES.get(str(value).strip().rsplit(".", 1)[-1].lower())
        if found is None:
            raise ConfigError(
                f"{context}: option '{name}' is {value!r}, no subject naming strategy: topic (<topic>-value), record "
                "(the record's full name) or topic-record (<topic>-<record's full name>); Confluent's class names "
                "(TopicNameStrategy, RecordNameStrategy, TopicRecordNameStrategy) are taken too",
                option=name,
            )
        return found

    return convert


def _sink_id(value: str) -> None:
    if not value.strip() or value != value.strip() or any(not ch.isprintable() for ch in value):
        raise ValueError("a printable name with no leading or trailing spaces, unique to this query")
    if len(value.encode("utf-8")) > 200:
        raise ValueError("at most 200 bytes: it names the sink's transactional ids and consumer groups")


@dataclass(frozen=True, kw_only=True)
class KafkaSinkOptions(RegistryOptions):
    """Every option of one ``kafka-eos`` write, typed; ``kafka`` holds the ``kafka.*`` producer settings."""

    sink_id: str = option(
        "sink.id",
        "str",
        REQUIRED,
        "A name unique to this query and stable across its restarts (e.g. 'orders-enriched'): it names the "
        "sink's transactional ids and the consumer groups that hold its markers.",
        check=_sink_id,
    )
    topic: str | None = option(
        "topic",
        "str",
        None,
        "The topic every row is written to; overrides a topic column (as Spark's Kafka sink does). "
        "Without it every row needs a non-null topic column.",
        check=_topic_name("topic"),
    )
    visibility: str = option(
        "visibility",
        "choice",
        "batch",
        "batch: tasks stage their rows, the driver publishes the whole micro-batch in one transaction when it "
        "completes (read_committed readers never see part of a batch); partition: each task writes and "
        "commits its rows in a transaction of its own (no second write; a batch becomes visible task by task).",
        choices=("batch", "partition"),
    )
    checkpoint: str | None = option(
        "checkpointLocation",
        "str",
        None,
        "The query's checkpoint location (Spark passes writeStream.option('checkpointLocation') to the sink): "
        "each batch's marker is bound to what Spark planned in offsets/<n>.",
    )
    batch_id: int | None = option(
        "batch.id",
        "int",
        None,
        "Batch writes (df.write) only: this job's run number; re-running a batch id already written is a "
        "no-op, a lower one is refused.",
        min=0,
    )
    marker_topic: str | None = option(
        "marker.topic",
        "str",
        None,
        "An existing topic whose partition 0 the sink's markers (consumer-group offsets committed in its "
        "transactions) are kept against; default: option 'topic'. Required when rows name their own topics.",
        check=_topic_name("marker.topic"),
    )
    staging_topic: str = option(
        "staging.topic",
        "str",
        STAGING_TOPIC,
        "visibility=batch: the topic tasks stage their rows in until the driver publishes them (created when "
        "missing, see staging.partitions); any number of sinks may share it.",
        check=_topic_name("staging.topic"),
    )
    staging_partitions: int = option(
        "staging.partitions",
        "int",
        8,
        "visibility=batch: partitions of the staging topic when the sink creates it.",
        min=1,
    )
    staging_retention_ms: int = option(
        "staging.retention",
        "time_ms",
        86_400_000,
        "visibility=batch: retention.ms of the staging topic when the sink creates it (staged rows are read "
        "once, by the publish of their batch attempt; default 1 day).",
        min=60_000,
    )
    errors_tolerance: str = option(
        "errors.tolerance",
        "choice",
        "none",
        "none: a row the broker would refuse (larger than the topic's max.message.bytes or the producer's "
        "message.max.bytes, no key on a compacted topic, a partition or topic that does not exist) fails the "
        "batch before anything of it is visible, naming it; all: it goes to errors.topic in the same transaction "
        "as the good rows.",
        choices=("none", "all"),
    )
    errors_topic: str | None = option(
        "errors.topic",
        "str",
        None,
        "The existing dead-letter topic for errors.tolerance=all.",
        check=_topic_name("errors.topic"),
    )
    timeout_ms: int = option(
        "kafkaProducer.timeoutMs",
        "time_ms",
        120_000,
        "Longest wait of each blocking step (fencing, marker look-up, flush, commit) before it fails with a "
        "clear error; Spark's default network timeout.",
        min=1000,
    )
    value_format: str = option(
        "value.format",
        "choice",
        "raw",
        "raw: the value column is written as it is (string or binary). avro, json-schema: a struct value column is "
        "written in Confluent's wire format (Avro, or JSON text), its schema registered in the Schema Registry "
        "(schema.registry.url) under value.subject.",
        choices=("raw", "avro", "json-schema"),
    )
    key_format: str = option(
        "key.format", "choice", "raw", "As value.format, for the key column.", choices=("raw", "avro", "json-schema")
    )
    value_schema: str = option(
        "value.schema",
        "str",
        "auto",
        "The writer schema of an encoded value: auto (derived from the column's Spark type, for avro as to_avro "
        "derives it; registered as a version of the subject when it is not one; the registry's compatibility check "
        "refuses an incompatible change before anything is written), latest, version:N, id:N (a registered schema "
        "the column's type must match), or a schema inline (registered). A JSON Schema given so is also checked "
        "value by value (its enums, patterns, ranges), as Confluent's serializer checks.",
    )
    key_schema: str = option("key.schema", "str", "auto", "As value.schema, for the key.")
    value_subject: str | None = option(
        "value.subject",
        "str",
        None,
        "The subject of an encoded value (avro, json-schema), named outright. Default: named by value.subject.name.strategy (<topic>-value, "
        "TopicNameStrategy, which needs option 'topic').",
    )
    key_subject: str | None = option("key.subject", "str", None, "As value.subject, for the key (default <topic>-key).")
    value_subject_strategy: str | None = option(
        "value.subject.name.strategy",
        "str",
        None,
        "How the subject of an encoded value is named when value.subject is not given: topic (default: "
        "<topic>-value, needs option 'topic'), record (the record's full name: rows may name their topics), "
        "topic-record (<topic>-<record's full name>); Confluent's class names are taken too.",
        convert=_strategy("value.subject.name.strategy"),
    )
    key_subject_strategy: str | None = option(
        "key.subject.name.strategy",
        "str",
        None,
        "As value.subject.name.strategy, for the key (topic: <topic>-key).",
        convert=_strategy("key.subject.name.strategy"),
    )
    value_record_name: str | None = option(
        "value.record.name",
        "str",
        None,
        "The full name (namespace.Name) of the record value.schema=auto registers (avro: default topLevelRecord, as "
        "to_avro names it; json-schema: the schema's title, none by default); with value.subject.name.strategy record or topic-record and a registered schema "
        "(latest, version:N), the record whose subject holds it.",
    )
    key_record_name: str | None = option("key.record.name", "str", None, "As value.record.name, for the key.")
    faults: str | None = option(
        "faults", "str", None, "Fault-injection spec for tests (see eos_core.faults); EOS_FAULTS adds to it."
    )
    kafka: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Every option, the secret ones as ``***`` (``eos_core.kafka_config.redacted_repr``)."""
        return redacted_repr(self)

    __str__ = __repr__

    @property
    def bootstrap(self) -> str:
        return self.kafka.get("kafka.bootstrap.servers", "")

    @property
    def staged(self) -> bool:
        """``visibility=batch``: tasks stage their rows, the driver publishes the batch in one transaction."""
        return self.visibility == "batch"

    @property
    def direct(self) -> bool:
        """``visibility=partition``: each task commits its rows with its slot's marker."""
        return self.visibility == "partition"

    @property
    def markers_on(self) -> str | None:
        """The topic whose partition 0 holds the markers."""
        return self.marker_topic or self.topic

    def producer_config(self) -> dict[str, str]:
        """librdkafka's producer settings from ``kafka.*`` (Java names mapped), the sink's own on top."""
        conf = client_config(self.kafka, role="producer", context=CONTEXT)
        conf.setdefault("partitioner", "murmur2_random")  # Java's default: a key lands where Spark's sink puts it
        conf.setdefault("transaction.timeout.ms", "60000")
        return conf

    @property
    def transaction_timeout_ms(self) -> int:
        return int(self.producer_config()["transaction.timeout.ms"])

    def validate(self, context: str) -> None:
        if not self.bootstrap:
            raise ConfigError(
                f"{context}: option 'kafka.bootstrap.servers' is required (host:port of the brokers to write to)",
                option="kafka.bootstrap.servers",
            )
        if self.errors_tolerance == "all" and self.errors_topic is None:
            raise ConfigError(
                f"{context}: errors.tolerance=all needs option 'errors.topic', an existing topic rows the broker "
                "would refuse go to (e.g. errors.topic=orders-refused)",
                option="errors.topic",
            )
        if self.errors_tolerance == "none" and self.errors_topic is not None:
            raise ConfigError(
                f"{context}: option 'errors.topic' is set but errors.tolerance is none (refused rows fail the "
                "batch); set errors.tolerance=all to divert them, or drop errors.topic",
                option="errors.tolerance",
            )
        if self.staged and self.staging_topic in (self.topic, self.marker_topic, self.errors_topic):
            raise ConfigError(
                f"{context}: option 'staging.topic' is {self.staging_topic!r}, a topic the sink also publishes "
                "to; staged rows need a topic of their own (default spark-eos-staging)",
                option="staging.topic",
            )


# A read's options in a write's map (one map shared by both) are the format's to drop, with a log line
# (``sources.kafka.datasource.write_options``): the sink knows only its own.
OPTIONS = OptionSet(
    CONTEXT, KafkaSinkOptions, passthrough=("kafka.",), passthrough_attr="kafka", ignored=("path", "queryName")
)


def parse_options(raw: Mapping[str, Any], *, streaming: bool) -> KafkaSinkOptions:
    """Parse and check a write's options; ConfigError naming the option."""
    opts = OPTIONS.build(raw)
    opts = dataclasses.replace(opts, kafka={"kafka." + k[len("kafka.") :].lower(): v for k, v in opts.kafka.items()})
    opts.producer_config()  # refuses what librdkafka cannot honour or what breaks exactly-once, naming it
    if streaming and opts.batch_id is not None:
        raise ConfigError(
            f"{CONTEXT}: option 'batch.id' is for batch writes only; a streaming query uses Spark's batch ids",
            option="batch.id",
        )
    if not streaming and opts.batch_id is None:
        raise ConfigError(
            f"{CONTEXT}: batch writes need option 'batch.id' (your job's run number: re-running the same batch id "
            "is a no-op), e.g. .option('batch.id', 20240601); in foreachBatch use connectors.kafka_batch(...)",
            option="batch.id",
        )
    if streaming and opts.checkpoint is None:
        raise ConfigError(
            f"{CONTEXT} {opts.sink_id}: the sink needs the query's checkpoint location to bind each batch's marker "
            "to what Spark planned (offsets/<batch>); pass it as a writer option: "
            "writeStream.option('checkpointLocation', '/path/to/checkpoint')",
            option="checkpointLocation",
        )
    if opts.markers_on is None:
        raise ConfigError(
            f"{CONTEXT}: without option 'topic' (rows name their own topics) the sink needs option 'marker.topic', "
            "an existing topic against whose partition 0 it keeps its markers (e.g. one of the topics it writes)",
            option="marker.topic",
        )
    for column in ("value", "key"):  # the subject options of a column written as it is would be ignored: refused
        given = [
            name
            for name, attr in (
                ("subject", "subject"),
                ("subject.name.strategy", "subject_strategy"),
                ("record.name", "record_name"),
            )
            if getattr(opts, f"{column}_{attr}")
        ]
        if given and getattr(opts, f"{column}_format") == "raw":
            raise ConfigError(
                f"{CONTEXT}: option '{column}.{given[0]}' names the Schema Registry subject of an encoded {column}, and "
                f"the {column} is written as it is ({column}.format=raw): set {column}.format=avro or json-schema, or drop "
                "it",
                option=f"{column}.{given[0]}",
            )
    return opts
