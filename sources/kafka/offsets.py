"""Kafka source offsets: topic-partition -> offset maps in the canonical JSON of Spark's JVM source.

The offsets kafka-eos writes also record the id of each topic they hold (Kafka 4's topic ids), so a topic
deleted and re-created under its name is told apart from the one the offsets are of. An id is kept as a key
of its own whose value is an empty map, ``"kafka-eos:topic-id:<topic>=<id>": {}``: Spark's own Kafka source
reads an offset as ``Map[String, Map[Int, Long]]`` (``JsonUtils.partitionOffsets``) and an empty map gives
it no partition, so a checkpoint stays readable by either source; ``:`` and ``=`` are in no topic name.

The end of a stream's first batch also records where that batch starts, ``"kafka-eos:start:<topic>=<p>:<offset>,
..."``: {}`` (``with_start``, ``batch_start``). Spark keeps no start of batch 0 for a Python source (it asks
``initialOffset`` again on a restart), and a start such as latest or earliest means other offsets later; kept in
``offsets/0``, the start makes a replay of batch 0 read exactly what the batch was planned to read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from eos_core.errors import ConfigError

__all__ = [
    "EARLIEST",
    "ID_KEY",
    "LATEST",
    "START_KEY",
    "PartitionOffsets",
    "TopicPartition",
    "batch_start",
    "dumps",
    "from_json",
    "is_symbolic",
    "kafka_uuid",
    "to_json",
    "topic_ids",
    "with_ids",
    "with_start",
]

ID_KEY = "kafka-eos:topic-id:"
"""The prefix of a topic id's key in an offset dict: ``kafka-eos:topic-id:<topic>=<id>`` -> ``{}``."""
START_KEY = "kafka-eos:start:"
"""The prefix of a first batch's start in its end: ``kafka-eos:start:<topic>=<p>:<offset>,...`` -> ``{}``."""
_OWN = "kafka-eos:"  # keys of kafka-eos's own (ids, a first batch's start), each mapped to {}: no partition

EARLIEST = -2
"""Sentinel offset: the earliest offset still in the log (Spark's JSON uses -2)."""
LATEST = -1
"""Sentinel offset: the offset after the last record (Spark's JSON uses -1)."""
INT64_MAX = 2**63 - 1  # Kafka's offsets and timestamps are signed 64-bit longs
"""The largest offset Kafka (and Spark's JSON, a Long) can hold."""


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


PartitionOffsets = dict[TopicPartition, int]


def _check(tp: TopicPartition, offset: int, *, symbolic: bool) -> None:
    if not isinstance(tp.topic, str) or not tp.topic:
        raise ValueError(f"offset map: topic must be a non-empty string, got {tp.topic!r}")
    if not isinstance(tp.partition, int) or isinstance(tp.partition, bool) or tp.partition < 0:
        raise ValueError(f"offset map: partition of {tp.topic!r} must be an int >= 0, got {tp.partition!r}")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueError(f"offset map: offset of {tp} must be an int, got {offset!r}")
    if offset > INT64_MAX:
        raise ValueError(f"offset map: offset of {tp} is {offset}; expected at most {INT64_MAX} (a 64-bit offset)")
    if offset < 0 and not (symbolic and offset in (EARLIEST, LATEST)):
        raise ValueError(f"offset map: offset of {tp} is {offset}; expected >= 0" + (" or -2/-1" if symbolic else ""))


def to_json(offsets: Mapping[TopicPartition, int], *, symbolic: bool = False) -> dict[str, dict[str, int]]:
    """The canonical offset dict: topics sorted, partitions in numeric order, partition keys strings.

    Spark compares offsets by their JSON text, so two equal maps must always give the same dict
    (``json.dumps`` keeps insertion order).
    """
    by_topic: dict[str, dict[int, int]] = {}
    for tp, off in offsets.items():
        tp = TopicPartition(*tp)
        _check(tp, off, symbolic=symbolic)
        by_topic.setdefault(tp.topic, {})[tp.partition] = off
    return {t: {str(p): by_topic[t][p] for p in sorted(by_topic[t])} for t in sorted(by_topic)}


def from_json(value: Any, *, symbolic: bool = False, what: str = "offsets") -> PartitionOffsets:
    """Parse an offset dict (or its JSON text) back into a map; invariants checked."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{what}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: expected a JSON object of topic -> {{partition: offset}}, got {value!r}")
    out: PartitionOffsets = {}
    for topic, parts in value.items():
        if str(topic).startswith(_OWN) and parts == {}:
            continue  # a topic id (topic_ids) or a first batch's start (batch_start), no partition
        if not isinstance(parts, dict):
            raise ConfigError(f"{what}: topic {topic!r} must map partitions to offsets, got {parts!r}")
        for p, off in parts.items():
            try:
                tp = TopicPartition(str(topic), int(p))
                _check(tp, off, symbolic=symbolic)
            except ValueError as exc:
                raise ConfigError(f"{what}: {exc}") from None
            out[tp] = off
    return out


def dumps(offsets: Mapping[TopicPartition, int]) -> str:
    """Compact JSON text exactly as Spark's JVM source writes it: {"t":{"0":12}}."""
    return json.dumps(to_json(offsets, symbolic=True), separators=(",", ":"))


def is_symbolic(offsets: Mapping[TopicPartition, int]) -> bool:
    return any(off < 0 for off in offsets.values())


def partitions_of(offsets: Iterable[TopicPartition]) -> list[TopicPartition]:
    return sorted(offsets)


def kafka_uuid(uuid: Any) -> str:
    """A topic id as Kafka writes it (``kafka-topics --describe``: URL-safe base64, no padding), from
    confluent-kafka's ``Uuid`` (standard base64) or its text."""
    return str(uuid).replace("+", "-").replace("/", "_").rstrip("=")


def topic_ids(value: Any) -> dict[str, str]:
    """The topic ids an offset dict (or its JSON text) records: topic -> id; {} for offsets written by Spark's
    source or an earlier kafka-eos."""
    return dict(_own_keys(value, ID_KEY))


def _own_keys(value: Any, prefix: str) -> list[tuple[str, str]]:
    """``(topic, what)`` of each key ``<prefix><topic>=<what>`` mapped to ``{}`` in an offset dict or its JSON text
    (kafka-eos's own keys: ids, a first batch's start); none in anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return []
    if not isinstance(value, dict):
        return []
    out = []
    for key, parts in value.items():
        if str(key).startswith(prefix) and parts == {} and "=" in key:
            topic, _, what = key[len(prefix) :].rpartition("=")
            out.append((topic, what))
    return out


def with_ids(offsets: dict[str, dict[str, int]], ids: Mapping[str, str]) -> dict[str, Any]:
    """``offsets`` (``to_json``'s dict) with the id of each of its topics that ``ids`` knows, keys sorted (Spark
    compares offsets by their JSON text: equal offsets must give the same text)."""
    merged: dict[str, Any] = dict(offsets)
    for topic in offsets:
        if topic in ids:
            merged[f"{ID_KEY}{topic}={ids[topic]}"] = {}
    return {k: merged[k] for k in sorted(merged)}


def with_start(offsets: dict[str, Any], start: Mapping[TopicPartition, int]) -> dict[str, Any]:
    """A first batch's end (``to_json``'s or ``with_ids``' dict) that also records the batch's concrete ``start``
    (``batch_start`` reads it back), keys sorted: equal offsets give the same text."""
    merged: dict[str, Any] = dict(offsets)
    for topic, parts in to_json(start).items():
        merged[f"{START_KEY}{topic}=" + ",".join(f"{p}:{off}" for p, off in parts.items())] = {}
    return {k: merged[k] for k in sorted(merged)}


def batch_start(value: Any) -> PartitionOffsets:
    """The start a first batch's end records (``with_start``); {} for any other offsets (a later batch's end,
    offsets of Spark's source or of a kafka-eos that pinned its start with an empty batch 0)."""
    out: PartitionOffsets = {}
    for topic, listed in _own_keys(value, START_KEY):
        for item in listed.split(","):
            p, _, off = item.partition(":")
            try:
                tp, offset = TopicPartition(topic, int(p)), int(off)
                _check(tp, offset, symbolic=False)
            except ValueError as exc:
                raise ConfigError(f"first batch's start: {START_KEY}{topic}={listed}: {exc}") from None
            out[tp] = offset
    return out
