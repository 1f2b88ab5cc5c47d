"""The kafka-eos source's decoded key and value columns (``key.format``/``value.format`` other than ``raw``).

The reader schema is looked up when the query is planned and fixes the column's Spark type; each task decodes
its records onto it (``eos_core.registry_avro``) after they are read, so the offsets a batch covers, and what
it replays, are those of the raw records: a record that cannot be decoded fails the batch, naming its topic,
partition, offset and writer schema id, and is never skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructField, StructType

from eos_core.registry_avro import AvroDecoder, RegistryConf, reader_schema, spark_type
from sources.kafka.option_specs import KafkaSourceOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["column_decoders", "decode_batch", "decoded_schema"]

_COLUMNS = ("key", "value")


def registry_conf(opts: KafkaSourceOptions) -> RegistryConf:
    return RegistryConf(
        url=(opts.schema_registry_url or "").strip(),
        user_info=opts.schema_registry_user_info,
        ca_location=opts.schema_registry_ca,
        timeout_ms=opts.schema_registry_timeout_ms,
    )


def column_decoders(opts: KafkaSourceOptions) -> dict[str, AvroDecoder]:
    """A decoder per decoded column (``key``, ``value``), its reader schema resolved now."""
    if not opts.decodes:
        return {}
    conf = registry_conf(opts)
    topics = opts.named_topics
    decoders = {}
    for column in _COLUMNS:
        if getattr(opts, f"{column}_format") == "raw":
            continue
        subject = getattr(opts, f"{column}_subject") or (f"{topics[0]}-{column}" if topics else "")
        schema = reader_schema(conf, subject, getattr(opts, f"{column}_schema"), option=f"{column}.schema")
        spark, _ = spark_type(schema.text, option=f"{column}.schema")
        decoders[column] = AvroDecoder(conf, schema, spark, column=column)
    return decoders


def decoded_schema(base: StructType, decoders: dict[str, AvroDecoder]) -> StructType:
    """Spark's Kafka schema with each decoded column's type (nullable: a null key, a tombstone)."""
    if not decoders:
        return base
    fields = []
    for f in base.fields:
        if f.name in decoders:
            fields.append(StructField(f.name, decoders[f.name].spark, True))
        else:
            fields.append(f)
    return StructType(fields)


def decode_batch(batch: pa.RecordBatch, decoders: dict[str, AvroDecoder]) -> pa.RecordBatch:
    """``batch`` (Kafka's columns, raw) with each decoded column replaced by its decoded values."""
    import pyarrow as pa

    names = batch.schema.names
    topics, partitions, offsets = (batch.column(names.index(c)) for c in ("topic", "partition", "offset"))

    def where(i: int) -> str:
        return f"topic {topics[i].as_py()} partition {partitions[i].as_py()} offset {offsets[i].as_py()}"

    columns: list[Any] = list(batch.columns)
    fields = list(batch.schema)
    for name, decoder in decoders.items():
        i = names.index(name)
        columns[i] = decoder.decode(batch.column(i).to_pylist(), where)
        fields[i] = pa.field(name, decoder.arrow_type)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
