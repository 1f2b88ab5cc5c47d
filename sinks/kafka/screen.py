"""What the broker (or librdkafka) would refuse, found before anything of the batch is visible, and the
dead-letter record a refused row becomes with ``errors.tolerance=all``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from eos_core.errors import FatalError
from sinks.kafka.client import KafkaLookups
from sinks.kafka.records import RECORD_OVERHEAD, WIRE_SLACK, Record, RowBatch, TopicLimits, record_size

__all__ = ["DataRefused", "Screen", "dead_letter"]

DEFAULT_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes


class DataRefused(FatalError):
    """A row the broker would refuse, with errors.tolerance=none: the batch fails before any of it is visible."""


@dataclass
class Screen:
    """Checks rows against the topics' limits (looked up once per topic) and the producer's."""

    lookups: KafkaLookups
    message_max_bytes: int
    context: str

    def refused(self, rows: RowBatch, *, stage_tag: str | None = None) -> dict[int, str]:
        """Row index -> why the broker (or librdkafka) would refuse it (empty for a good batch: the common case is
        vectorised). ``stage_tag``: the rows are staged first, with the staging header."""
        out: dict[int, str] = {}
        limits = self.lookups.limits(sorted({t for t in rows.topics if t is not None}))
        sizes = rows.producer_sizes(stage_tag)
        staged = ", the staging header" if stage_tag is not None else ""
        for i in np.nonzero(sizes > self.message_max_bytes)[0].tolist():
            out[i] = (
                f"the record is {int(sizes[i])} bytes as librdkafka counts it (key + value + headers{staged} + "
                f"{RECORD_OVERHEAD} bytes of record overhead), over the producer's message.max.bytes "
                f"{self.message_max_bytes} (option kafka.max.request.size or kafka.message.max.bytes)"
            )
        for i in self._suspects(rows, limits, sizes):
            if i not in out:
                why = self._why(rows.record(i), limits)
                if why is not None:
                    out[i] = why
        return out

    @staticmethod
    def _suspects(rows: RowBatch, limits: dict[str, TopicLimits | None], sizes: np.ndarray) -> list[int]:
        """The rows worth a closer look: every row when a topic is null or unknown, compacted, or a partition is
        named; else those whose size comes near the smallest topic limit."""
        known = [lim for lim in limits.values() if lim is not None]
        if (
            len(known) < len(limits)
            or None in rows.topics
            or any(lim.compacted or lim.internal for lim in known)
            or any(p is not None for p in rows.partitions)
        ):
            return list(range(rows.n))
        smallest = min((lim.max_message_bytes for lim in known), default=0)
        return [int(i) for i in np.nonzero(sizes + WIRE_SLACK > smallest)[0].tolist()]

    def _why(self, rec: Record, limits: dict[str, TopicLimits | None]) -> str | None:
        if rec.topic is None:
            return "the row's topic is null and option 'topic' is not set"
        lim = limits.get(rec.topic)
        if lim is None:
            return f"topic {rec.topic!r} does not exist"
        if lim.internal:
            return f"topic {rec.topic!r} is internal to Kafka (the broker refuses every record written to it)"
        if rec.partition is not None and not 0 <= rec.partition < lim.partitions:
            return f"partition {rec.partition} does not exist: topic {rec.topic!r} has {lim.partitions}"
        if rec.key is None and lim.compacted:
            return f"topic {rec.topic!r} is compacted (cleanup.policy compact) and the record has no key"
        _payload, wire = record_size(rec)
        if wire > lim.max_message_bytes:
            return (
                f"the record is {wire} bytes on the wire, over topic {rec.topic!r}'s max.message.bytes "
                f"{lim.max_message_bytes} (raise the topic's max.message.bytes, or make the value smaller)"
            )
        return None

    def refuse(self, rec: Record, why: str, where: str) -> DataRefused:
        key = "null" if rec.key is None else repr(rec.key[:32]) + ("..." if len(rec.key) > 32 else "")
        return DataRefused(
            f"{self.context}: {where}: the broker would refuse a row (topic {rec.topic!r}, key {key}): {why}. "
            "Nothing of the batch is visible; fix the data or the topic and restart the query (it writes the batch "
            "again), or divert such rows with errors.tolerance=all and errors.topic"
        )


def dead_letter(rec: Record, why: str, errors_topic: str, limit: int) -> Record:
    """The record for ``errors_topic``: the row's key, value and headers when they fit under ``limit`` (the
    smaller of the topic's and the producer's limits), else
    without its value; the reason, the intended topic and partition, its size and digest as headers."""
    value = rec.value or b""
    headers = [
        ("eos.error.reason", why.encode()),
        ("eos.error.topic", (rec.topic or "").encode()),
        ("eos.error.partition", b"" if rec.partition is None else str(rec.partition).encode()),
        ("eos.error.size", str(len(value)).encode()),
        ("eos.error.sha256", hashlib.sha256(value).hexdigest().encode()),
    ]
    kept = Record(errors_topic, rec.key, rec.value, [*(rec.headers or []), *headers], None)
    if record_size(kept)[1] <= limit:
        return kept
    return Record(
        errors_topic, (rec.key or b"")[:1024] or None, None, [*headers, ("eos.error.truncated", b"true")], None
    )
