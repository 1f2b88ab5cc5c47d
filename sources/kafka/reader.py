"""Executor side of kafka-eos: read exactly [start, end) of one topic-partition as Arrow record batches."""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CkTopicPartition

from connectors import faults
from connectors.errors import ConfigError, DataLossError, RetriableError
from sources.kafka.client import DENIED, UNKNOWN_TOPIC, access_denied
from sources.kafka.split import KafkaInputPartition, ReadSettings

__all__ = ["KafkaPartitionReader", "arrow_schema", "read_partition"]

log = logging.getLogger(__name__)

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_BASE = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
_GONE = UNKNOWN_TOPIC | {KafkaError._UNKNOWN_PARTITION}
# confluent-kafka timestamp types -> Java's TimestampType ids that Spark exposes
_TS_TYPE = {1: 0, 2: 1, 0: -1}


def arrow_schema(include_headers: bool) -> pa.Schema:
    """Spark's Kafka schema as Arrow (what the JVM expects from a Python data source)."""
    return pa.schema(_BASE + ([pa.field("headers", pa.list_(_HEADER))] if include_headers else []))


# One consumer per distinct configuration per Python worker, reused by every task it runs.
_CONSUMERS: dict[tuple[tuple[str, str], ...], Consumer] = {}


def _consumer(settings: ReadSettings) -> Consumer:
    key = tuple(sorted(settings.consumer_config.items()))
    c = _CONSUMERS.get(key)
    if c is None:
        conf: dict[str, Any] = dict(settings.consumer_config)
        # librdkafka prefetches up to 64 MB per partition and 50 MB fetch responses by default: cap the
        # prefetch so a read task's memory stays bounded (a user value wins)
        conf.setdefault("queued.max.messages.kbytes", 16384)
        if "message.max.bytes" not in conf:
            conf.setdefault("fetch.max.bytes", 16 * 1024 * 1024)
        conf.update(
            {
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",  # never a silent jump: out-of-range is reported
                "enable.partition.eof": True,  # tells us we are past the end when the range ends in a gap
            }
        )
        try:
            c = Consumer(conf)
        except KafkaException as exc:
            raise ConfigError(f"kafka-eos: the kafka.* options are not a valid consumer configuration: {exc}") from None
        _CONSUMERS[key] = c
    return c


class _Columns:
    """Columns of the next Arrow batch, flushed by row count or payload bytes."""

    def __init__(self, topic: str, partition: int, headers: bool) -> None:
        self.topic, self.partition, self.headers = topic, partition, headers
        self.schema = arrow_schema(headers)
        self.reset()

    def reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[int | None] = []
        self.types: list[int] = []
        self.hdrs: list[list[tuple[str, bytes | None]] | None] = []
        self.bytes = 0

    def add(self, m: Any, offset: int) -> None:
        k, v = m.key(), m.value()
        self.keys.append(k)
        self.values.append(v)
        self.offsets.append(offset)
        ts_type, ts = m.timestamp()
        self.stamps.append(ts * 1000 if ts_type != 0 and ts >= 0 else None)
        self.types.append(_TS_TYPE.get(ts_type, -1))
        self.bytes += (len(k) if k else 0) + (len(v) if v else 0) + 32
        if self.headers:
            h = m.headers()
            self.hdrs.append([(hk, hv) for hk, hv in h] if h else None)

    def extend(self, msgs: Sequence[Any], offsets: Sequence[int], size: int) -> None:
        """``add`` for a run of clean records, one C-level pass per field instead of a Python loop;
        ``size``: their bytes as ``add`` counts them (``_cut`` has summed them already)."""
        stamps = [m.timestamp() for m in msgs]
        self.keys += [m.key() for m in msgs]
        self.values += [m.value() for m in msgs]
        self.offsets += offsets
        self.stamps += [ts * 1000 if kind != 0 and ts >= 0 else None for kind, ts in stamps]
        self.types += [_TS_TYPE.get(kind, -1) for kind, _ in stamps]
        self.bytes += size
        if self.headers:
            self.hdrs += [[(hk, hv) for hk, hv in h] if h else None for h in (m.headers() for m in msgs)]

    def __len__(self) -> int:
        return len(self.offsets)

    def flush(self) -> pa.RecordBatch:
        n = len(self.offsets)
        cols = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.stamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32()),
        ]
        if self.headers:
            cols.append(pa.array(self.hdrs, pa.list_(_HEADER)))
        batch = pa.RecordBatch.from_arrays(cols, schema=self.schema)
        self.reset()
        return batch


def _clean_run(msgs: Sequence[Any], position: int, end: int) -> list[int] | None:
    """The offsets of ``msgs`` when every one is a record (no error, no EOF) in [position, end), else None
    (then the per-record loop sorts out gaps, errors and records before the seek position)."""
    if not msgs or any(m.error() is not None for m in msgs):
        return None
    offsets = [m.offset() for m in msgs]
    if offsets[0] < position or offsets[-1] >= end:  # one partition: offsets come in order
        return None
    return offsets


def _cut(
    msgs: Sequence[Any], offsets: Sequence[int], cols: _Columns, s: ReadSettings, half: int | None
) -> tuple[int, int]:
    """How many of the next records go into the current Arrow batch (up to the one that fills it, by
    rows or payload bytes as the per-record loop flushes, or passes the range's middle), and their bytes."""
    take = min(len(offsets), max(1, s.arrow_batch_rows - len(cols)))
    sizes = list(itertools.accumulate(len(m.value() or b"") + len(m.key() or b"") + 32 for m in msgs[:take]))
    take = min(take, bisect.bisect_left(sizes, s.arrow_batch_bytes - cols.bytes) + 1)
    if half is not None and offsets[take - 1] >= half:
        take = bisect.bisect_left(offsets, half, 0, take) + 1
    return take, sizes[take - 1]


def _batch_id() -> str | None:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    except Exception:  # outside Spark (unit tests, benchmarks)
        return None


class KafkaPartitionReader:
    """Reads one KafkaInputPartition; a generator of Arrow batches that never holds more than one chunk."""

    def __init__(self, part: KafkaInputPartition) -> None:
        self.part = part
        self.range = part.range
        self.settings = part.settings

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        r, s = self.range, self.settings
        if r.size == 0:
            return
        batch = _batch_id()
        ctx = {"batch": batch, "topic": r.topic, "partition": r.partition}
        faults.point("source.read.start", spec=s.faults, **ctx)
        consumer = _consumer(s)
        ctp = CkTopicPartition(r.topic, r.partition)
        timeout = s.poll_timeout_ms / 1000.0
        # No watermark round trip first: a start below the log's start (retention) comes back from the
        # fetch as out of range (auto.offset.reset=error) and is judged then, as Spark's consumer does.
        consumer.assign([CkTopicPartition(r.topic, r.partition, r.start)])
        cols = _Columns(r.topic, r.partition, s.include_headers)
        half = r.start + r.size // 2
        mid_done = False
        position = r.start

        def ready(position: int) -> Iterator[pa.RecordBatch]:
            """The batch that is full (rows or bytes); at the range's middle, the rest and the fault point."""
            nonlocal mid_done
            if len(cols) >= s.arrow_batch_rows or cols.bytes >= s.arrow_batch_bytes:
                yield cols.flush()
            if not mid_done and position > half:
                mid_done = True
                if len(cols):
                    yield cols.flush()
                faults.point("source.read.mid", spec=s.faults, **ctx)

        deadline = time.monotonic() + timeout
        try:
            while position < r.end:
                msgs = consumer.consume(num_messages=min(1000, max(1, r.end - position)), timeout=min(1.0, timeout))
                before = position
                offsets = _clean_run(msgs, position, r.end)
                if offsets is not None:  # the common case: records of this range only, in order
                    while offsets:
                        take, size = _cut(msgs, offsets, cols, s, None if mid_done else half)
                        cols.extend(msgs[:take], offsets[:take], size)
                        position = offsets[take - 1] + 1
                        msgs, offsets = msgs[take:], offsets[take:]
                        yield from ready(position)
                    msgs = []
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if m.topic() == r.topic and m.partition() == r.partition and (m.offset() or 0) >= r.end:
                                position = r.end  # the rest of the range is a gap (markers, aborted, compacted)
                                break
                            continue
                        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            position = self._out_of_range(consumer, ctp, position, timeout, err)
                            consumer.assign([CkTopicPartition(r.topic, r.partition, position)])
                            break
                        if err.code() in DENIED:
                            raise access_denied(
                                r.topic, err, option="subscribe/subscribePattern/assign", bootstrap=self._bootstrap
                            )
                        if err.code() in _GONE and self._gone(consumer, ctp, timeout):
                            self._loss(
                                f"{r.topic}-{r.partition} is gone (topic or partition deleted) while reading "
                                f"[{r.start}, {r.end}) at offset {position}: {err.name()}"
                            )
                            position = r.end  # failOnDataLoss=false: skip the rest of the range
                            break
                        if err.retriable() or not err.fatal():
                            log.warning("kafka-eos: reading %s-%d: %s (retrying)", r.topic, r.partition, err)
                            continue
                        raise KafkaException(err)
                    off: int = m.offset() or 0
                    if off < position:
                        continue  # already read (a fetch can start below the seek position)
                    if off >= r.end:
                        position = r.end
                        break
                    cols.add(m, off)
                    position = off + 1
                    yield from ready(position)
                # measured after the yields too, so a slow consumer of our batches is not a timeout
                if position > before:
                    deadline = time.monotonic() + timeout
                elif position < r.end and time.monotonic() > deadline:  # no progress for pollTimeoutMs: never hang
                    self._timed_out(consumer, ctp, position, timeout)
            if len(cols):
                yield cols.flush()
        finally:
            try:
                consumer.unassign()
            except KafkaException:
                log.debug("unassign failed", exc_info=True)

    @property
    def _bootstrap(self) -> str:
        return str(self.settings.consumer_config.get("bootstrap.servers", ""))

    def _gone(self, consumer: Consumer, ctp: CkTopicPartition, timeout: float) -> bool:
        """Whether the topic-partition really does not exist (a fresh metadata look-up of this topic only);
        any other answer, or none, is a transient error that the read loop retries."""
        try:
            md = consumer.list_topics(topic=ctp.topic, timeout=min(timeout, 10.0))
        except KafkaException:
            return False
        t = md.topics.get(ctp.topic)
        if t is None or (t.error is not None and t.error.code() in UNKNOWN_TOPIC):
            return True
        return t.error is None and ctp.partition not in t.partitions

    def _out_of_range(self, consumer: Consumer, ctp: CkTopicPartition, position: int, timeout: float, err: Any) -> int:
        """Where to read on after the broker said ``position`` is out of range: below the log's start the
        records are gone (retention, deleted records); within it the error was transient (a leader change)
        and the read seeks again; beyond its end the log was truncated. A loss fails the task unless
        failOnDataLoss=false, which skips what is gone."""
        try:
            low, high = consumer.get_watermark_offsets(ctp, timeout=timeout, cached=False)
        except KafkaException as exc:
            exc_err = exc.args[0] if exc.args else None
            if isinstance(exc_err, KafkaError) and exc_err.code() in DENIED:
                raise access_denied(
                    ctp.topic, exc_err, option="subscribe/subscribePattern/assign", bootstrap=self._bootstrap
                ) from None
            log.warning("kafka-eos: %s-%d offset %d out of range (%s); offsets unavailable: %s (retrying)",
                        ctp.topic, ctp.partition, position, err, exc)  # fmt: skip
            return position
        end = self.range.end
        if position < low:
            self._loss(
                f"records {position}..{min(low, end) - 1} of {ctp.topic}-{ctp.partition} are gone "
                f"(earliest offset is now {low})"
            )
            return min(low, end)
        if position < high:
            log.warning("kafka-eos: %s-%d offset %d reported out of range [%d, %d) (%s); seeking again",
                        ctp.topic, ctp.partition, position, low, high, err)  # fmt: skip
            return position
        self._loss(
            f"records {position}..{end - 1} of {ctp.topic}-{ctp.partition} are gone: the partition now ends at "
            f"{high} (the log was truncated, e.g. by an unclean leader election) ({err})"
        )
        return end

    def _loss(self, what: str) -> None:
        if self.settings.fail_on_data_loss:
            raise DataLossError(
                f"kafka-eos: {what}. Some data may have been lost; set failOnDataLoss=false to skip it.",
                read_range=str(self.range),
            )
        log.warning("kafka-eos: %s; skipping (failOnDataLoss=false)", what)

    def _timed_out(self, consumer: Consumer, ctp: CkTopicPartition, position: int, timeout: float) -> None:
        try:
            low, high = consumer.get_watermark_offsets(ctp, timeout=min(timeout, 5.0), cached=False)
            marks = f"offsets now [{low}, {high})"
        except KafkaException as exc:
            marks = f"watermarks unavailable: {exc}"
        raise RetriableError(
            f"kafka-eos: no record of {ctp.topic}-{ctp.partition} arrived within kafkaConsumer.pollTimeoutMs="
            f"{int(timeout * 1000)} while reading [{self.range.start}, {self.range.end}) at offset {position} "
            f"({marks}; pid {os.getpid()}); is the broker reachable and the topic intact?"
        )


def read_partition(part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Spark's read(): Arrow batches of exactly the records in the partition's range."""
    return iter(KafkaPartitionReader(part))
