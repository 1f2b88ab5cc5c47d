"""Confluent wire-format Avro with a Schema Registry: reader schemas, Avro -> Spark types, batch decoding.

A record in Confluent's wire format is a magic byte 0, the writer schema's id (4 bytes, big-endian), then the
Avro binary body. A decoder reads each record with its own writer schema (fetched by id from the registry once
per process) and projects it onto the reader schema by Avro's resolution rules (fastavro's: added fields take
their defaults, removed fields are skipped, int -> long -> float -> double promotions); a record that cannot be
read so is a ``FatalError`` naming its topic, partition, offset and schema id. The Spark type of a reader
schema is fixed when the query is planned (``spark_type``), as Spark's ``from_avro`` maps Avro (unions of null
and one type are nullable; unions of several types are refused, naming the field).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_core.errors import ConfigError, FatalError, RetriableError
from eos_core.options import redact_userinfo

__all__ = [
    "MAGIC",
    "AvroDecoder",
    "AvroEncoder",
    "ReaderSchema",
    "RegistryConf",
    "avro_schema",
    "decode_each",
    "is_inline_schema",
    "python_rows",
    "reader_schema",
    "register",
    "spark_type",
    "writer_schema",
]

MAGIC = 0
_HEADER = 5  # magic byte + schema id
DEFAULT_TIMEOUT_MS = 30_000  # per request
_MISSING_RETRY_S = 1.0
ATTEMPTS = 4  # confluent-kafka's client tries a request this often (max.retries=3), backing off 1-4 s between


@dataclass(frozen=True)
class RegistryConf:
    """How to reach a Schema Registry: its URL (Confluent's API), basic auth ``user:password``, a CA file, and how
    long one request may wait for an answer (confluent-kafka's client waits without end by default: a registry
    that accepts a connection and never answers, a paused or swapping JVM, would stall a task for ever)."""

    url: str
    user_info: str | None = field(default=None, repr=False)  # a secret
    ca_location: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def __repr__(self) -> str:  # never the credentials, in the URL or beside it
        return f"RegistryConf(url={self.shown_url!r}, ca_location={self.ca_location!r}, timeout_ms={self.timeout_ms})"

    @property
    def shown_url(self) -> str:
        """The URL for messages: a ``user:password@`` in it (confluent-kafka's client takes credentials there
        too) shown as ``***@``."""
        return redact_userinfo(self.url)

    def client_config(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"url": self.url, "timeout": self.timeout_ms / 1000, "max.retries": ATTEMPTS - 1}
        if self.user_info:
            conf["basic.auth.user.info"] = self.user_info
        if self.ca_location:
            conf["ssl.ca.location"] = self.ca_location
        return conf


_CLIENTS: dict[RegistryConf, Any] = {}
_LOCK = threading.Lock()


_EXTRA = "pip install 'spark-eos[registry]' (confluent-kafka's Schema Registry client and fastavro)"


def _client(conf: RegistryConf) -> Any:
    """One registry client per configuration per process (it caches schemas by id and by subject)."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:  # its extra (httpx, authlib, ...) missing, in the driver's or a worker's Python
        raise ConfigError(f"the avro formats need the Schema Registry client ({exc}): {_EXTRA}") from None

    with _LOCK:
        client = _CLIENTS.get(conf)
        if client is None:
            try:
                client = _CLIENTS[conf] = SchemaRegistryClient(conf.client_config())
            except ValueError as exc:  # "Invalid url ...": names the URL as given, credentials and all
                raise ConfigError(
                    f"option 'schema.registry.url' is {conf.shown_url!r}: {redact_userinfo(str(exc))} (expected "
                    "http(s)://host:port[/path])",
                    option="schema.registry.url",
                ) from None
        return client


def _registry_call(
    conf: RegistryConf, what: str, option: str, call: Callable[[], Any], *, record: str | None = None
) -> Any:
    """``call`` against the registry; its refusals are ConfigErrors naming ``option``, an unreachable registry
    a RetriableError naming its URL (never the credentials). A writer schema the registry does not have (HTTP
    404 for the ``record`` named) is that record's fault: a FatalError naming it."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return call()
    except (ConfigError, FatalError):
        raise
    except SchemaRegistryError as exc:
        # 40403: Confluent's "schema not found" (Apicurio answers it too); a bare 404 (a proxy, a wrong base path)
        # is the configuration's fault, never a record's
        if exc.http_status_code == 404 and exc.error_code == 40403 and record is not None:
            raise FatalError(
                f"kafka-eos: {record}: the registry at {conf.shown_url} has no {what.split(' (')[0]} (deleted, or the "
                f"record was written against another registry): HTTP 404 {exc.error_message}"
            ) from None
        if exc.http_status_code in (401, 403):
            raise ConfigError(
                f"the Schema Registry at {conf.shown_url} refused {what}: HTTP {exc.http_status_code} ({exc.error_message}); "
                "check schema.registry.basic.auth.user.info and the principal's rights there",
                option="schema.registry.basic.auth.user.info",
            ) from None
        if exc.http_status_code in (408, 429) or exc.http_status_code >= 500:  # still so after the client's retries
            raise RetriableError(
                f"the Schema Registry at {conf.shown_url} could not answer {what}: HTTP {exc.http_status_code} "
                f"{exc.error_message} (after {ATTEMPTS} attempts); is the registry healthy?"
            ) from None
        if exc.http_status_code == 422:
            raise ConfigError(
                f"the Schema Registry at {conf.shown_url} refused {what} as invalid: HTTP 422 {exc.error_message}",
                option=option,
            ) from None
        fix = ""
        if exc.http_status_code == 404 and what.startswith(("subject", "version")):  # a subject deleted, or misnamed
            fix = (
                f"; if the subject was deleted, register its schema again, or pin one: {option}=id:N (a registered "
                "schema's id; records keep their writer schema's) or the schema inline"
            )
        raise ConfigError(
            f"the Schema Registry at {conf.shown_url} has no {what}: HTTP {exc.http_status_code} {exc.error_message}"
            + fix,
            option=option,
        ) from None
    except Exception as exc:  # httpx's connection errors, TLS failures, timeouts
        if "Timeout" in type(exc).__name__:  # httpx.ConnectTimeout, ReadTimeout, WriteTimeout, PoolTimeout
            raise RetriableError(
                f"the Schema Registry at {conf.shown_url} could not be reached for {what}: no answer within "
                f"schema.registry.request.timeout.ms={conf.timeout_ms} in each of {ATTEMPTS} attempts "
                f"({type(exc).__name__}); is the registry up and answering?"
            ) from None
        raise RetriableError(
            f"the Schema Registry at {conf.shown_url} could not be reached for {what}: {type(exc).__name__}: "
            f"{redact_userinfo(str(exc))}"
            "; is schema.registry.url right and the registry up?"
        ) from None


@dataclass(frozen=True)
class ReaderSchema:
    """The Avro schema records are projected onto: its text, and its registry id when it came from there."""

    text: str
    schema_id: int | None
    subject: str | None


def is_inline_schema(spec: str) -> bool:
    """A reader schema option that holds the schema itself (JSON: a record, a union, a primitive's name)."""
    return spec.strip()[:1] in ("{", "[", '"')


def reader_schema(
    conf: RegistryConf,
    subject: str,
    spec: str,
    *,
    option: str,
    kind: str = "AVRO",
    parse: Callable[[str, str], Any] | None = None,
) -> ReaderSchema:
    """``spec``: ``latest`` (the subject's latest version), ``version:N``, ``id:N``, or a schema inline; an Avro
    schema, or one of the registry's schema type ``kind`` checked by ``parse(text, option)`` (``registry_json``)."""
    spec = spec.strip()

    def check(text: str) -> Any:
        return (parse or _parse)(text, option)

    if is_inline_schema(spec):
        check(spec)
        return ReaderSchema(spec, None, None)
    client = _client(conf)
    how, _, number = spec.partition(":")
    if spec == "latest":  # asked each time a query is planned: get_latest_version would answer from its cache
        found = _registry_call(conf, f"subject {subject!r}", option, lambda: client.get_version(subject, "latest"))
        schema, sid = found.schema, found.schema_id
    elif how == "version" and number.isdigit():
        what = f"version {number} of subject {subject!r}"
        found = _registry_call(conf, what, option, lambda: client.get_version(subject, int(number)))
        schema, sid = found.schema, found.schema_id
    elif how == "id" and number.isdigit():
        schema, sid = (
            _registry_call(conf, f"schema id {number}", option, lambda: client.get_schema(int(number))),
            int(number),
        )
    else:
        raise ConfigError(
            f"option {option!r} is {spec[:60]!r}; expected latest, version:N, id:N or an Avro schema (JSON)",
            option=option,
        )
    if (schema.schema_type or "AVRO") != kind:
        column = option.split(".")[0]
        fits = {"AVRO": "avro", "JSON": "json-schema"}.get(schema.schema_type or "AVRO")
        raise ConfigError(
            f"schema {sid} (subject {subject!r}) is {schema.schema_type or 'AVRO'}, and {column}.format reads "
            f"{kind}: " + (f"set {column}.format={fits}" if fits else "Protobuf is not read yet: keep the format raw"),
            option=option,
        )
    if schema.references:
        raise ConfigError(
            f"schema {sid} of subject {subject!r} references other schemas "
            f"({', '.join(r.name for r in schema.references)}): not supported yet; give the whole schema inline "
            f"in {option!r}",
            option=option,
        )
    check(schema.schema_str)
    return ReaderSchema(schema.schema_str, sid, subject)


def _parse(text: str, option: str) -> Any:
    try:
        import fastavro
    except ImportError:
        raise ConfigError(f"option {option!r}: reading Avro needs fastavro: {_EXTRA}", option=option) from None

    try:
        return fastavro.parse_schema(json.loads(text))  # marked parsed: a read does not parse it again
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ConfigError(f"option {option!r}: not an Avro schema: {exc}", option=option) from None


_PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
_LOGICAL: dict[str, DataType] = {
    "date": DateType(),
    "timestamp-millis": TimestampType(),
    "timestamp-micros": TimestampType(),
    "local-timestamp-millis": TimestampNTZType(),
    "local-timestamp-micros": TimestampNTZType(),
}


def spark_type(schema_text: str, *, option: str = "value.schema") -> tuple[DataType, bool]:
    """The Spark type of an Avro schema and whether it is nullable, as Spark's ``from_avro`` maps it."""
    return _spark(_parse(schema_text, option), "", option)


def _spark(s: Any, path: str, option: str) -> tuple[DataType, bool]:
    where = path or "the schema's top level"
    if isinstance(s, list):  # a union
        branches = [b for b in s if b != "null" and not (isinstance(b, dict) and b.get("type") == "null")]
        if len(branches) == 1:
            return _spark(branches[0], path, option)[0], True
        if not branches:
            raise ConfigError(f"{option}: {where} is a union of null only", option=option)
        raise ConfigError(
            f"{option}: {where} is a union of several types ({', '.join(_name(b) for b in branches)}): not supported "
            "yet; read that field as one type (a reader schema with one branch and null) or keep value.format=raw",
            option=option,
        )
    if isinstance(s, str):
        if s in _PRIMITIVES:
            return _PRIMITIVES[s], False
        raise ConfigError(f"{option}: {where} has type {s!r}, which has no Spark type", option=option)
    kind = s.get("type")
    logical = s.get("logicalType")
    if logical in _LOGICAL:
        return _LOGICAL[logical], False
    if logical == "decimal":
        return DecimalType(int(s["precision"]), int(s.get("scale", 0))), False
    if kind == "record":
        fields = []
        for f in s["fields"]:
            t, nullable = _spark(f["type"], f"{path}.{f['name']}" if path else f["name"], option)
            fields.append(StructField(f["name"], t, nullable))
        return StructType(fields), False
    if kind == "enum":
        return StringType(), False
    if kind == "fixed":
        return BinaryType(), False
    if kind == "array":
        t, nullable = _spark(s["items"], f"{path}[]", option)
        return ArrayType(t, nullable), False
    if kind == "map":
        t, nullable = _spark(s["values"], f"{path}{{}}", option)
        return MapType(StringType(), t, nullable), False
    if isinstance(kind, (str, list, dict)):  # {"type": "long"}, a nested type
        return _spark(kind, path, option)
    raise ConfigError(f"{option}: {where} has an Avro type Spark cannot hold: {json.dumps(s)[:80]}", option=option)


_Fix = Callable[[Any], Any]


def _time_millis(t: dt.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1000 + t.microsecond // 1000


def _time_micros(t: dt.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


_LOGICAL_FIXES: dict[str, _Fix] = {"uuid": str, "time-millis": _time_millis, "time-micros": _time_micros}


def _fixer(s: Any) -> _Fix | None:
    """What turns fastavro's values of the logical types it converts and Spark has no type for (uuid.UUID,
    datetime.time) into the underlying string or number, where ``s`` has such a type; None where it has none."""
    if isinstance(s, list):
        branches = [_fixer(b) for b in s if b != "null"]
        fix = next((f for f in branches if f is not None), None)
        return None if fix is None else (lambda v: None if v is None else fix(v))
    if not isinstance(s, dict):
        return None
    if s.get("logicalType") in _LOGICAL_FIXES:
        return _LOGICAL_FIXES[s["logicalType"]]
    kind = s.get("type")
    if kind == "record":
        fixes = {f["name"]: fx for f in s["fields"] for fx in [_fixer(f["type"])] if fx is not None}
        if not fixes:
            return None
        return lambda d: {k: (fixes[k](v) if k in fixes and v is not None else v) for k, v in d.items()}
    if kind == "array":
        item = _fixer(s["items"])
        return None if item is None else (lambda a: [item(x) if x is not None else None for x in a])
    if kind == "map":
        value = _fixer(s["values"])
        return None if value is None else (lambda m: {k: value(v) if v is not None else None for k, v in m.items()})
    return _fixer(kind) if isinstance(kind, (list, dict)) else None


def _name(s: Any) -> str:
    if isinstance(s, dict):
        return str(s.get("name") or s.get("type"))
    return str(s)


def writer_schema(conf: RegistryConf, schema_id: int, where: str, column: str) -> Any:
    """The registry's schema ``schema_id``, the writer schema of the record ``where`` names; a schema the registry
    does not have is asked for once more a second later (a replica that lags a registration), then that record's
    fault (FatalError)."""
    client = _client(conf)

    def fetch() -> Any:
        return _registry_call(
            conf,
            f"schema id {schema_id} (the writer schema of {where})",
            f"{column}.format",
            lambda: client.get_schema(schema_id),
            record=where,
        )

    try:
        return fetch()
    except FatalError:
        time.sleep(_MISSING_RETRY_S)
        return fetch()


def decode_each(
    payloads: list[bytes | None],
    where: Callable[[int], str],
    errors: dict[int, tuple[int | None, str]] | None,
    column: str,
    read: Callable[[int, bytes, str], Any],
) -> list[Any]:
    """Each payload in Confluent's wire format read by ``read(schema id, payload, where)``; None stays None. A
    record that cannot be read fails the batch (FatalError), or with ``errors`` is a None and ``errors[i]``."""
    out: list[Any] = []
    for i, payload in enumerate(payloads):
        if payload is None:
            out.append(None)
            continue
        schema_id = None
        try:
            if len(payload) < _HEADER or payload[0] != MAGIC:
                raise FatalError(
                    f"kafka-eos: {where(i)}: the {column} is not in Confluent's wire format (magic byte "
                    f"{payload[0] if payload else 'missing'}, {len(payload)} bytes); read it with "
                    f"{column}.format=raw, or fix what wrote it"
                )
            schema_id = int.from_bytes(payload[1:_HEADER], "big")
            out.append(read(schema_id, payload, where(i)))
        except FatalError as exc:
            if errors is None:
                raise
            errors[i] = (schema_id, str(exc))
            out.append(None)
    return out


class AvroDecoder:
    """Decodes a column of wire-format records onto one reader schema, into an Arrow array of its Spark type."""

    def __init__(
        self, conf: RegistryConf, reader: ReaderSchema, spark: DataType, *, column: str, tolerate: bool = False
    ) -> None:
        from pyspark.sql.pandas.types import to_arrow_type

        self.conf = conf
        self.reader = reader
        self.spark = spark  # the column's Spark type, fixed when the query was planned (spark_type)
        self.arrow_type = to_arrow_type(spark, timezone="UTC")
        self.column = column
        self.tolerate = tolerate  # errors.tolerance=all: an undecodable record is a null and an error, not a failure
        self._reader_parsed = _parse(reader.text, f"{column}.schema")
        self._fix = _fixer(self._reader_parsed)
        self._writers: dict[int, tuple[Any, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:  # pickled to executors: the parsed schemas are rebuilt there
        return {k: getattr(self, k) for k in ("conf", "reader", "spark", "column", "tolerate")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        conf, reader, spark = state["conf"], state["reader"], state["spark"]
        self.__init__(conf, reader, spark, column=state["column"], tolerate=state["tolerate"])  # type: ignore[misc]

    def _writer(self, schema_id: int, where: str) -> tuple[Any, Any]:
        """The writer schema of ``schema_id`` and the reader schema to resolve it to: None when the two are the
        same schema (Avro's parsing canonical form), which spares fastavro the resolution of every record."""
        import fastavro

        found = self._writers.get(schema_id)
        if found is None:
            schema = writer_schema(self.conf, schema_id, where, self.column)
            if schema.schema_type not in (None, "AVRO"):
                fits = "json-schema" if schema.schema_type == "JSON" else "raw"
                raise FatalError(
                    f"kafka-eos: {where}: the {self.column} was written with a {schema.schema_type} schema (id "
                    f"{schema_id}), not Avro: read it with {self.column}.format={fits}, or keep such records aside "
                    "with errors.tolerance=all"
                )
            writer = _parse(schema.schema_str, f"{self.column}.format")
            canonical = fastavro.schema.to_parsing_canonical_form
            same = canonical(writer) == canonical(self._reader_parsed)
            found = self._writers[schema_id] = (self._reader_parsed, None) if same else (writer, self._reader_parsed)
        return found

    def decode(
        self,
        payloads: list[bytes | None],
        where: Callable[[int], str],
        errors: dict[int, tuple[int | None, str]] | None = None,
    ) -> Any:
        """``payloads`` (None: a null key or value, a tombstone) as an Arrow array; ``where(i)`` names record i.
        A record that cannot be read fails the batch (FatalError), or with ``errors`` given is a null there and
        ``errors[i] = (writer schema id or None, why)``. An unreachable registry always fails (RetriableError)."""
        import fastavro
        import pyarrow as pa

        fix, writers = self._fix, self._writers

        def read(schema_id: int, payload: bytes, at: str) -> Any:
            writer, reader = writers.get(schema_id) or self._writer(schema_id, at)
            body = io.BytesIO(payload)
            body.seek(_HEADER)
            try:
                value = fastavro.schemaless_reader(body, writer, reader)
            except Exception as exc:
                raise FatalError(
                    f"kafka-eos: {at}: the {self.column} (writer schema id {schema_id}) cannot be read "
                    f"with the reader schema{_of(self.reader)}: {type(exc).__name__}: {exc}"
                ) from None
            return value if fix is None else fix(value)

        out = decode_each(payloads, where, errors, self.column, read)
        return pa.array(out, type=self.arrow_type)


def _of(reader: ReaderSchema) -> str:
    if reader.schema_id is None:
        return " given inline"
    return f" {reader.schema_id} (subject {reader.subject!r})" if reader.subject else f" {reader.schema_id}"


# ---- writing: Spark types -> Avro schemas, records -> wire format --------------------------------------------

_AVRO_OF: dict[str, Any] = {
    "boolean": "boolean",
    "tinyint": "int",
    "smallint": "int",
    "int": "int",
    "bigint": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "bytes",
    "date": {"type": "int", "logicalType": "date"},
    "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
    "timestamp_ntz": {"type": "long", "logicalType": "local-timestamp-micros"},
}


def avro_schema(spark: DataType, *, name: str = "topLevelRecord", option: str = "value.format") -> dict[str, Any]:
    """The Avro schema ``to_avro`` would write ``spark`` with (records named ``name`` and, nested, after their
    field path), a nullable field as ``["null", T]`` with default null so later versions may drop it."""
    out = _avro(spark, name, option)
    if not isinstance(out, dict) or out.get("type") != "record":
        raise ConfigError(f"{option}: the column is {spark.simpleString()}; avro writes a struct", option=option)
    return out


def _avro(t: DataType, name: str, option: str) -> Any:
    if isinstance(t, StructType):
        fields = []
        for f in t.fields:
            inner = _avro(f.dataType, f"{name}_{f.name}", option)
            fields.append(
                {"name": f.name, "type": ["null", inner], "default": None}
                if f.nullable
                else {"name": f.name, "type": inner}
            )
        return {"type": "record", "name": name, "fields": fields}
    if isinstance(t, DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if isinstance(t, ArrayType):
        item = _avro(t.elementType, name, option)
        return {"type": "array", "items": ["null", item] if t.containsNull else item}
    if isinstance(t, MapType):
        if not isinstance(t.keyType, StringType):
            raise ConfigError(
                f"{option}: {name} is {t.simpleString()}: Avro maps have string keys (cast the keys to string)",
                option=option,
            )
        value = _avro(t.valueType, name, option)
        return {"type": "map", "values": ["null", value] if t.valueContainsNull else value}
    found = _AVRO_OF.get(t.simpleString())
    if found is None:
        raise ConfigError(f"{option}: {name} is {t.simpleString()}, which has no Avro type here", option=option)
    return found


def _maps(t: DataType) -> _Fix | None:
    """What turns Arrow's maps (lists of key-value pairs) into dicts for fastavro, where ``t`` has maps."""
    if isinstance(t, MapType):
        inner = _maps(t.valueType)
        return lambda pairs: {k: (v if inner is None or v is None else inner(v)) for k, v in pairs}
    if isinstance(t, ArrayType):
        item = _maps(t.elementType)
        return None if item is None else (lambda a: [None if x is None else item(x) for x in a])
    if isinstance(t, StructType):
        fixes = {f.name: fx for f in t.fields for fx in [_maps(f.dataType)] if fx is not None}
        if not fixes:
            return None
        return lambda d: {k: (fixes[k](v) if k in fixes and v is not None else v) for k, v in d.items()}
    return None


def register(conf: RegistryConf, subject: str, schema_text: str, *, option: str, kind: str = "AVRO") -> int:
    """The id of ``schema_text`` (of the registry's schema type ``kind``) under ``subject``, registering it as a new
    version when it is not one yet; the registry's compatibility check refuses an incompatible one (HTTP 409): a
    ConfigError naming the subject."""
    client = _client(conf)  # first: a ConfigError naming the extra when the client is not installed
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    name = option.split(".")[0]

    def call() -> int:
        try:
            return int(client.register_schema(subject, Schema(schema_text, kind)))
        except SchemaRegistryError as exc:
            if exc.http_status_code != 409:
                raise
            how = "a new field needs a default" if kind == "AVRO" else "a new property is optional"
            raise ConfigError(
                f"the Schema Registry at {conf.shown_url} refused the schema of the {name} column as a new version of "
                f"subject {subject!r}: incompatible with its latest under the subject's compatibility level "
                f"({exc.error_message}); make the change compatible ({how}), or write to a new subject "
                f"({name}.subject)",
                option=option,
            ) from None

    return int(_registry_call(conf, f"subject {subject!r}", option, call))


def python_rows(array: Any, where: Callable[[int], str], column: str) -> list[Any]:
    """``array.to_pylist()``; a string holding bytes that are not UTF-8 (Spark's CAST of binary does not check) is
    a FatalError naming the first such row, not a UnicodeDecodeError of the whole batch."""
    try:
        return list(array.to_pylist())
    except UnicodeDecodeError as exc:
        for i in range(len(array)):
            try:
                array[i].as_py()
            except UnicodeDecodeError:
                raise FatalError(
                    f"kafka-eos sink: {where(i)}: the {column} holds a string that is not UTF-8 ({exc.reason}); "
                    "CAST(binary AS STRING) does not check: clean or drop such rows, or write the bytes as bytes"
                ) from None
        raise


class AvroEncoder:
    """Encodes a struct column into Confluent's wire format with one registered writer schema."""

    def __init__(self, schema_text: str, schema_id: int, spark: DataType, *, column: str) -> None:
        self.schema_text = schema_text
        self.schema_id = schema_id
        self.spark = spark
        self.column = column
        self._parsed = _parse(schema_text, f"{column}.schema")
        self._header = bytes([MAGIC]) + schema_id.to_bytes(4, "big")
        self._fix = _maps(spark)
        self._by_columns: dict[Any, Any] = {}  # Arrow type -> eos_core.avro_columns' plan (None: record by record)

    def __getstate__(self) -> dict[str, Any]:  # pickled to executors: the parsed schema is rebuilt there
        return {k: getattr(self, k) for k in ("schema_text", "schema_id", "spark", "column")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        text, sid, spark = state["schema_text"], state["schema_id"], state["spark"]
        self.__init__(text, sid, spark, column=state["column"])  # type: ignore[misc]

    def encode_arrow(self, array: Any, where: Callable[[int], str]) -> Any:
        """``encode`` of an Arrow struct array, into an Arrow binary array: by column (``eos_core.avro_columns``)
        where the schema allows, else record by record."""
        import pyarrow as pa

        from eos_core import avro_columns

        if array.type not in self._by_columns:
            self._by_columns[array.type] = avro_columns.plan(self._parsed, array.type, self._header)
        by_columns = self._by_columns[array.type]
        if by_columns is not None:
            try:
                return by_columns(array)
            except avro_columns.Fallback:  # a null where the schema has none: the record-by-record path names it
                pass
        return pa.array(self.encode(python_rows(array, where, self.column), where), type=pa.binary())

    def encode(self, values: list[Any], where: Callable[[int], str]) -> list[bytes | None]:
        """Each value (a dict; None stays a null key or value) as header + Avro body; a value the schema cannot
        hold is a FatalError naming its row (``where(i)``)."""
        import fastavro

        fix, parsed, header = self._fix, self._parsed, self._header
        out: list[bytes | None] = []
        body = io.BytesIO()
        for i, value in enumerate(values):
            if value is None:
                out.append(None)
                continue
            body.seek(0)
            body.truncate()
            body.write(header)
            try:
                fastavro.schemaless_writer(body, parsed, value if fix is None else fix(value))
            except Exception as exc:
                raise FatalError(
                    f"kafka-eos sink: {where(i)}: the {self.column} cannot be written with schema id "
                    f"{self.schema_id}: {type(exc).__name__}: {exc}"
                ) from None
            out.append(body.getvalue())
        return out
