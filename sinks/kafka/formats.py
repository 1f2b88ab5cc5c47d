"""The kafka-eos sink's encoded key and value columns (``key.format``/``value.format`` = ``avro``).

The writer schema is settled on the driver when Spark builds the writer, before any task runs: derived from the
column's Spark type and registered (``auto``: the registry's compatibility check refuses an incompatible change
there, so nothing of the batch is written), or a registered one the column's type must match. Each task turns
the struct column into Confluent's wire format (magic byte, schema id, Avro body) before anything else sees its
rows, so sizes, refusals, digests, staging and replays all work on the bytes written.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, StructField, StructType

from eos_core.errors import ConfigError
from eos_core.registry_avro import AvroEncoder, avro_schema, is_inline_schema, reader_schema, register, spark_type
from sinks.kafka.options import CONTEXT, KafkaSinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["column_encoders", "encode_batch", "encoded_schema"]

_COLUMNS = ("key", "value")


def column_encoders(opts: KafkaSinkOptions, schema: StructType) -> dict[str, AvroEncoder]:
    """An encoder per ``avro`` column, its writer schema registered (or found) now."""
    wanted = [c for c in _COLUMNS if getattr(opts, f"{c}_format") == "avro"]
    if not wanted:
        return {}
    if not (opts.schema_registry_url or "").strip():
        raise ConfigError(
            f"{CONTEXT}: option '{wanted[0]}.format' is 'avro', which registers the column's schema in a Schema "
            "Registry: set option 'schema.registry.url'",
            option="schema.registry.url",
        )
    conf = opts.registry_conf()
    fields = {f.name: f.dataType for f in schema.fields}
    encoders = {}
    for column in wanted:
        option = f"{column}.schema"
        if column not in fields:
            continue  # no key column: no key; check_schema names a missing value
        spec = getattr(opts, f"{column}_schema").strip()
        column_type = fields[column]
        record_name = _record_name(opts, column)
        if spec == "auto":
            text = _json(avro_schema(column_type, name=record_name or "topLevelRecord", option=f"{column}.format"))
            subject = _subject(opts, column, record_name)
            schema_id = register(conf, subject, text, option=option)
        elif is_inline_schema(spec):
            spark_type(spec, option=option)  # a ConfigError naming the option when it is no Avro schema
            inline_name = _full_name(spec)
            if record_name and inline_name != record_name:
                raise ConfigError(
                    f"{CONTEXT}: option '{column}.record.name' is {record_name!r} and the schema given inline in "
                    f"'{column}.schema' names its record {inline_name!r}: drop {column}.record.name (an inline "
                    "schema names its own record), or make the two agree",
                    option=f"{column}.record.name",
                )
            subject = _subject(opts, column, inline_name)
            text, schema_id = spec, register(conf, subject, spec, option=option)
        else:  # a registered schema: id:N needs no subject (rows naming their topics may give none)
            by_id = spec.lower().startswith("id:")
            subject = (getattr(opts, f"{column}_subject") or "") if by_id else _subject(opts, column, record_name)
            found = reader_schema(conf, subject, spec, option=option)
            text, schema_id = found.text, int(found.schema_id or 0)
        written, _ = spark_type(text, option=option)
        if spec != "auto" and written.simpleString() != column_type.simpleString():  # auto: derived from the column
            raise ConfigError(
                f"{CONTEXT}: the {column} column is {column_type.simpleString()}, and the schema {spec!r}"
                + (f" of subject {subject!r}" if subject else "")
                + f" (id {schema_id}) writes {written.simpleString()}: select the column to match it, or "
                f"let {column}.schema=auto register the column's own",
                option=option,
            )
        encoders[column] = AvroEncoder(text, schema_id, column_type, column=column)
    return encoders


def _subject(opts: KafkaSinkOptions, column: str, record: str | None) -> str:
    """The subject the column's schema is registered under: option ``<column>.subject``, or by the column's subject
    naming strategy from the topic and the record's full name (``record``: None where it is not known yet)."""
    given = getattr(opts, f"{column}_subject")
    strategy = getattr(opts, f"{column}_subject_strategy")
    if given:
        if strategy:
            raise ConfigError(
                f"{CONTEXT}: options '{column}.subject' and '{column}.subject.name.strategy' both name the subject; "
                "give one",
                option=f"{column}.subject.name.strategy",
            )
        return str(given)
    strategy = strategy or "topic"
    if strategy != "record" and not opts.topic:
        raise ConfigError(
            f"{CONTEXT}: option '{column}.format' is 'avro' and the rows name their topics, so the {strategy} "
            f"naming strategy has no topic to name the subject after: set option '{column}.subject.name.strategy' "
            f"to record (the record's full name), or name the subject with option '{column}.subject'",
            option=f"{column}.subject",
        )
    if strategy == "topic":
        return f"{opts.topic}-{column}"
    if record is None:
        raise ConfigError(
            f"{CONTEXT}: option '{column}.subject.name.strategy' is {strategy!r}, which names the subject after the "
            f"record's full name, and the {column} column's record has none of its own (to_avro's topLevelRecord "
            f"would be every topic's): name it with option '{column}.record.name' (namespace.Name), or the subject "
            f"with '{column}.subject'",
            option=f"{column}.record.name",
        )
    return record if strategy == "record" else f"{opts.topic}-{record}"


_FULL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _record_name(opts: KafkaSinkOptions, column: str) -> str | None:
    """Option ``<column>.record.name``, checked to be an Avro full name."""
    name = (getattr(opts, f"{column}_record_name") or "").strip() or None
    if name is not None and not _FULL_NAME.fullmatch(name):
        raise ConfigError(
            f"{CONTEXT}: option '{column}.record.name' is {name!r}, not an Avro full name: dot-separated names "
            "of letters, digits and _, none starting with a digit (e.g. com.acme.Payment)",
            option=f"{column}.record.name",
        )
    return name


def _full_name(text: str) -> str | None:
    """An inline schema's full name (``namespace.name``), None when it is not a named type."""
    import json

    schema = json.loads(text)
    if not isinstance(schema, dict) or "name" not in schema:
        return None
    name = str(schema["name"])
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _json(schema: dict[str, Any]) -> str:
    import json

    return json.dumps(schema, separators=(",", ":"))


def encoded_schema(schema: StructType, encoders: dict[str, AvroEncoder]) -> StructType:
    """The rows' schema as the rest of the sink sees it: each encoded column binary."""
    if not encoders:
        return schema
    return StructType([StructField(f.name, BinaryType(), True) if f.name in encoders else f for f in schema.fields])


def encode_batch(batch: pa.RecordBatch, encoders: dict[str, AvroEncoder]) -> pa.RecordBatch:
    """``batch`` with each encoded column replaced by its wire-format bytes."""
    import pyarrow as pa

    names = batch.schema.names

    def where(i: int) -> str:
        return f"row {i} of the batch"

    columns = list(batch.columns)
    fields = list(batch.schema)
    for name, encoder in encoders.items():
        i = names.index(name)
        columns[i] = pa.array(encoder.encode(batch.column(i).to_pylist(), where), type=pa.binary())
        fields[i] = pa.field(name, pa.binary())
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
