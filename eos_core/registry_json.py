"""Confluent wire-format JSON Schema: a JSON Schema's Spark type, and records decoded onto it.

Confluent's JSON Schema serializers (and Apicurio's, Karapace's, Kafka Connect's ``JsonSchemaConverter``) write a
magic byte 0, the writer schema's id in 4 bytes, then the record as JSON text (UTF-8). The reader schema (the
subject's ``latest``, a pinned version or id, or a schema inline) fixes the column's Spark type when the query is
planned (``spark_type``); each record is parsed and checked against that type (``JsonSchemaDecoder``): a property
the reader lacks is skipped, one it has and the record lacks is null (refused where the reader requires it), a value
of another JSON type is a decode error naming its path. The writer schema (by id, fetched once per process) must be
a JSON Schema; the record itself is not validated against it (its producer did), only read onto the reader.

The mapping (as Kafka Connect's and Spark's ``from_json`` would hold the values):

| JSON Schema | Spark |
|---|---|
| ``string`` (any ``format``; ``enum`` of strings) | string |
| ``integer`` | bigint |
| ``number`` | double |
| ``boolean`` | boolean |
| ``object`` with ``properties`` | struct, in the properties' order; a property not ``required``, or whose type admits ``null``, nullable |
| ``object`` with only ``additionalProperties`` (a schema) | map<string, that schema's type> |
| ``array`` with ``items`` | array |
| ``["T", "null"]``, ``oneOf``/``anyOf`` of one type and ``null`` | T, nullable |

Refused when the query is planned, naming the property: ``$ref`` (give the schema inline, its definitions
inlined), a union of several non-null types, an ``object`` with neither ``properties`` nor a schema of
``additionalProperties``, a ``type`` this mapping lacks.

Writes (the Kafka sink's ``value.format=json-schema``) go the other way: ``json_schema`` derives a column's JSON
Schema from its Spark type (draft-07; a struct a closed ``object`` whose non-nullable fields are ``required``, a
nullable one ``oneOf`` null and its type; integers ``integer``; float, double and decimal ``number``; date and
timestamp strings of ``format`` date and date-time, timestamp_ntz a plain string, binary a base64 string; an array's
``items``; a map with string keys an ``object`` of ``additionalProperties``), and ``JsonSchemaEncoder`` writes each
value as JSON text after the wire-format header, a decimal with its exact digits. A schema the user gave (inline or
registered) may hold constraints the Spark type does not (an enum, a pattern, a range): each value is validated
against it, as Confluent's serializer validates, and one that breaks it fails the batch naming its row.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_core import registry_avro
from eos_core.errors import ConfigError, FatalError
from eos_core.registry_avro import ReaderSchema, RegistryConf

__all__ = [
    "JsonSchemaDecoder",
    "JsonSchemaEncoder",
    "canonical",
    "json_schema",
    "parse_schema",
    "read_as",
    "spark_type",
]

_HEADER = 5
_SCALARS: dict[str, DataType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}


def parse_schema(text: str, option: str) -> dict[str, Any]:
    """``text`` as a JSON Schema object (a ConfigError naming ``option`` when it is no JSON object)."""
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"option {option!r}: not a JSON Schema (not JSON: {exc})", option=option) from None
    if not isinstance(schema, dict):
        raise ConfigError(f"option {option!r}: a JSON Schema is a JSON object, not {text[:40]!r}", option=option)
    return schema


def spark_type(schema_text: str, *, option: str = "value.schema") -> tuple[DataType, bool]:
    """The Spark type of a JSON Schema and whether it admits null."""
    return _spark(parse_schema(schema_text, option), "", option)


def _types(s: dict[str, Any], where: str, option: str) -> tuple[list[Any], bool]:
    """The non-null alternatives of ``s`` (type lists, oneOf/anyOf), and whether null is one."""
    if "$ref" in s:
        raise ConfigError(
            f"{option}: {where} is a reference ({s['$ref']!r}): not supported yet; give the schema inline with its "
            "definitions inlined",
            option=option,
        )
    union = s.get("oneOf") or s.get("anyOf")
    if union is not None:
        alternatives = [a for a in union if not (isinstance(a, dict) and a.get("type") == "null")]
        return alternatives, len(alternatives) < len(union)
    kind = s.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        return [{**s, "type": k} for k in rest], len(rest) < len(kind)
    if kind is None and "properties" in s:
        return [{**s, "type": "object"}], False
    if kind is None and "enum" in s and all(isinstance(v, str) for v in s["enum"]):
        return [{"type": "string"}], False
    if kind == "null":
        return [], True
    return [s], False


def _spark(s: Any, path: str, option: str) -> tuple[DataType, bool]:
    where = path or "the schema's top level"
    if not isinstance(s, dict):
        raise ConfigError(f"{option}: {where} is {json.dumps(s)[:60]}, not a JSON Schema", option=option)
    alternatives, nullable = _types(s, where, option)
    if len(alternatives) != 1:
        kinds = ", ".join(str(a.get("type", "?")) if isinstance(a, dict) else str(a) for a in alternatives) or "null"
        raise ConfigError(
            f"{option}: {where} is one of several types ({kinds}): not supported; read it as one type (a reader "
            "schema with that type and null) or keep the format raw",
            option=option,
        )
    (one,) = alternatives
    if isinstance(one, dict) and one is not s and ("oneOf" in s or "anyOf" in s):
        t, inner = _spark(one, path, option)
        return t, nullable or inner
    kind = one.get("type")
    if kind in _SCALARS:
        return _SCALARS[kind], nullable
    if kind == "array":
        if "items" not in one:
            raise ConfigError(f"{option}: {where} is an array without items: name their schema", option=option)
        t, contains_null = _spark(one["items"], f"{path}[]", option)
        return ArrayType(t, contains_null), nullable
    if kind == "object":
        props = one.get("properties")
        if props:
            required = set(one.get("required") or ())
            fields = []
            for name, sub in props.items():
                t, field_null = _spark(sub, f"{path}.{name}" if path else name, option)
                fields.append(StructField(name, t, field_null or name not in required))
            return StructType(fields), nullable
        extra = one.get("additionalProperties")
        if isinstance(extra, dict):
            t, value_null = _spark(extra, f"{path}{{}}", option)
            return MapType(StringType(), t, value_null), nullable
        raise ConfigError(
            f"{option}: {where} is an object with neither properties nor a schema of additionalProperties: its "
            "Spark type is unknown; name its properties",
            option=option,
        )
    raise ConfigError(f"{option}: {where} has type {kind!r}, which has no Spark type here", option=option)


def _conform(value: Any, t: DataType, nullable: bool, path: str) -> Any:
    """``value`` (parsed JSON) as Arrow takes ``t``; a ValueError naming ``path`` when it is not one."""
    if value is None:
        if not nullable:
            raise ValueError(f"{path or 'the record'} is null or missing, and the reader schema requires it")
        return None
    if isinstance(t, StructType):
        if not isinstance(value, dict):
            raise ValueError(f"{path or 'the record'} is {type(value).__name__}, not an object")
        return {
            f.name: _conform(value.get(f.name), f.dataType, f.nullable, f"{path}.{f.name}" if path else f.name)
            for f in t.fields
        }
    if isinstance(t, ArrayType):
        if not isinstance(value, list):
            raise ValueError(f"{path} is {type(value).__name__}, not an array")
        return [_conform(v, t.elementType, t.containsNull, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(t, MapType):
        if not isinstance(value, dict):
            raise ValueError(f"{path} is {type(value).__name__}, not an object")
        return [(k, _conform(v, t.valueType, t.valueContainsNull, f"{path}.{k}")) for k, v in value.items()]
    ok = {
        "string": isinstance(value, str),
        "bigint": isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63,
        "double": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
    }[t.simpleString()]
    if not ok:
        raise ValueError(f"{path or 'the record'} is {json.dumps(value)[:40]}, not {t.simpleString()}")
    return float(value) if isinstance(t, DoubleType) else value


class JsonSchemaDecoder:
    """Decodes a column of wire-format JSON Schema records onto the reader schema's Spark type, into an Arrow
    array (the interface of ``registry_avro.AvroDecoder``)."""

    def __init__(
        self, conf: RegistryConf, reader: ReaderSchema, spark: DataType, *, column: str, tolerate: bool = False
    ) -> None:
        from pyspark.sql.pandas.types import to_arrow_type

        self.conf, self.reader, self.spark, self.column, self.tolerate = conf, reader, spark, column, tolerate
        self.arrow_type = to_arrow_type(spark, timezone="UTC")
        self._writers: set[int] = set()  # writer ids known to be JSON Schemas

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("conf", "reader", "spark", "column", "tolerate")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        conf, reader, spark = state["conf"], state["reader"], state["spark"]
        self.__init__(conf, reader, spark, column=state["column"], tolerate=state["tolerate"])  # type: ignore[misc]

    def _writer(self, schema_id: int, where: str) -> None:
        schema = registry_avro.writer_schema(self.conf, schema_id, where, self.column)
        if schema.schema_type != "JSON":
            raise FatalError(
                f"kafka-eos: {where}: the {self.column} was written with a {schema.schema_type or 'AVRO'} schema (id "
                f"{schema_id}), not a JSON Schema: read it with {self.column}.format="
                f"{'avro' if schema.schema_type in (None, 'AVRO') else 'raw'}, or keep such records aside with "
                "errors.tolerance=all"
            )
        self._writers.add(schema_id)

    def decode(
        self,
        payloads: list[bytes | None],
        where: Callable[[int], str],
        errors: dict[int, tuple[int | None, str]] | None = None,
    ) -> Any:
        """As ``AvroDecoder.decode``: None stays None; a record that cannot be read fails the batch (FatalError),
        or with ``errors`` is a null there and its error; an unreachable registry always fails."""
        import pyarrow as pa

        def read(schema_id: int, payload: bytes, at: str) -> Any:
            if schema_id not in self._writers:
                self._writer(schema_id, at)
            try:
                return _conform(json.loads(payload[_HEADER:]), self.spark, True, "")
            except ValueError as exc:  # not JSON (JSONDecodeError), or not of the reader's types
                raise FatalError(
                    f"kafka-eos: {at}: the {self.column} (writer schema id {schema_id}) cannot be read with the "
                    f"reader schema: {exc}"
                ) from None

        out = registry_avro.decode_each(payloads, where, errors, self.column, read)
        return pa.array(out, type=self.arrow_type)


_DRAFT = "http://json-schema.org/draft-07/schema#"
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_NUMBERS = (FloatType, DoubleType, DecimalType)
_STRINGS: dict[type, dict[str, Any]] = {
    StringType: {"type": "string"},
    DateType: {"type": "string", "format": "date"},
    TimestampType: {"type": "string", "format": "date-time"},
    TimestampNTZType: {"type": "string"},
    BinaryType: {"type": "string", "contentEncoding": "base64"},
}


def json_schema(spark: DataType, *, title: str | None = None, option: str = "value.format") -> dict[str, Any]:
    """The JSON Schema a struct column of type ``spark`` is written with (draft-07, titled ``title`` if given)."""
    if not isinstance(spark, StructType):
        raise ConfigError(f"{option}: the column is {spark.simpleString()}; json-schema writes a struct", option=option)
    head: dict[str, Any] = {"$schema": _DRAFT}
    if title:
        head["title"] = title
    return {**head, **_schema_of(spark, "", option)}


def _nullable(s: dict[str, Any], nullable: bool) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, s]} if nullable else s


def _schema_of(t: DataType, path: str, option: str) -> dict[str, Any]:
    if isinstance(t, StructType):
        return {
            "type": "object",
            "properties": {
                f.name: _nullable(_schema_of(f.dataType, f"{path}.{f.name}" if path else f.name, option), f.nullable)
                for f in t.fields
            },
            "required": [f.name for f in t.fields if not f.nullable],
            "additionalProperties": False,
        }
    if isinstance(t, ArrayType):
        return {"type": "array", "items": _nullable(_schema_of(t.elementType, f"{path}[]", option), t.containsNull)}
    if isinstance(t, MapType):
        if not isinstance(t.keyType, StringType):
            raise ConfigError(
                f"{option}: {path} is {t.simpleString()}: a JSON object's keys are strings (cast the keys to string)",
                option=option,
            )
        value = _schema_of(t.valueType, f"{path}{{}}", option)
        return {"type": "object", "additionalProperties": _nullable(value, t.valueContainsNull)}
    if isinstance(t, _INTEGERS):
        return {"type": "integer"}
    if isinstance(t, _NUMBERS):
        return {"type": "number"}
    if isinstance(t, BooleanType):
        return {"type": "boolean"}
    if type(t) in _STRINGS:
        return dict(_STRINGS[type(t)])
    raise ConfigError(f"{option}: {path} is {t.simpleString()}, which has no JSON Schema type here", option=option)


def read_as(spark: DataType, *, option: str = "value.format") -> str:
    """The Spark type a column of type ``spark`` is read back as through its derived JSON Schema, its structs'
    fields by name (a JSON object's properties have no order): what a given schema's type must equal."""
    return canonical(_spark(json_schema(spark, option=option), "", option)[0])


def canonical(t: DataType) -> str:
    """``t`` as a string with its structs' fields sorted by name (nullability left out)."""
    if isinstance(t, StructType):
        return (
            "struct<"
            + ",".join(f"{f.name}:{canonical(f.dataType)}" for f in sorted(t.fields, key=lambda f: f.name))
            + ">"
        )
    if isinstance(t, ArrayType):
        return f"array<{canonical(t.elementType)}>"
    if isinstance(t, MapType):
        return f"map<{canonical(t.keyType)},{canonical(t.valueType)}>"
    return t.simpleString()


_DUMPS = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def _plain(t: DataType) -> bool:
    """Whether Arrow hands values of ``t`` over as json.dumps writes them: structs as dicts in the fields' order,
    arrays as lists, and strings, integers, booleans, floats; no maps (pairs), decimals, dates, times or bytes."""
    if isinstance(t, StructType):
        return all(_plain(f.dataType) for f in t.fields)
    if isinstance(t, ArrayType):
        return _plain(t.elementType)
    return isinstance(t, (StringType, BooleanType, FloatType, DoubleType, *_INTEGERS))


def _text_of(t: DataType) -> Callable[[Any], str]:
    """What writes a (non-null) value of ``t``, as Arrow hands it over, as JSON text: json's own encoder (in C)
    where it writes the value as the schema says, else field by field."""
    if _plain(t):
        return _dumps
    return _text_of_parts(t)


def _dumps(v: Any) -> str:
    try:
        return _DUMPS(v)
    except ValueError:  # json's "Out of range float values are not JSON compliant"
        raise ValueError("a float is NaN or infinite, not a JSON number (JSON has neither)") from None


def _text_of_parts(t: DataType) -> Callable[[Any], str]:
    """A struct, array or map holding what json's encoder does not write as the schema says, or one of those."""
    if isinstance(t, StructType):
        parts = [(_DUMPS(f.name) + ":", f.name, _text_of(f.dataType)) for f in t.fields]
        return lambda v: "{" + ",".join(k + ("null" if v[n] is None else w(v[n])) for k, n, w in parts) + "}"
    if isinstance(t, ArrayType):
        item = _text_of(t.elementType)
        return lambda v: "[" + ",".join("null" if x is None else item(x) for x in v) + "]"
    if isinstance(t, MapType):
        value = _text_of(t.valueType)
        return lambda v: "{" + ",".join(_DUMPS(k) + ":" + ("null" if x is None else value(x)) for k, x in v) + "}"
    if isinstance(t, DecimalType):
        return str  # a Decimal's own digits (1.50, 1E+3): JSON numbers, exactly
    if isinstance(t, BinaryType):
        return lambda v: '"' + base64.b64encode(v).decode("ascii") + '"'
    if isinstance(t, TimestampType):  # in UTC, whatever the session's time zone: RFC 3339, the same bytes
        return lambda v: '"' + v.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z") + '"'
    if isinstance(t, (DateType, TimestampNTZType)):
        return lambda v: '"' + v.isoformat() + '"'
    raise AssertionError(f"{t.simpleString()}: json_schema refuses it first")


class JsonSchemaEncoder:
    """Encodes a struct column into Confluent's wire format with one registered JSON Schema (the interface of
    ``registry_avro.AvroEncoder``); ``validate``: each value checked against the schema (one the user gave)."""

    def __init__(self, schema_text: str, schema_id: int, spark: DataType, *, column: str, validate: bool) -> None:
        self.schema_text, self.schema_id, self.spark = schema_text, schema_id, spark
        self.column, self.validate = column, validate
        self._header = bytes([registry_avro.MAGIC]) + schema_id.to_bytes(4, "big")
        self._text = _text_of(spark)
        self._validator = _validator(schema_text, f"{column}.schema") if validate else None

    def __getstate__(self) -> dict[str, Any]:  # pickled to executors: the writer and validator are rebuilt there
        return {k: getattr(self, k) for k in ("schema_text", "schema_id", "spark", "column", "validate")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        text, sid, spark = state["schema_text"], state["schema_id"], state["spark"]
        self.__init__(text, sid, spark, column=state["column"], validate=state["validate"])  # type: ignore[misc]

    def encode_arrow(self, array: Any, where: Callable[[int], str]) -> Any:
        """``encode`` of an Arrow struct array, into an Arrow binary array."""
        import pyarrow as pa

        return pa.array(self.encode(registry_avro.python_rows(array, where, self.column), where), type=pa.binary())

    def encode(self, values: list[Any], where: Callable[[int], str]) -> list[bytes | None]:
        """Each value (a dict; None stays a null key or value) as header + JSON text; a value that is no JSON or
        breaks the schema is a FatalError naming its row (``where(i)``)."""
        text, header, validator = self._text, self._header, self._validator
        out: list[bytes | None] = []
        for i, value in enumerate(values):
            if value is None:
                out.append(None)
                continue
            try:
                body = text(value)
                if validator is not None:  # decimals as decimals: a float would break multipleOf and bounds
                    error = next(iter(validator.iter_errors(json.loads(body, parse_float=Decimal))), None)
                    if error is not None:
                        at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
                        raise ValueError(f"{at.lstrip('.') or 'the record'}: {error.message}")
            except ValueError as exc:
                raise FatalError(
                    f"kafka-eos sink: {where(i)}: the {self.column} cannot be written with schema id "
                    f"{self.schema_id}: {exc}"
                ) from None
            out.append(header + body.encode("utf-8"))
        return out


def _validator(schema_text: str, option: str) -> Any:
    try:
        import jsonschema
    except ImportError:
        raise ConfigError(
            f"option {option!r}: a JSON Schema given to the sink is validated with the jsonschema package: "
            "pip install 'spark-eos[registry]'",
            option=option,
        ) from None
    schema = parse_schema(schema_text, option)
    schema = json.loads(json.dumps(schema), parse_float=Decimal)  # bounds and multipleOf as the values are: decimals
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"option {option!r}: not a valid JSON Schema: {exc.message}", option=option) from None
    return cls(schema)
