"""The rows a ``kafka-eos`` write takes, as Spark's Kafka sink takes them, and what the broker would refuse.

Columns (others are ignored, as Spark's sink ignores them, with one log line): ``value`` (string or
binary, required), ``key`` (string or binary), ``topic`` (string; required without option ``topic``,
which overrides it), ``partition`` (int), ``headers`` (array<struct<key: string, value: binary>>).

``Refusals`` checks each record before anything of its batch is visible, against what the broker and
librdkafka would refuse: a record larger than the producer's ``message.max.bytes`` or the topic's
``max.message.bytes`` (checked uncompressed, as librdkafka checks it), no key on a compacted topic, a
topic that does not exist or a partition it does not have, a null topic.

``RowDigest`` is a digest of the rows in order, independent of how Spark cut them into Arrow batches.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from eos_core.errors import ConfigError

__all__ = ["COLUMNS", "WIRE_SLACK", "Record", "RowBatch", "RowDigest", "TopicLimits", "check_schema", "record_size"]

log = logging.getLogger("sinks.kafka")

COLUMNS = ("topic", "key", "value", "headers", "partition")
Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Record:
    """One row as the producer sends it (``partition`` None: the partitioner chooses)."""

    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    partition: int | None


def _header_type() -> ArrayType:
    return ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))


def check_schema(schema: StructType, *, topic_option: str | None, context: str) -> tuple[str, ...]:
    """The columns of ``COLUMNS`` the rows carry; ConfigError, as Spark's KafkaWriter says it, otherwise."""
    fields = {f.name: f.dataType for f in schema.fields}
    lower = {name.lower(): name for name in fields}
    for wanted in COLUMNS:
        if wanted not in fields and wanted in lower:
            raise ConfigError(
                f"{context}: column {lower[wanted]!r} must be named {wanted!r} (Kafka column names are "
                f"case-sensitive, as in Spark's Kafka sink); rename it with .withColumnRenamed",
                option=wanted,
            )
    if "value" not in fields:
        raise ConfigError(
            f"{context}: the rows have no 'value' column (columns: {', '.join(fields) or 'none'}); select or alias "
            "one: df.selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value')",
            option="value",
        )
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], (StringType, BinaryType)):
            raise ConfigError(
                f"{context}: column {name!r} is {fields[name].simpleString()}; it must be string or binary "
                f"(cast it: CAST({name} AS STRING), or to_json/to_avro)",
                option=name,
            )
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise ConfigError(f"{context}: column 'topic' is {fields['topic'].simpleString()}; it must be string")
    if "topic" not in fields and topic_option is None:
        raise ConfigError(
            f"{context}: no topic: set option 'topic' (every row goes there) or give the rows a 'topic' column",
            option="topic",
        )
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise ConfigError(
            f"{context}: column 'partition' is {fields['partition'].simpleString()}; it must be int "
            "(CAST(partition AS INT))",
            option="partition",
        )
    if "headers" in fields and fields["headers"].simpleString() != _header_type().simpleString():
        raise ConfigError(
            f"{context}: column 'headers' is {fields['headers'].simpleString()}; it must be "
            "array<struct<key:string,value:binary>> (as the source's includeHeaders column is)",
            option="headers",
        )
    extra = [name for name in fields if name not in COLUMNS]
    if extra:
        log.info("%s: ignoring columns %s (a Kafka record has key, value, headers, topic, partition)", context, extra)
    columns = tuple(c for c in COLUMNS if c in fields)
    if topic_option is not None and "topic" in columns:
        columns = tuple(c for c in columns if c != "topic")  # the option overrides the column, as in Spark
    return columns


class RowBatch:
    """One Arrow batch of rows, read once: Python lists for the producer, vectorised sizes for the checks."""

    def __init__(self, batch: pa.RecordBatch, columns: Sequence[str], topic: str | None) -> None:
        names = batch.schema.names
        self.n = batch.num_rows
        self.arrays = {name: batch.column(names.index(name)) for name in columns}
        self.topic = topic
        self.keys: list[Any] = self.arrays["key"].to_pylist() if "key" in self.arrays else [None] * self.n
        self.values: list[Any] = self.arrays["value"].to_pylist()
        self.topics: list[Any] = self.arrays["topic"].to_pylist() if "topic" in self.arrays else [topic] * self.n
        self.partitions: list[Any] = (
            self.arrays["partition"].to_pylist() if "partition" in self.arrays else [None] * self.n
        )
        self.headers: list[Any] | None = None
        if "headers" in self.arrays:
            self.headers = [
                [(h["key"], h["value"]) for h in row] if row else None for row in self.arrays["headers"].to_pylist()
            ]

    def _lengths(self, name: str) -> np.ndarray:
        arr = self.arrays.get(name)
        if arr is None:
            return np.zeros(self.n, dtype=np.int64)
        lengths: np.ndarray = np.asarray(
            pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False), dtype=np.int64
        )
        return lengths

    def payload_sizes(self) -> np.ndarray:
        """key + value + header bytes of each row (what librdkafka checks against message.max.bytes)."""
        sizes: np.ndarray = self._lengths("key") + self._lengths("value")
        if self.headers is not None:
            sizes += np.array(
                [sum(len(k.encode()) + len(v or b"") for k, v in row) if row else 0 for row in self.headers],
                dtype=np.int64,
            )
        return sizes

    def record(self, i: int) -> Record:
        key, value = self.keys[i], self.values[i]
        return Record(
            self.topics[i],
            key.encode("utf-8") if isinstance(key, str) else key,
            value.encode("utf-8") if isinstance(value, str) else value,
            self.headers[i] if self.headers is not None else None,
            self.partitions[i],
        )


def _varint_size(n: int) -> int:
    z = (n << 1) ^ (n >> 63)  # zigzag, as Kafka's record format writes lengths
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


_BATCH_OVERHEAD = 61  # a record batch's header (magic v2)


def record_size(rec: Record) -> tuple[int, int]:
    """(librdkafka's size of the record: key + value + headers, the size of a one-record batch on the wire)."""
    key = len(rec.key) if rec.key is not None else 0
    value = len(rec.value) if rec.value is not None else 0
    headers = 0
    wire_headers = _varint_size(len(rec.headers or ()))
    for hk, hv in rec.headers or ():
        kb = len(hk.encode("utf-8"))
        vb = len(hv) if hv is not None else 0
        headers += kb + vb
        wire_headers += _varint_size(kb) + kb + _varint_size(vb if hv is not None else -1) + vb
    body = (
        1  # attributes
        + 10  # timestamp delta (at most)
        + 1  # offset delta
        + _varint_size(key if rec.key is not None else -1)
        + key
        + _varint_size(value if rec.value is not None else -1)
        + value
        + wire_headers
    )
    return key + value + headers, _BATCH_OVERHEAD + _varint_size(body) + body


WIRE_SLACK = 128  # a one-record batch is at most this much larger than its payload, headers aside


@dataclass(frozen=True)
class TopicLimits:
    """What the broker checks a topic's records against."""

    partitions: int
    max_message_bytes: int
    compacted: bool


class RowDigest:
    """A digest of rows in order that does not depend on where the Arrow batches were cut: each column's
    lengths (-1 for null) and bytes go to hash streams of their own, fed a whole Arrow column at a time."""

    def __init__(self) -> None:
        self._streams: dict[str, Any] = {}
        self.rows = 0

    def _stream(self, name: str) -> Any:
        found = self._streams.get(name)
        if found is None:
            found = self._streams[name] = hashlib.blake2b(digest_size=16)
        return found

    def _binary(self, name: str, arr: pa.Array) -> None:
        lengths = pc.fill_null(pc.binary_length(arr), -1).cast(pa.int64())
        self._stream(name + ".len").update(lengths.to_numpy(zero_copy_only=False).tobytes())
        clean = pc.fill_null(arr, b"" if pa.types.is_binary(arr.type) else "") if arr.null_count else arr
        clean = clean.cast(pa.large_binary())  # one layout for string and binary, 64-bit offsets
        _validity, offsets_buf, data = clean.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64)[clean.offset : clean.offset + len(clean) + 1]
        if len(offsets) and data is not None:
            self._stream(name + ".data").update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])

    def add(self, rows: RowBatch) -> None:
        for name in ("topic", "key", "value"):
            if name in rows.arrays:
                self._binary(name, rows.arrays[name])
        if "partition" in rows.arrays:
            parts = pc.fill_null(rows.arrays["partition"], -1).cast(pa.int64())
            self._stream("partition").update(parts.to_numpy(zero_copy_only=False).tobytes())
        if rows.headers is not None:
            stream = self._stream("headers")
            for row in rows.headers:
                stream.update(struct.pack("<i", -1 if row is None else len(row)))
                for hk, hv in row or ():
                    kb = hk.encode("utf-8")
                    stream.update(struct.pack("<ii", len(kb), -1 if hv is None else len(hv)))
                    stream.update(kb)
                    if hv:
                        stream.update(hv)
        self.rows += rows.n

    def hexdigest(self) -> str:
        total = hashlib.blake2b(struct.pack("<q", self.rows), digest_size=16)
        for name in sorted(self._streams):
            total.update(name.encode())
            total.update(self._streams[name].digest())
        return total.hexdigest()
