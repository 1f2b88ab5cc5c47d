"""The rows a ``kafka-eos`` write takes, as Spark's Kafka sink takes them, and what the broker would refuse.

Columns (others are ignored, as Spark's sink ignores them, with one log line): ``value`` (string or
binary, required), ``key`` (string or binary), ``topic`` (string; required without option ``topic``,
which overrides it), ``partition`` (int), ``headers`` (array<struct<key: string, value: binary>>).

``Refusals`` checks each record before anything of its batch is visible, against what the broker and
librdkafka would refuse: a record larger than the producer's ``message.max.bytes`` or the topic's
``max.message.bytes`` (checked uncompressed, as librdkafka checks it), no key on a compacted topic, a
topic that does not exist or a partition it does not have, a null topic.

``RowDigest`` is a digest of the rows as a multiset: independent of their order and of how Spark cut
them into Arrow batches.
"""

from __future__ import annotations

import functools
import hashlib
import json
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

__all__ = [
    "COLUMNS",
    "RECORD_OVERHEAD",
    "STAGE_HEADER",
    "WIRE_SLACK",
    "Record",
    "RowBatch",
    "RowDigest",
    "TopicLimits",
    "check_schema",
    "headers_size",
    "record_size",
    "split_stage_header",
    "stage_header_size",
    "stage_route",
]

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
                f"(cast it: CAST({name} AS STRING), or to_json/to_avro; a struct with option {name}.format=avro or json-schema)",
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

    def producer_sizes(self, stage_tag: str | None = None) -> np.ndarray:
        """Each row's size as librdkafka checks it against ``message.max.bytes`` when it is produced:
        RECORD_OVERHEAD + key + value + its headers serialised (zigzag varint lengths), plus the staging
        header (STAGE_HEADER with the route of ``stage_tag``) when the row is staged."""
        sizes: np.ndarray = self._lengths("key") + self._lengths("value") + RECORD_OVERHEAD
        if self.headers is not None:
            sizes += np.array([headers_size(row) for row in self.headers], dtype=np.int64)
        if stage_tag is not None:
            sizes += np.array(
                [stage_header_size(stage_tag, t, p) for t, p in zip(self.topics, self.partitions, strict=True)],
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


RECORD_OVERHEAD = 36  # librdkafka's RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD, counted with a record against message.max.bytes
STAGE_HEADER = "spark-eos.stage"  # on every staged record: the attempt's tag and where the record goes


def stage_route(tag: str, topic: str | None, partition: int | None) -> bytes:
    """The STAGE_HEADER value: the attempt's tag, the record's topic and explicit partition."""
    return json.dumps([tag, topic, partition], separators=(",", ":")).encode()


def split_stage_header(headers: Headers) -> tuple[bytes | None, Headers]:
    """A staged record's route (the value of its STAGE_HEADER) and the row's own headers. The sink appends
    the staging header last, so only the last header is taken for it: a header of the row's that has the
    same name is the row's and stays (``None``: the record carries no staging header of the sink's)."""
    if headers and headers[-1][0] == STAGE_HEADER:
        return headers[-1][1], headers[:-1]
    return None, headers


def headers_size(headers: Headers | None) -> int:
    """Headers as librdkafka serialises them into a record: per header, the key's and the value's zigzag
    varint lengths (-1 for a null value) and their bytes."""
    size = 0
    for hk, hv in headers or ():
        kb = len(hk.encode("utf-8"))
        vb = len(hv) if hv is not None else 0
        size += _varint_size(kb) + kb + _varint_size(vb if hv is not None else -1) + vb
    return size


@functools.lru_cache(maxsize=4096)  # one task's rows share a tag and a few destinations: no json.dumps per row
def stage_header_size(tag: str, topic: str | None, partition: int | None) -> int:
    """What the staging header adds to a staged record's size (``headers_size`` of it alone)."""
    route = len(stage_route(tag, topic, partition))
    name = len(STAGE_HEADER)
    return _varint_size(name) + name + _varint_size(route) + route


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
    internal: bool = False  # Kafka's own (__consumer_offsets, __transaction_state): every produce is refused


DIGEST_VERSION = "m1"  # the multiset digest below (markers written with another one compare unequal)
_HASH_KEY = "spark-eos:rows:1"  # siphash key of pandas' hash_array: 16 bytes, fixed, so every process agrees
_MIX = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD],
    dtype=np.uint64,
)


def _fmix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, element-wise (wrapping uint64 arithmetic)."""
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    out: np.ndarray = h ^ (h >> np.uint64(33))
    return out


class RowDigest:
    """A digest of the rows as a multiset: neither where Spark cut the Arrow batches nor the rows' order
    changes it (after a shuffle, Spark fetches a partition's blocks in a random order, so a replay of a
    task can give it the same rows in another order), any other change of the rows does.

    Each column of a row is hashed (SipHash-2-4 with a fixed key, pandas' ``hash_array``; null apart from
    empty), the row's column hashes are combined and mixed into two 64-bit row hashes, and the digest
    sums each over the rows (mod 2**64) with their count."""

    def __init__(self, *, count_only: bool = False) -> None:
        self._sums = [0, 0]
        self.rows = 0
        self.count_only = count_only  # visibility=batch: no replay compares a task's rows (K2), only count them

    @staticmethod
    def _column(arr: pa.Array) -> np.ndarray:
        from pandas.util import hash_array  # PySpark's Arrow path imports pandas in every Python worker

        return hash_array(arr.to_numpy(zero_copy_only=False), hash_key=_HASH_KEY, categorize=False)  # type: ignore[no-any-return]

    @staticmethod
    def _headers(headers: Sequence[Headers | None]) -> np.ndarray:
        from pandas.util import hash_array

        encoded = np.empty(len(headers), dtype=object)
        for i, row in enumerate(headers):
            if row is None:
                encoded[i] = None
                continue
            parts = [struct.pack("<i", len(row))]
            for hk, hv in row:
                kb = hk.encode("utf-8")
                parts.append(struct.pack("<ii", len(kb), -1 if hv is None else len(hv)))
                parts.append(kb + (hv or b""))
            encoded[i] = b"".join(parts)
        return hash_array(encoded, hash_key=_HASH_KEY, categorize=False)  # type: ignore[no-any-return]

    def add(self, rows: RowBatch) -> None:
        if self.count_only or not rows.n:
            self.rows += rows.n
            return
        with np.errstate(over="ignore"):
            combined = np.zeros(rows.n, dtype=np.uint64)
            for i, name in enumerate(("topic", "key", "value")):
                if name in rows.arrays:
                    combined = _fmix(combined ^ (self._column(rows.arrays[name]) * _MIX[i]))
            if "partition" in rows.arrays:
                parts = pc.fill_null(rows.arrays["partition"], -1).cast(pa.int64())
                combined = _fmix(combined ^ (parts.to_numpy(zero_copy_only=False).view(np.uint64) * _MIX[3]))
            if rows.headers is not None:
                combined = _fmix(combined ^ (self._headers(rows.headers) * _MIX[4]))
            first = _fmix(combined)
            second = _fmix(combined ^ np.uint64(0x2545F4914F6CDD1D))
        self._sums[0] = (self._sums[0] + int(first.sum(dtype=np.uint64))) % 2**64
        self._sums[1] = (self._sums[1] + int(second.sum(dtype=np.uint64))) % 2**64
        self.rows += rows.n

    def hexdigest(self) -> str:
        if self.count_only:
            return f"rows:{self.rows}"
        total = hashlib.blake2b(struct.pack("<qQQ", self.rows, *self._sums), digest_size=16)
        return f"{DIGEST_VERSION}:{total.hexdigest()}"
