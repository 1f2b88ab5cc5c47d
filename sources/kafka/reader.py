"""Executor side of kafka-eos: read exactly [start, end) of one topic-partition as Arrow record batches."""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import operator
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as CkTopicPartition

from eos_core import faults, kafka_clients
from eos_core.errors import DataLossError, RetriableError
from eos_core.spark_task import task_identity
from sources.kafka.client import DENIED, UNKNOWN_TOPIC, access_denied
from sources.kafka.split import KafkaInputPartition, OffsetRange, ReadSettings

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
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
# confluent-kafka's accessors, mapped over a whole consume() result at C speed
_KEY, _VALUE, _OFFSET, _STAMP, _ERROR, _HEADERS = (
    Message.key,
    Message.value,
    Message.offset,
    Message.timestamp,
    Message.error,
    Message.headers,
)
_first, _second = operator.itemgetter(0), operator.itemgetter(1)


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
        # once its queue is full librdkafka waits fetch.queue.backoff.ms (1 s by default) before it
        # fetches again, however soon the queue drains: a task draining its range at full speed then
        # idles most of the time (2-3x slower on one partition, measured in bench/kafka_source.py)
        conf.setdefault("fetch.queue.backoff.ms", 10)
        # a task reads up to its range's end, which is mostly the log's end: librdkafka's prefetch past it waits at
        # the broker for fetch.wait.max.ms (500 ms by default), and the next batch's task on this consumer cannot
        # fetch until that request returns (one fetch in flight per broker). 10 ms: a read task of 5,000 records
        # took 54 -> 25 ms (its first records 42 -> 21 ms), a micro-batch behind kafka-eos 70-80 ms less
        # (docs/benchmarks.md, "Micro-batch profile"). The consumer is unassigned between tasks: no idle polling.
        conf.setdefault("fetch.wait.max.ms", 10)
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
        # its log lines to eos.librdkafka, a refused login to its watch (kafka_clients.check)
        c = kafka_clients.consumer(conf, kafka_clients.Watch(conf, "kafka-eos"))
        _CONSUMERS[key] = c
    return c


class _Columns:
    """Columns of the next Arrow batch, flushed by row count or payload bytes. Timestamps are kept as
    confluent-kafka hands them over, (type, ms), and converted for the whole batch at once in ``flush``."""

    def __init__(self, topic: str, partition: int, headers: bool) -> None:
        self.topic, self.partition, self.headers = topic, partition, headers
        self.schema = arrow_schema(headers)
        self.reset()

    def reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[tuple[int, int]] = []
        self.hdrs: list[list[tuple[str, bytes | None]] | None] = []
        self.bytes = 0

    def add(self, m: Any, offset: int) -> None:
        k, v = m.key(), m.value()
        self.keys.append(k)
        self.values.append(v)
        self.offsets.append(offset)
        self.stamps.append(m.timestamp())
        self.bytes += (len(k) if k else 0) + (len(v) if v else 0) + 32
        if self.headers:
            self.hdrs.append(_header_list(m.headers()))

    def extend(self, run: _Run, lo: int, hi: int, size: int) -> None:
        """``add`` for the records ``lo:hi`` of a clean run, whose fields were fetched in one C-level pass
        each; ``size``: their bytes as ``add`` counts them (``_cut`` has summed them already)."""
        self.keys += run.keys[lo:hi]
        self.values += run.values[lo:hi]
        self.offsets += run.offsets[lo:hi]
        self.stamps += run.stamps[lo:hi]
        self.bytes += size
        if self.headers:
            self.hdrs += [_header_list(h) for h in run.headers[lo:hi]]

    def __len__(self) -> int:
        return len(self.offsets)

    def flush(self) -> pa.RecordBatch:
        n = len(self.offsets)
        kinds = pa.array(list(map(_first, self.stamps)), pa.int32())
        ms = pa.array(list(map(_second, self.stamps)), pa.int64())
        # Java's TimestampType ids as Spark shows them: not available -1, CreateTime 0, LogAppendTime 1
        known = pc.and_(pc.greater_equal(kinds, 0), pc.less_equal(kinds, 2))
        types = pc.if_else(known, pc.subtract(kinds, 1), pa.scalar(-1, pa.int32()))
        valid = pc.and_(pc.not_equal(kinds, 0), pc.greater_equal(ms, 0))
        micros = pc.if_else(valid, pc.multiply_checked(ms, 1000), pa.scalar(None, pa.int64()))
        cols = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            micros.cast(_TIMESTAMP_TYPE),
            types,
        ]
        if self.headers:
            cols.append(pa.array(self.hdrs, pa.list_(_HEADER)))
        batch = pa.RecordBatch.from_arrays(cols, schema=self.schema)
        self.reset()
        return batch


def _header_list(h: Any) -> list[tuple[str, bytes | None]] | None:
    return [(hk, hv) for hk, hv in h] if h else None


class _Run:
    """A run of clean records (no error, no EOF, every offset in the range), each field fetched for
    all of them at once: ``map`` over confluent-kafka's method, no per-record Python frame."""

    def __init__(self, msgs: Sequence[Any], offsets: list[int]) -> None:
        self.msgs, self.offsets = msgs, offsets
        self.keys: list[bytes | None] = list(map(_KEY, msgs))
        self.values: list[bytes | None] = list(map(_VALUE, msgs))
        self.stamps: list[tuple[int, int]] = list(map(_STAMP, msgs))

    @functools.cached_property
    def headers(self) -> list[Any]:
        """Fetched once per run, when the query reads headers (a run can be cut into several batches)."""
        return list(map(_HEADERS, self.msgs))

    def size(self, lo: int, hi: int) -> int:
        """Bytes of records ``lo:hi`` as ``_Columns.add`` counts them (key + value + 32)."""
        return (
            sum(map(len, filter(None, itertools.islice(self.values, lo, hi))))
            + sum(map(len, filter(None, itertools.islice(self.keys, lo, hi))))
            + 32 * (hi - lo)
        )


def _clean_run(msgs: Sequence[Any], position: int, end: int) -> _Run | None:
    """``msgs`` as a run when every one is a record (no error, no EOF) in [position, end), else None
    (then the per-record loop sorts out gaps, errors and records before the seek position)."""
    # a KafkaError is always truthy (no __bool__; its == raises on None, so no count(None))
    if not msgs or any(map(_ERROR, msgs)):
        return None
    offsets = cast(list[int], list(map(_OFFSET, msgs)))  # a record (no error) always has its offset
    if offsets[0] < position or offsets[-1] >= end:  # one partition: offsets come in order
        return None
    return _Run(msgs, offsets)


def _cut(run: _Run, lo: int, cols: _Columns, s: ReadSettings, half: int | None) -> tuple[int, int]:
    """Where the records from ``lo`` on stop going into the current Arrow batch (after the one that fills
    it, by rows or payload bytes as the per-record loop flushes, or passes the range's middle), and
    the bytes of ``lo:hi``. The common case, a run that fits, costs one C-level sum per field."""
    hi = min(len(run.offsets), lo + max(1, s.arrow_batch_rows - len(cols)))
    size = run.size(lo, hi)
    budget = s.arrow_batch_bytes - cols.bytes
    if size >= budget and hi - lo > 1:
        keys, values = run.keys, run.values
        sizes = list(itertools.accumulate(len(values[i] or b"") + len(keys[i] or b"") + 32 for i in range(lo, hi)))
        hi = lo + min(hi - lo, bisect.bisect_left(sizes, budget) + 1)
        size = sizes[hi - lo - 1]
    if half is not None and run.offsets[hi - 1] >= half:
        hi = bisect.bisect_left(run.offsets, half, lo, hi) + 1
        size = run.size(lo, hi)
    return hi, size


def _batch_id() -> str | None:
    """The micro-batch this read task belongs to, as Spark's local property spells it (None: batch job)."""
    batch = task_identity().stream_batch
    return None if batch is None else str(batch)


class _Batches:
    """The Arrow batches of one read: the columns being filled and the position reached. A batch goes
    out when it is full (rows or bytes); once past the range's middle, the rest goes out and the
    ``source.read.mid`` fault point fires (once)."""

    def __init__(self, r: OffsetRange, s: ReadSettings, ctx: dict[str, Any]) -> None:
        self.settings, self.ctx = s, ctx
        self.cols = _Columns(r.topic, r.partition, s.include_headers)
        self.half = r.start + r.size // 2
        self.mid_done = False
        self.position = r.start

    def ready(self) -> Iterator[pa.RecordBatch]:
        """The batch that is full; at the range's middle, the rest and the fault point."""
        s, cols = self.settings, self.cols
        if len(cols) >= s.arrow_batch_rows or cols.bytes >= s.arrow_batch_bytes:
            yield cols.flush()
        if not self.mid_done and self.position > self.half:
            self.mid_done = True
            if len(cols):
                yield cols.flush()
            faults.point("source.read.mid", spec=s.faults, **self.ctx)

    def take_run(self, run: _Run) -> Iterator[pa.RecordBatch]:
        """A clean run (records of this range only, in order), cut where batches fill or the middle is."""
        lo = 0
        while lo < len(run.offsets):
            hi, size = _cut(run, lo, self.cols, self.settings, None if self.mid_done else self.half)
            self.cols.extend(run, lo, hi, size)
            self.position = run.offsets[hi - 1] + 1
            lo = hi
            yield from self.ready()


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
        ctx = {"batch": _batch_id(), "topic": r.topic, "partition": r.partition}
        faults.point("source.read.start", spec=s.faults, **ctx)
        consumer = _consumer(s)
        ctp = CkTopicPartition(r.topic, r.partition)
        timeout = s.poll_timeout_ms / 1000.0
        # No watermark round trip first: a start below the log's start (retention) comes back from the
        # fetch as out of range (auto.offset.reset=error) and is judged then, as Spark's consumer does.
        consumer.assign([CkTopicPartition(r.topic, r.partition, r.start)])
        out = _Batches(r, s, ctx)
        deadline = time.monotonic() + timeout
        try:
            while out.position < r.end:
                msgs = consumer.consume(num_messages=min(1000, max(1, r.end - out.position)), timeout=min(1.0, timeout))
                before = out.position
                run = _clean_run(msgs, out.position, r.end)
                if run is not None:  # the common case: records of this range only, in order
                    yield from out.take_run(run)
                else:
                    yield from self._take_messages(consumer, ctp, msgs, out, timeout)
                # measured after the yields too, so a slow consumer of our batches is not a timeout
                if out.position > before:
                    deadline = time.monotonic() + timeout
                elif out.position < r.end:
                    # a refused login (e.g. a rotated password) fails the read within a second, not after
                    # pollTimeoutMs (2 minutes by default) of empty polls that read as an unreachable broker
                    kafka_clients.check(consumer)
                    if time.monotonic() > deadline:  # no progress for pollTimeoutMs: never hang
                        self._timed_out(consumer, ctp, out.position, timeout)
            if len(out.cols):
                yield out.cols.flush()
        finally:
            try:
                consumer.unassign()
            except KafkaException:
                log.debug("unassign failed", exc_info=True)

    def _take_messages(
        self, consumer: Consumer, ctp: CkTopicPartition, msgs: list[Message], out: _Batches, timeout: float
    ) -> Iterator[pa.RecordBatch]:
        """A fetch that is not a clean run, record by record: errors, records of other ranges, gaps."""
        r = self.range
        for m in msgs:
            err = m.error()
            if err is not None:
                resume = self._fetch_error(consumer, ctp, m, err, out.position, timeout)
                if resume is None:
                    continue
                out.position = resume
                break
            off: int = m.offset() or 0
            if off < out.position:
                continue  # already read (a fetch can start below the seek position)
            if off >= r.end:
                out.position = r.end
                break
            out.cols.add(m, off)
            out.position = off + 1
            yield from out.ready()

    def _fetch_error(
        self, consumer: Consumer, ctp: CkTopicPartition, m: Message, err: KafkaError, position: int, timeout: float
    ) -> int | None:
        """What an error in a fetch at ``position`` means: the offset the read resumes at (the rest of this
        fetch is dropped), None to go on with the fetch, or an exception."""
        r = self.range
        if err.code() == KafkaError._PARTITION_EOF:
            if m.topic() == r.topic and m.partition() == r.partition and (m.offset() or 0) >= r.end:
                return r.end  # the rest of the range is a gap (markers, aborted, compacted)
            return None
        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            position = self._out_of_range(consumer, ctp, position, timeout, err)
            consumer.assign([CkTopicPartition(r.topic, r.partition, position)])
            return position
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            # librdkafka looks up the coordinator of the group every consumer must name; a reader never uses
            # the group (it reads by offset and commits nothing), so no group ACL is needed to read
            log.debug("kafka-eos: the coordinator look-up of group %s was refused (unused by a reader)", ctp)
            return None
        if err.code() in DENIED:
            raise access_denied(
                r.topic, err, option="subscribe/subscribePattern/assign", conf=self.settings.consumer_config
            )
        if err.code() in _GONE and self._gone(consumer, ctp, timeout):
            self._loss(
                f"{r.topic}-{r.partition} is gone (topic or partition deleted) while reading "
                f"[{r.start}, {r.end}) at offset {position}: {err.name()}",
                position,
                r.end,
            )
            return r.end  # failOnDataLoss=false: skip the rest of the range
        if err.retriable() or not err.fatal():
            log.warning("kafka-eos: reading %s-%d: %s (retrying)", r.topic, r.partition, err)
            return None
        raise KafkaException(err)

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
                    ctp.topic, exc_err, option="subscribe/subscribePattern/assign", conf=self.settings.consumer_config
                ) from None
            log.warning(
                "kafka-eos: %s-%d offset %d out of range (%s); offsets unavailable: %s (retrying)",
                ctp.topic,
                ctp.partition,
                position,
                err,
                exc,
            )
            return position
        end = self.range.end
        if position < low:
            self._loss(
                f"records {position}..{min(low, end) - 1} of {ctp.topic}-{ctp.partition} are gone "
                f"(earliest offset is now {low})",
                position,
                min(low, end),
            )
            return min(low, end)
        if position < high:
            log.warning(
                "kafka-eos: %s-%d offset %d reported out of range [%d, %d) (%s); seeking again",
                ctp.topic,
                ctp.partition,
                position,
                low,
                high,
                err,
            )
            return position
        self._loss(
            f"records {position}..{end - 1} of {ctp.topic}-{ctp.partition} are gone: the partition now ends at "
            f"{high} (the log was truncated, e.g. by an unclean leader election) ({err})",
            position,
            end,
        )
        return end

    def _loss(self, what: str, skip_from: int, skip_to: int) -> None:
        """Fail the task on lost records [skip_from, skip_to), or (failOnDataLoss=false) log how many are skipped."""
        if self.settings.fail_on_data_loss:
            raise DataLossError(
                f"kafka-eos: {what}. Some data may have been lost; set failOnDataLoss=false to skip it.",
                read_range=str(self.range),
            )
        # PySpark's Python sources have no metrics hook: this line (in the executor's log) is where a skip shows
        log.warning(
            "kafka-eos: %s; skipped %d offset(s) of %s-%d, [%d, %d) (failOnDataLoss=false)",
            what,
            skip_to - skip_from,
            self.range.topic,
            self.range.partition,
            skip_from,
            skip_to,
        )

    def _timed_out(self, consumer: Consumer, ctp: CkTopicPartition, position: int, timeout: float) -> None:
        # (a refused login was looked for after the empty poll that led here)
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


def read_partition(
    part: KafkaInputPartition, decoders: dict[str, Any] | None = None, *, flat: bool = False
) -> Iterator[pa.RecordBatch]:
    """Spark's read(): Arrow batches of exactly the records in the partition's range, their key and value decoded
    by ``decoders`` (``sources.kafka.formats``) when given, the value's fields as columns when ``flat``."""
    batches = iter(KafkaPartitionReader(part))
    if not decoders:
        return batches
    from sources.kafka.formats import decode_batch

    return (decode_batch(batch, decoders, flat=flat) for batch in batches)
