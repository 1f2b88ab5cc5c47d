"""The kafka-eos source's options: Spark's names, types, defaults and descriptions, one field each.

``KafkaSourceOptions`` declares every option once (``eos_core.options.option``); ``OPTIONS`` is
the option set derived from it (docs: ``scripts/docs_options.py``). The checks across options are in
``option_checks``, the ``kafka.*`` translation to librdkafka in ``librdkafka``, and ``options``
parses a raw map with both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eos_core.errors import ConfigError
from eos_core.kafka_config import is_secret_option, redact_options, redacted_repr
from eos_core.options import OptionSet, option
from eos_core.registry_options import RegistryOptions
from sources.kafka.offsets import INT64_MAX

__all__ = [
    "CONTEXT",
    "DEFAULT_POLL_TIMEOUT_MS",
    "OPTIONS",
    "KafkaSourceOptions",
    "fail",
    "is_secret_option",
    "redact_options",
]

CONTEXT = "kafka-eos"
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark's default: spark.network.timeout (120 s)


@dataclass(frozen=True, kw_only=True)
class KafkaSourceOptions(RegistryOptions):
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
        max=INT64_MAX,
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
        description="File where the resolved start is persisted once (else batch 0's end records it in the checkpoint, see docs/kafka-source.md).",
    )
    ending_offsets: str | None = option(
        "endingOffsets", "str", description='Batch only: latest or JSON {"t":{"0":50}} (-1 latest). Default latest.'
    )
    ending_timestamp: int | None = option(
        "endingTimestamp",
        "int",
        min=0,
        max=INT64_MAX,
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
    value_format: str = option(
        "value.format",
        "choice",
        default="raw",
        choices=("raw", "avro", "json-schema"),
        description="raw: the value column holds the record's bytes (Spark's Kafka schema). avro: Confluent wire-format Avro, each record decoded with its writer schema (by id, from the Schema Registry) onto the reader schema value.schema, into a struct column (docs/formats.md). json-schema: Confluent wire-format JSON Schema, each record's JSON read onto the reader schema's Spark type.",
    )
    key_format: str = option(
        "key.format",
        "choice",
        default="raw",
        choices=("raw", "avro", "json-schema"),
        description="As value.format, for the key column (reader schema key.schema, subject key.subject).",
    )
    value_schema: str = option(
        "value.schema",
        "str",
        default="latest",
        description="The reader schema of value.format=avro: latest (the subject's latest version when the query is planned), version:N, id:N, or an Avro schema inline (JSON).",
    )
    key_schema: str = option("key.schema", "str", default="latest", description="As value.schema, for the key.")
    value_subject: str | None = option(
        "value.subject",
        "str",
        description="The subject value.schema names a version of. Default <topic>-value (Confluent's TopicNameStrategy), which needs exactly one topic.",
    )
    key_subject: str | None = option(
        "key.subject", "str", description="As value.subject, for the key (default <topic>-key)."
    )
    value_layout: str = option(
        "value.layout",
        "choice",
        default="struct",
        choices=("struct", "flat"),
        description="struct: the decoded value is one struct column, value. flat: its fields are top-level columns in value's place, beside Kafka's columns (a record schema whose field names differ from them; every field nullable: a tombstone or an undecodable record nulls them all).",
    )
    errors_tolerance: str = option(
        "errors.tolerance",
        "choice",
        default="none",
        choices=("none", "all"),
        description="none: a record value.format/key.format=avro cannot decode fails the batch, naming it. all: it is read with that column null and a decode_errors column (per column that failed: column, schema_id, message, payload) to route it by.",
    )
    faults: str | None = option(
        "faults",
        "str",
        description="Fault-injection spec for tests (see eos_core.faults); EOS_FAULTS adds to it.",
    )
    topic: str | None = option(
        "topic",
        "str",
        description="Spark's Kafka sink option (the topic written to): accepted so one options map serves "
        "the source and the sink; ignored on a read, with a log line.",
    )
    kafka: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Every option, the secret ones as ``***`` (``eos_core.kafka_config.redacted_repr``)."""
        return redacted_repr(self)

    __str__ = __repr__

    @property
    def named_topics(self) -> list[str]:
        """The topics subscribe or assign name (none for subscribePattern): a default subject's ``<topic>``."""
        return list(self.subscribe or []) or (list(self.assign) if isinstance(self.assign, dict) else [])

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
    def decodes(self) -> bool:
        """A key or value format other than raw: the columns are decoded with the Schema Registry's schemas."""
        return self.value_format != "raw" or self.key_format != "raw"

    @property
    def starting_is_group(self) -> bool:
        return (self.starting_offsets or "").strip().lower() == "group"


OPTIONS = OptionSet(CONTEXT, KafkaSourceOptions, passthrough=("kafka.",), passthrough_attr="kafka")


def fail(message: str, option: str) -> ConfigError:
    """The source's ConfigError naming ``option``."""
    return ConfigError(f"{CONTEXT}: {message}", option=option)
