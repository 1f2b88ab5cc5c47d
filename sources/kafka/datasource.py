"""The kafka-eos data source: Spark's Kafka schema and options; its readers (sources.kafka.readers) and the sink's writers are imported on demand."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from eos_core.errors import ConfigError
from eos_core.options import parse_bool

if TYPE_CHECKING:
    from sources.kafka.readers import KafkaBatchReader, KafkaStreamReader

__all__ = ["FORMAT", "KafkaEosDataSource", "kafka_schema", "write_options"]

log = logging.getLogger(__name__)

FORMAT = "kafka-eos"


def kafka_schema(include_headers: bool = False) -> StructType:
    """Spark's Kafka source schema, field for field."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(
            StructField(
                "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
            )
        )
    return StructType(fields)


def write_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A write's options without the source's own, each dropped with a log line: one options map may serve a
    read and a write, and Spark's Kafka sink ignores a read's options too. The sink's own options (``topic``,
    ``faults``: both directions have them) and ``kafka.*`` stay. The format owns this rule because it knows
    both directions; the sink (``sinks.kafka``) knows only its own options and refuses any other."""
    from sinks.kafka.options import OPTIONS as SINK_OPTIONS
    from sources.kafka.options import OPTIONS

    sink = set(SINK_OPTIONS.by_key)
    read_only = {o.name.lower() for o in OPTIONS.options} - sink
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        if str(key).lower() in read_only:
            log.info("%s: ignoring option '%s': a Kafka source option, no meaning on a write", FORMAT, key)
        else:
            kept[key] = value
    return kept


class KafkaEosDataSource(DataSource):
    """``format("kafka-eos")``: Kafka as Spark reads it (``readStream``, ``read``), and written exactly once
    (``writeStream``, ``write``: the sink in ``sinks.kafka``)."""

    write_options = staticmethod(write_options)  # what a foreachBatch adapter of the sink drops as writer() does

    @classmethod
    def name(cls) -> str:
        # spark.dataSource.register() calls name() in the driver's Python, before any query: the one place
        # to tell that Spark's Python workers cannot import kafka-eos (they run PYSPARK_PYTHON, not this
        # interpreter). In a worker there is no active SparkContext and nothing is checked.
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is not None:
            from sources.kafka.workers import check_python_workers

            check_python_workers(sc, cls.__module__.rsplit(".", 1)[0])
        return FORMAT

    def _headers(self) -> bool:
        raw = next((v for k, v in self.options.items() if k.lower() == "includeheaders"), "false")
        try:
            return parse_bool(raw)
        except ValueError:
            raise ConfigError(
                f"kafka-eos: option 'includeHeaders' is {raw!r}; expected true or false", option="includeHeaders"
            ) from None

    def _decodes(self) -> bool:
        return any(
            k.lower() in ("key.format", "value.format") and str(v).strip().lower() != "raw"
            for k, v in self.options.items()
        )

    def schema(self) -> StructType:
        if not self._decodes():
            return kafka_schema(self._headers())
        # key.format/value.format: the reader schemas' Spark types, looked up in the Schema Registry now
        from sources.kafka.formats import column_decoders, decoded_schema
        from sources.kafka.options import parse_options

        opts = parse_options(dict(self.options), streaming=False)
        return decoded_schema(kafka_schema(self._headers()), column_decoders(opts), flat=opts.value_layout == "flat")

    def _decoders(self, schema: StructType, opts: Any) -> dict[str, Any]:
        """The decoders of the read, checked against the schema Spark planned with."""
        decoders: dict[str, Any] = {}
        if opts.decodes:
            from sources.kafka.formats import column_decoders, decoded_schema

            decoders = column_decoders(opts)
            expected = decoded_schema(kafka_schema(opts.include_headers), decoders, flat=opts.value_layout == "flat")
        else:
            expected = kafka_schema(opts.include_headers)
        if schema is not None and schema != expected:
            if opts.decodes:
                raise ConfigError(
                    "kafka-eos: the reader schema changed while the query was planned (its subject got a new latest "
                    "version?), or .schema(...) was given: plan again, pin value.schema/key.schema to a version, "
                    "and drop .schema(...)",
                    option="value.schema",
                )
            raise ConfigError(
                "kafka-eos: the Kafka source has a fixed schema and cannot be given a custom one; drop .schema(...) "
                "and cast the key/value columns instead"
            )
        return decoders

    # the readers (the planner, the client, confluent-kafka) are imported here, by the processes that read:
    # Spark's other planner processes import this module only to unpickle the class (sources.kafka.readers)
    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        from sources.kafka.options import parse_options
        from sources.kafka.readers import KafkaStreamReader

        opts = parse_options(dict(self.options), streaming=True)
        return KafkaStreamReader(opts, self._decoders(schema, opts))

    def reader(self, schema: StructType) -> KafkaBatchReader:
        from sources.kafka.options import parse_options
        from sources.kafka.readers import KafkaBatchReader

        opts = parse_options(dict(self.options), streaming=False)
        return KafkaBatchReader(opts, self._decoders(schema, opts))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from sinks.kafka.spark import KafkaBatchWriter

        if overwrite:
            raise ConfigError(
                f"{FORMAT}: save mode 'overwrite' cannot be honoured by a Kafka topic (records are appended); use "
                "mode('append')",
                option="mode",
            )
        return KafkaBatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        # Complete output mode arrives as overwrite=True: as Spark's Kafka sink, every batch appends the whole
        # result (once per batch).
        from sinks.kafka.spark import KafkaStreamWriter

        return KafkaStreamWriter(write_options(self.options), schema)
