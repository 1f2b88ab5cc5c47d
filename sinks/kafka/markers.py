"""The sink's markers: "batch n of this sink is written", kept as a consumer-group offset committed in the
transaction that writes the batch's rows (``send_offsets_to_transaction``), read back with
``require_stable`` so an open transaction is never taken for a decided one.

One marker per *writer*: ``visibility=partition`` has one per task slot (Spark partition), each
written by the slot's own transactional producer; ``visibility=batch`` has one, written by the
driver's publish. Its transactional id and its group id are the same name, built from the sink id
with ``quote`` so that no sink id is a prefix or a part of another's names (``a`` vs ``a:task:1``).

The marker is the offset ``batch + 1`` on partition 0 of the marker topic (a topic that exists: the
broker refuses offsets of unknown partitions) with metadata saying what wrote it: the batch's
lineage (a digest of Spark's ``offsets/n``), the query, the rows and their digest.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from eos_core.errors import FatalError, RetriableError

__all__ = [
    "BATCH_JOB",
    "NAME_PREFIX",
    "Marker",
    "marker_offsets",
    "publish_name",
    "read_marker",
    "read_slot_markers",
    "sink_names",
    "slot_name",
]

NAME_PREFIX = "spark-eos:"
BATCH_JOB = "batch-job"  # the "query" of df.write with batch.id
MARKER_VERSION = 1
MAX_METADATA = 4096  # the broker's default offset.metadata.max.bytes
_UNSTABLE = {
    KafkaError.UNSTABLE_OFFSET_COMMIT,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.REQUEST_TIMED_OUT,
}


def sink_names(sink_id: str) -> str:
    """The part of every transactional and group id of ``sink_id``: ``spark-eos:<quoted id>:``."""
    return f"{NAME_PREFIX}{quote(sink_id, safe='')}:"


def slot_name(sink_id: str, slot: int) -> str:
    """Transactional id and marker group of task slot ``slot`` (visibility=partition)."""
    return f"{sink_names(sink_id)}task:{slot}"


def publish_name(sink_id: str) -> str:
    """Transactional id and marker group of the driver's publish (visibility=batch)."""
    return f"{sink_names(sink_id)}publish"


@dataclass(frozen=True)
class Marker:
    """What a writer of the sink last wrote: batch ``batch`` of lineage ``lineage`` of query ``query``."""

    batch: int
    lineage: str | None  # digest of offsets/<batch>; None for batch jobs (df.write with batch.id)
    query: str | None  # the streaming query's id (its checkpoint's metadata); None for batch jobs
    rows: int
    digest: str  # of the rows as written (task slot) or published (whole batch)
    mode: str  # "partition" | "batch"

    def metadata(self) -> str:
        text = json.dumps(
            {
                "v": MARKER_VERSION,
                "b": self.batch,
                "l": self.lineage,
                "q": self.query,
                "r": self.rows,
                "d": self.digest,
                "m": self.mode,
            },
            separators=(",", ":"),
        )
        if len(text.encode()) > MAX_METADATA:  # pragma: no cover - every field is bounded
            raise FatalError(f"kafka-eos sink: marker metadata of {len(text)} bytes is over {MAX_METADATA}")
        return text

    @classmethod
    def parse(cls, offset: int, metadata: str | None, *, group: str) -> Marker:
        try:
            raw = json.loads(metadata or "")
            if raw.get("v") != MARKER_VERSION or raw["b"] + 1 != offset:
                raise ValueError("not a marker of this version, or its offset is not batch + 1")
            return cls(
                batch=int(raw["b"]),
                lineage=raw.get("l"),
                query=raw.get("q"),
                rows=int(raw["r"]),
                digest=str(raw["d"]),
                mode=str(raw["m"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            raise FatalError(
                f"kafka-eos sink: consumer group {group!r} holds offset {offset} with metadata {str(metadata)[:80]!r}, "
                "which is not a marker of the sink: something else committed offsets to the group the sink keeps "
                "its markers in. Nothing was written. Stop what commits there (a consumer using this group id), "
                "then run `spark-eos kafka-sink status` to see the sink's markers",
                group=group,
            ) from None

    def describe(self) -> str:
        who = f"query {self.query}" if self.query not in (None, BATCH_JOB) else "a batch job"
        lineage = f" (lineage {self.lineage[:12]})" if self.lineage else ""
        return f"batch {self.batch}{lineage} of {who}, {self.rows} rows"


def marker_offsets(topic: str, marker: Marker) -> list[TopicPartition]:
    """The offsets that commit ``marker`` (send_offsets_to_transaction)."""
    return [TopicPartition(topic, 0, marker.batch + 1, metadata=marker.metadata())]


def read_marker(admin: AdminClient, group: str, topic: str, *, timeout: float, stable: bool = True) -> Marker | None:
    """The group's committed marker, waiting while a transaction holding one is open (``stable``: the
    caller fenced the group's writer, so the wait is short), for at most ``timeout`` seconds; None when
    the group has none. ``stable=False``: the last committed marker, whatever transaction is open."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            futures = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])],
                require_stable=stable,
                request_timeout=max(1.0, min(remaining, 30.0)),
            )
            result = futures[group].result()
            (tp,) = result.topic_partitions
            err = tp.error
            if err is None:
                if tp.offset < 0:
                    return None
                return Marker.parse(tp.offset, tp.metadata, group=group)
            last = err
            if err.code() not in _UNSTABLE:
                raise FatalError(
                    f"kafka-eos sink: reading the marker of consumer group {group!r} on {topic}-0 failed: "
                    f"{err.name()} ({err.str()}); grant the sink's principal DESCRIBE and READ on the group",
                    group=group,
                )
        except KafkaException as exc:
            last = exc.args[0] if exc.args else exc
            code = last.code() if isinstance(last, KafkaError) else None
            if code not in _UNSTABLE and code is not None and not last.retriable():
                raise FatalError(
                    f"kafka-eos sink: reading the marker of consumer group {group!r} failed: {last}", group=group
                ) from None
        if time.monotonic() + 0.2 > deadline:
            raise RetriableError(
                f"kafka-eos sink: the marker of consumer group {group!r} on {topic}-0 could not be read within "
                f"{timeout:.0f} s (kafkaProducer.timeoutMs): last {last}. A transaction holding it may still be open "
                "(its producer is fenced or times out after transaction.timeout.ms), or the group coordinator is away",
                group=group,
            )
        time.sleep(0.2)


def read_slot_markers(admin: AdminClient, sink_id: str, topic: str, *, timeout: float) -> dict[int, Marker]:
    """The last committed marker of every task slot of the sink (visibility=partition), by slot: the sink's
    groups are found by their names' prefix, their markers read at once."""
    prefix = f"{sink_names(sink_id)}task:"
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout)
    except KafkaException as exc:
        raise RetriableError(
            f"kafka-eos sink: listing consumer groups (to find the sink's markers) failed: {exc}"
        ) from None
    if listed.errors:  # a broker that did not answer hides the groups it coordinates: a slot's marker unseen
        raise RetriableError(
            f"kafka-eos sink: listing consumer groups (to find the sink's markers) got no answer from every broker: "
            f"{'; '.join(str(e) for e in listed.errors[:3])}"
        )
    groups = sorted(
        g.group_id for g in listed.valid if g.group_id.startswith(prefix) and g.group_id[len(prefix) :].isdigit()
    )
    futures = {
        g: admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g, [TopicPartition(topic, 0)])], request_timeout=timeout
        )[g]
        for g in groups
    }
    found: dict[int, Marker] = {}
    for group, future in futures.items():
        try:
            (tp,) = future.result(timeout).topic_partitions
        except KafkaException as exc:
            raise RetriableError(
                f"kafka-eos sink: reading the marker of consumer group {group!r} failed: {exc}"
            ) from None
        if tp.error is None and tp.offset >= 0:
            found[int(group[len(prefix) :])] = Marker.parse(tp.offset, tp.metadata, group=group)
    return found
