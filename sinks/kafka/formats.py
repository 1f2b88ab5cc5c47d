"""The kafka-eos sink's encoded key and value columns (``key.format``/``value.format`` = ``avro`` | ``json-schema``).

The writer schema is settled on the driver when Spark hands the writer to the tasks, before any task runs (never in
the process that commits the batch, which encodes nothing and so imports no registry client): derived from the
column's Spark type and registered (``auto``: the registry's compatibility check refuses an incompatible change
there, so nothing of the batch is written), or a registered one the column's type must match. Each task turns
the struct column into Confluent's wire format (magic byte, schema id, Avro or JSON body) before anything else sees its
rows, so sizes, refusals, digests, staging and replays all work on the bytes written.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, DataType, StructField, StructType

from eos_core import registry_json
from eos_core.errors import ConfigError
from eos_core.registry_avro import (
    AvroEncoder,
    RegistryConf,
    avro_schema,
    is_inline_schema,
    reader_schema,
    register,
    spark_type,
)
from eos_core.registry_json import JsonSchemaEncoder
from sinks.kafka.options import CONTEXT, KafkaSinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Encoder", "column_encoders", "encode_batch", "encoded_columns", "encoded_schema"]

_COLUMNS = ("key", "value")
Encoder = AvroEncoder | JsonSchemaEncoder


def column_encoders(opts: KafkaSinkOptions, schema: StructType) -> dict[str, Encoder]:
    """An encoder per encoded column (``avro``, ``json-schema``), its writer schema registered (or found) now."""
    wanted = [c for c in _COLUMNS if getattr(opts, f"{c}_format") != "raw"]
    if not wanted:
        return {}
    if not (opts.schema_registry_url or "").strip():
        raise ConfigError(
            f"{CONTEXT}: option '{wanted[0]}.format' is {getattr(opts, f'{wanted[0]}_format')!r}, which registers the "
            "column's schema in a Schema Registry: set option 'schema.registry.url'",
            option="schema.registry.url",
        )
    conf = opts.registry_conf()
    encoders: dict[str, Encoder] = {}
    for column in encoded_columns(opts, schema):  # no key column: no key; check_schema names a missing value
        build = _avro_encoder if getattr(opts, f"{column}_format") == "avro" else _json_encoder
        encoders[column] = build(opts, conf, column, schema[column].dataType)
    return encoders


def _avro_encoder(opts: KafkaSinkOptions, conf: RegistryConf, column: str, column_type: DataType) -> AvroEncoder:
    option = f"{column}.schema"
    spec = getattr(opts, f"{column}_schema").strip()
    record_name = _record_name(opts, column)
    if spec == "auto":
        text = _json(avro_schema(column_type, name=record_name or "topLevelRecord", option=f"{column}.format"))
        subject = _subject(opts, column, record_name)
        schema_id = register(conf, subject, text, option=option)
    elif is_inline_schema(spec):
        spark_type(spec, option=option)  # a ConfigError naming the option when it is no Avro schema
        subject = _subject(opts, column, _inline_name(opts, column, _full_name(spec), record_name))
        text, schema_id = spec, register(conf, subject, spec, option=option)
    else:
        text, schema_id, subject = _registered(opts, conf, column, spec, record_name)
    written, _ = spark_type(text, option=option)
    if spec != "auto" and written.simpleString() != column_type.simpleString():  # auto: derived from the column
        raise _mismatch(column, column_type.simpleString(), spec, subject, schema_id, written.simpleString())
    return AvroEncoder(text, schema_id, column_type, column=column)


def _json_encoder(opts: KafkaSinkOptions, conf: RegistryConf, column: str, column_type: DataType) -> JsonSchemaEncoder:
    """As ``_avro_encoder``, for ``json-schema``: the record's name is the schema's ``title`` (as Confluent's
    serializers name a JSON Schema's record for the record naming strategies); a schema the user gave is checked
    to read back as the column's type, and each value is validated against it when written."""
    option = f"{column}.schema"
    spec = getattr(opts, f"{column}_schema").strip()
    record_name = _record_name(opts, column)
    if spec == "auto":
        text = _json(registry_json.json_schema(column_type, title=record_name, option=f"{column}.format"))
        subject = _subject(opts, column, record_name)
        schema_id = register(conf, subject, text, option=option, kind="JSON")
    elif is_inline_schema(spec):
        title = registry_json.parse_schema(spec, option).get("title")
        subject = _subject(
            opts, column, _inline_name(opts, column, title if isinstance(title, str) else None, record_name)
        )
        text, schema_id = spec, register(conf, subject, spec, option=option, kind="JSON")
    else:
        text, schema_id, subject = _registered(opts, conf, column, spec, record_name, kind="JSON")
    if spec != "auto":
        written = registry_json.canonical(registry_json.spark_type(text, option=option)[0])
        wanted = registry_json.read_as(column_type, option=f"{column}.format")
        if written != wanted:
            raise _mismatch(column, wanted, spec, subject, schema_id, written)
    return JsonSchemaEncoder(text, schema_id, column_type, column=column, validate=spec != "auto")


def _inline_name(opts: KafkaSinkOptions, column: str, inline: str | None, record_name: str | None) -> str | None:
    """The record name of a schema given inline (Avro: its full name; JSON Schema: its title), which
    ``<column>.record.name`` may repeat but not contradict."""
    if record_name and inline != record_name:
        raise ConfigError(
            f"{CONTEXT}: option '{column}.record.name' is {record_name!r} and the schema given inline in "
            f"'{column}.schema' names "
            + (f"its record {inline!r}" if inline else "no record (an Avro name, a JSON Schema title)")
            + f": drop {column}.record.name (an inline "
            "schema names its own record), or make the two agree",
            option=f"{column}.record.name",
        )
    return inline


def _registered(
    opts: KafkaSinkOptions, conf: RegistryConf, column: str, spec: str, record_name: str | None, *, kind: str = "AVRO"
) -> tuple[str, int, str]:
    """A registered schema's text, id and subject: id:N needs no subject (rows naming their topics may give none)."""
    by_id = spec.lower().startswith("id:")
    subject = (getattr(opts, f"{column}_subject") or "") if by_id else _subject(opts, column, record_name)
    how = {"kind": kind, "parse": registry_json.parse_schema} if kind == "JSON" else {}
    found = reader_schema(conf, subject, spec, option=f"{column}.schema", **how)  # type: ignore[arg-type]
    return found.text, int(found.schema_id or 0), subject


def _mismatch(column: str, have: str, spec: str, subject: str, schema_id: int, written: str) -> ConfigError:
    return ConfigError(
        f"{CONTEXT}: the {column} column is {have}, and the schema {spec!r}"
        + (f" of subject {subject!r}" if subject else "")
        + f" (id {schema_id}) writes {written}: select the column to match it, or "
        f"let {column}.schema=auto register the column's own",
        option=f"{column}.schema",
    )


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
            f"{CONTEXT}: option '{column}.format' is {getattr(opts, f'{column}_format')!r} and the rows name their topics, so the {strategy} "
            f"naming strategy has no topic to name the subject after: set option '{column}.subject.name.strategy' "
            f"to record (the record's full name), or name the subject with option '{column}.subject'",
            option=f"{column}.subject",
        )
    if strategy == "topic":
        return f"{opts.topic}-{column}"
    if record is None:
        raise ConfigError(
            f"{CONTEXT}: option '{column}.subject.name.strategy' is {strategy!r}, which names the subject after the "
            f"record's full name, and the {column} column's record has none of its own (avro: to_avro's "
            f"topLevelRecord would be every topic's; json-schema: the schema has no title): name it with option "
            f"'{column}.record.name' (namespace.Name), or the subject with '{column}.subject'",
            option=f"{column}.record.name",
        )
    return record if strategy == "record" else f"{opts.topic}-{record}"


_FULL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _record_name(opts: KafkaSinkOptions, column: str) -> str | None:
    """Option ``<column>.record.name``, checked to be a full name (Avro's rules; a JSON Schema's title alike)."""
    name = (getattr(opts, f"{column}_record_name") or "").strip() or None
    if name is not None and not _FULL_NAME.fullmatch(name):
        raise ConfigError(
            f"{CONTEXT}: option '{column}.record.name' is {name!r}, not a record's full name: dot-separated names "
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


def encoded_columns(opts: KafkaSinkOptions, schema: StructType) -> list[str]:
    """The columns of ``schema`` the options encode (``avro``, ``json-schema``)."""
    return [c for c in _COLUMNS if getattr(opts, f"{c}_format") != "raw" and c in schema.names]


def encoded_schema(schema: StructType, encoded: Collection[str]) -> StructType:
    """The rows' schema as the rest of the sink sees it: each encoded column binary."""
    if not encoded:
        return schema
    return StructType([StructField(f.name, BinaryType(), True) if f.name in encoded else f for f in schema.fields])


def encode_batch(batch: pa.RecordBatch, encoders: dict[str, Encoder]) -> pa.RecordBatch:
    """``batch`` with each encoded column replaced by its wire-format bytes."""
    import pyarrow as pa

    names = batch.schema.names

    def where(i: int) -> str:
        return f"row {i} of the batch"

    columns = list(batch.columns)
    fields = list(batch.schema)
    for name, encoder in encoders.items():
        i = names.index(name)
        columns[i] = encoder.encode_arrow(batch.column(i), where)
        fields[i] = pa.field(name, pa.binary())
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
