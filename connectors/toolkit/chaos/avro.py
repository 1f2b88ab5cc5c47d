"""Avro in chaos runs: sample records from an Avro container file (``--records-file events.avro``), and records
in Confluent's wire format with a Schema Registry (``--value-format avro --schema FILE``: ``RegistryCodec``).

Registry-encoded records: each record's value (a JSON object of your workload: the generator's dicts, a records
file's objects; each checked against the schema before anything runs, ``check_records``) is written by
confluent-kafka's own ``AvroSerializer`` with the given schema under the subject ``<topic>-value`` of the run's topic
(Confluent's TopicNameStrategy; registered before the job starts, ``RegistryCodec.register``), so a job reads them
with ``value.format=avro``; the checker reads the source topic, and a Kafka sink job's output topic, back with
confluent-kafka's ``AvroDeserializer`` (each record by its own writer schema): the oracle is not the code it judges.

Container files:

Each record of the file becomes one Kafka record whose value is that record encoded as plain Avro
binary with the file's writer schema: the bytes Spark's ``from_avro(col("value"), schema_json)``
decodes (no Confluent schema-registry header; a job that expects one adds it in its ``build``), with
no key. The file's schema is returned beside the records, so a job or a test can hand it to
``from_avro``.

Reading Avro needs ``fastavro`` (``pip install 'spark-eos[avro]'``); without it the error says so.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from eos_core.errors import ConfigError

__all__ = ["RegistryCodec", "check_records", "read_avro_records", "read_schema_file"]


def _fastavro(option: str, path: str) -> Any:
    try:
        import fastavro
    except ImportError as exc:
        raise ConfigError(
            f"{option} {path!r}: reading Avro needs fastavro; install it with pip install 'spark-eos[avro]'"
        ) from exc
    return fastavro


def read_avro_records(path: str, n: int | None = None, *, option: str = "--records-file") -> tuple[list[bytes], str]:
    """The first ``n`` records of the container file ``path`` (all when ``n`` is None), each encoded
    as plain Avro binary, and the file's writer schema as JSON text."""
    fastavro = _fastavro(option, path)
    try:
        with open(path, "rb") as fh:
            reader = fastavro.reader(fh)
            schema = reader.writer_schema
            rows = []
            for i, row in enumerate(reader):
                if n is not None and i >= n:
                    break
                rows.append(row)
    except OSError as exc:
        raise ConfigError(f"{option} {path!r}: cannot read it ({exc.strerror})") from exc
    except (ValueError, EOFError) as exc:  # fastavro's errors for a file that is not Avro
        raise ConfigError(f"{option} {path!r}: not an Avro container file ({exc})") from exc
    if not rows:
        raise ConfigError(f"{option} {path!r}: no record in it")
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        out.append(buf.getvalue())
    return out, json.dumps(schema)


def read_schema_file(path: str, *, option: str = "--schema") -> str:
    """The Avro schema in ``path`` (an ``.avsc``: JSON), checked to be a record that Avro accepts; its text."""
    fastavro = _fastavro(option, path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{option} {path!r}: cannot read it ({exc.strerror})") from exc
    try:
        schema = json.loads(text)
        fastavro.parse_schema(schema)
    except Exception as exc:  # JSON's and fastavro's errors (UnknownType, SchemaParseException...) for a non-schema
        raise ConfigError(f"{option} {path!r}: not an Avro schema ({exc})") from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError(f"{option} {path!r}: an Avro record schema expected (each value is a record)")
    return json.dumps(schema)


def check_records(records: Sequence[Any], schema: str, option: str) -> None:
    """Each record's value (JSON text; None: a tombstone) is an object ``schema`` writes, before anything runs: a
    ConfigError naming the first that is not, and why."""
    fastavro = _fastavro("--schema", "")
    from fastavro.validation import ValidationError, validate

    parsed = fastavro.parse_schema(json.loads(schema))
    for i, rec in enumerate(records):
        if rec.value is None:
            continue
        try:
            validate(json.loads(rec.value), parsed, raise_errors=True)
        except (ValueError, ValidationError) as exc:  # not JSON, or the fields that do not fit
            raise ConfigError(f"{option}, record {i}: its value does not fit --schema: {exc}") from None


class RegistryCodec:
    """Record values to and from Confluent's wire format, with the registry at ``url``: ``register`` the schema
    ``schema`` under ``<topic>-value``, ``encode`` with it, ``decode`` by each record's own writer schema.
    confluent-kafka's serializers, with a request timeout (``confluent_client``); ``close`` when done."""

    def __init__(self, url: str, schema: str | None = None) -> None:
        self.url, self.schema = url, schema
        self._client: Any = None
        self._serializer: Any = None
        self._deserializer: Any = None

    def _registry(self) -> Any:
        if self._client is None:
            try:
                from connectors.services.schema_registry import confluent_client

                self._client = confluent_client(self.url)
            except ImportError as exc:
                raise ConfigError(
                    "--value-format avro: the Schema Registry's client is missing; install it with "
                    "pip install 'spark-eos[registry]'"
                ) from exc
        return self._client

    def close(self) -> None:
        """Close the registry client (its connections), if one was opened."""
        if self._client is not None:
            self._client.close()
            self._client = self._serializer = self._deserializer = None

    def __enter__(self) -> RegistryCodec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, topic: str) -> int:
        """Register the schema under ``<topic>-value`` now (before the job plans: it reads ``latest``); its id."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from eos_core.options import redact_userinfo

        assert self.schema is not None, "a codec that registers is given a schema"
        where = redact_userinfo(self.url)
        try:
            return int(self._registry().register_schema(f"{topic}-value", Schema(self.schema, "AVRO")))
        except SchemaRegistryError as exc:  # refused: incompatible with what the subject holds, invalid
            raise ConfigError(
                f"--schema: the Schema Registry at {where} refused it for {topic}-value: HTTP {exc.http_status_code} "
                f"{exc.error_message}"
            ) from None
        except Exception as exc:  # unreachable: connection refused, timeouts
            raise ConfigError(
                f"--schema-registry: the Schema Registry at {where} could not be reached to register {topic}-value "
                f"({type(exc).__name__}: {redact_userinfo(str(exc))}); is it up?"
            ) from None

    def encode(self, topic: str, value: bytes | None, where: str) -> bytes | None:
        """``value`` (a JSON object's text; None: a tombstone, kept) in the wire format under ``<topic>-value``."""
        if value is None:
            return None
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        if self._serializer is None:
            assert self.schema is not None, "a codec that encodes is given a schema"
            from confluent_kafka.schema_registry import topic_subject_name_strategy

            # TopicNameStrategy by name: confluent-kafka 2.16's default asks the registry's associations API first
            # (which Apicurio lacks, and answers late now and then: docs/formats.md)
            conf = {"subject.name.strategy": topic_subject_name_strategy}
            self._serializer = AvroSerializer(self._registry(), self.schema, conf=conf)
        try:
            record = json.loads(value)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: --value-format avro writes JSON objects as Avro records; not JSON ({exc})"
            ) from None
        try:
            out = self._serializer(record, SerializationContext(topic, MessageField.VALUE))
        except Exception as exc:  # a record the schema does not fit (fastavro's ValueError), a refused registration
            from eos_core.options import redact_userinfo

            raise ConfigError(f"{where}: not written with --schema: {redact_userinfo(str(exc))}") from None
        return bytes(out) if out is not None else None

    def decode(self, topic: str, value: bytes) -> Any:
        """The record a wire-format value of ``topic`` holds (a dict), read with its own writer schema."""
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        if self._deserializer is None:
            from confluent_kafka.schema_registry import topic_subject_name_strategy

            conf = {"subject.name.strategy": topic_subject_name_strategy}  # no associations look-up, as for encode
            self._deserializer = AvroDeserializer(self._registry(), conf=conf)
        return self._deserializer(value, SerializationContext(topic, MessageField.VALUE))
