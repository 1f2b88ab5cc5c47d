"""The kafka-eos source's decoded key and value columns (``key.format``/``value.format`` other than ``raw``).

The reader schema is looked up when the query is planned and fixes the column's Spark type; each task decodes
its records onto it (``eos_core.registry_avro``) after they are read, so the offsets a batch covers, and what
it replays, are those of the raw records: a record that cannot be decoded fails the batch, naming its topic,
partition, offset and writer schema id, and is never skipped. With ``errors.tolerance=all`` it is kept instead,
its decoded column null and a ``decode_errors`` column (``DECODE_ERRORS``) saying, for each column that did not
decode, the writer schema id, why, and its bytes, for the query to route where it wants (a dead-letter table or
topic). With ``value.layout=flat`` the decoded value's fields are columns of their own, in the value column's place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType

from eos_core.errors import ConfigError
from eos_core.registry_avro import AvroDecoder, reader_schema, spark_type
from sources.kafka.option_specs import KafkaSourceOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DECODE_ERRORS", "column_decoders", "decode_batch", "decoded_schema"]

_COLUMNS = ("key", "value")
DECODE_ERRORS = StructField(
    "decode_errors",
    ArrayType(
        StructType(
            [
                StructField("column", StringType(), False),  # key or value
                StructField("schema_id", IntegerType(), True),  # the writer schema id, when the header had one
                StructField("message", StringType(), False),  # why, naming topic, partition and offset
                StructField("payload", BinaryType(), False),  # the bytes that could not be decoded
            ]
        ),
        False,
    ),
    True,  # null: the record decoded; else one entry per column that did not (key first)
)


def column_decoders(opts: KafkaSourceOptions) -> dict[str, Any]:
    """A decoder per decoded column (``key``, ``value``), its reader schema resolved now."""
    if not opts.decodes:
        return {}
    conf = opts.registry_conf()
    topics = opts.named_topics
    decoders: dict[str, Any] = {}
    for column in _COLUMNS:
        if getattr(opts, f"{column}_format") == "raw":
            continue
        subject = getattr(opts, f"{column}_subject") or (f"{topics[0]}-{column}" if topics else "")
        option, tolerate = f"{column}.schema", opts.errors_tolerance == "all"
        if getattr(opts, f"{column}_format") == "json-schema":
            from eos_core import registry_json

            spec = getattr(opts, f"{column}_schema")
            schema = reader_schema(conf, subject, spec, option=option, kind="JSON", parse=registry_json.parse_schema)
            json_type, _ = registry_json.spark_type(schema.text, option=option)
            decoders[column] = registry_json.JsonSchemaDecoder(
                conf, schema, json_type, column=column, tolerate=tolerate
            )
            continue
        schema = reader_schema(conf, subject, getattr(opts, f"{column}_schema"), option=option)
        spark, _ = spark_type(schema.text, option=option)
        decoders[column] = AvroDecoder(conf, schema, spark, column=column, tolerate=tolerate)
    return decoders


def decoded_schema(base: StructType, decoders: dict[str, Any], *, flat: bool = False) -> StructType:
    """Spark's Kafka schema with each decoded column's type (nullable: a null key, a tombstone), the value's
    fields in its place when ``flat`` (value.layout=flat), and ``decode_errors`` last with errors.tolerance=all."""
    if not decoders:
        return base
    tolerate = any(d.tolerate for d in decoders.values())
    fields = []
    for f in base.fields:
        if f.name == "value" and flat:
            fields.extend(_flat_fields(decoders["value"].spark, base, tolerate))
        elif f.name in decoders:
            fields.append(StructField(f.name, decoders[f.name].spark, True))
        else:
            fields.append(f)
    if tolerate:
        fields.append(DECODE_ERRORS)
    return StructType(fields)


def _flat_fields(value: Any, base: StructType, tolerate: bool) -> list[StructField]:
    """The value's fields as top-level columns, each nullable (a tombstone, an undecodable record), refused when
    the reader schema is not a record or a field's name is one of Kafka's columns."""
    if not isinstance(value, StructType):
        raise ConfigError(
            f"kafka-eos: option 'value.layout' is 'flat', and the value's reader schema is {value.simpleString()}, "
            "not a record: only a record's fields can be columns; drop value.layout (the value column holds it)",
            option="value.layout",
        )
    taken = {f.name.lower() for f in base.fields if f.name != "value"} | ({DECODE_ERRORS.name} if tolerate else set())
    clash = [f.name for f in value.fields if f.name.lower() in taken]
    names = [f.name.lower() for f in value.fields]
    twins = sorted({f.name for f in value.fields if names.count(f.name.lower()) > 1})
    if twins:
        raise ConfigError(
            f"kafka-eos: option 'value.layout' is 'flat', and the value's fields {', '.join(twins)} differ only in "
            "case: as columns Spark could not tell them apart; keep value.layout=struct, or read with a reader schema "
            "(value.schema) that names them apart",
            option="value.layout",
        )
    if clash:
        raise ConfigError(
            f"kafka-eos: option 'value.layout' is 'flat', and the value's field(s) {', '.join(clash)} would take the "
            f"name of Kafka's column(s) of the same name: keep value.layout=struct (select value.{clash[0]} under "
            "a name of your choosing), or read with a reader schema (value.schema) that names them otherwise",
            option="value.layout",
        )
    return [StructField(f.name, f.dataType, True, f.metadata) for f in value.fields]


def decode_batch(batch: pa.RecordBatch, decoders: dict[str, Any], *, flat: bool = False) -> pa.RecordBatch:
    """``batch`` (Kafka's columns, raw) with each decoded column replaced by its decoded values (the value's
    fields in its place when ``flat``: ``decoded_schema``'s layout)."""
    import pyarrow as pa

    names = batch.schema.names
    topics, partitions, offsets = (batch.column(names.index(c)) for c in ("topic", "partition", "offset"))

    def where(i: int) -> str:
        return f"topic {topics[i].as_py()} partition {partitions[i].as_py()} offset {offsets[i].as_py()}"

    columns: list[Any] = list(batch.columns)
    fields = list(batch.schema)
    tolerate = any(d.tolerate for d in decoders.values())
    failed: dict[int, list[dict[str, Any]]] = {}  # row -> its decode_errors, one per column that failed
    for name, decoder in decoders.items():
        i = names.index(name)
        payloads = batch.column(i).to_pylist()
        errors: dict[int, tuple[int | None, str]] | None = {} if tolerate else None
        columns[i] = decoder.decode(payloads, where, errors)
        fields[i] = pa.field(name, decoder.arrow_type)
        for row, (schema_id, message) in (errors or {}).items():
            entry = {"column": name, "schema_id": schema_id, "message": message, "payload": payloads[row]}
            failed.setdefault(row, []).append(entry)
    if tolerate:
        from pyspark.sql.pandas.types import to_arrow_type

        arrow = to_arrow_type(DECODE_ERRORS.dataType, timezone="UTC")
        columns.append(pa.array([failed.get(row) for row in range(batch.num_rows)], type=arrow))
        fields.append(pa.field(DECODE_ERRORS.name, arrow))
    if flat:
        i = names.index("value")
        struct = columns[i]  # an Array (the decoder's pa.array)
        # flatten() ands each field with the struct's own validity: a null value nulls every field
        inner = [pa.field(f.name, f.type, True) for f in struct.type]
        columns[i : i + 1] = struct.flatten()
        fields[i : i + 1] = inner
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
