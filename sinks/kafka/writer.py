"""The task side of the ``kafka-eos`` sink: write (visibility=partition) or stage (visibility=batch) one
task's rows (see the protocol in ``sinks.kafka``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import pyarrow as pa

from eos_core import faults
from eos_core.errors import FatalError, RetriableError
from eos_core.spark_task import TaskIdentity, task_identity
from sinks.kafka.client import KafkaLookups, Row, StagingProducer, TxnProducer, forget, slot_producer
from sinks.kafka.markers import Marker, marker_offsets, publish_name, read_marker, slot_name
from sinks.kafka.plan import KafkaSinkMessage, KafkaSinkPlan, meet_marker, replay_help
from sinks.kafka.records import STAGE_HEADER, RowBatch, RowDigest, stage_header_size, stage_route
from sinks.kafka.screen import DEFAULT_MESSAGE_MAX_BYTES, Screen, dead_letter

__all__ = ["write_task"]

log = logging.getLogger("sinks.kafka")


def write_task(plan: KafkaSinkPlan, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkMessage:
    missing = [c for c in plan.encoded if c not in plan.encoders]
    if missing:  # made when the writer is pickled for the tasks (sinks.kafka.spark._Roles): never write a struct raw
        raise FatalError(f"{plan.context}: no encoder for the {'/'.join(missing)} column: the writer was not readied")
    who: TaskIdentity = task_identity()
    opts = plan.opts
    batch = opts.batch_id if opts.batch_id is not None else who.stream_batch
    if batch is None:
        raise FatalError(f"{plan.context}: no batch id: Spark did not set streaming.sql.batchId for this task")
    if plan.encoders:  # key.format/value.format=avro|json-schema: everything after this sees the bytes written
        from sinks.kafka.formats import encode_batch

        iterator = (encode_batch(arrow, plan.encoders) for arrow in iterator)
    conf = plan.producer_config()
    lookups = KafkaLookups(conf, timeout=opts.timeout_ms / 1000, context=plan.context)
    try:
        run = _TaskRun(plan, who, batch, lookups, conf)
        faults.point("sink.before_write", spec=opts.faults, **run.fctx)
        return run.stage(iterator) if opts.staged else run.write(iterator)
    finally:
        lookups.close()


class _TaskRun:
    def __init__(
        self, plan: KafkaSinkPlan, who: TaskIdentity, batch: int, lookups: KafkaLookups, conf: dict[str, str]
    ) -> None:
        if plan.batch is not None and plan.batch != batch:
            raise FatalError(
                f"{plan.context}: a task of batch {batch} got the writer Spark built for batch {plan.batch}"
            )
        self.plan, self.who, self.batch, self.lookups, self.conf = plan, who, batch, lookups, conf
        self.opts = plan.opts
        self.timeout = self.opts.timeout_ms / 1000
        self.fctx = {"batch": batch, "partition": who.partition, "attempt": who.attempt, "sink": plan.opts.sink_id}
        max_bytes = int(conf.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
        self.screen = Screen(lookups, max_bytes, plan.context)
        self.digest = RowDigest(count_only=self.opts.staged)  # K2 compares digests only with visibility=partition
        self.diverted = 0
        self.where = f"batch {batch}, partition {who.partition}"
        self._errors_limit: int | None = None
        self.stage_tag: str | None = None  # set while the task stages: its rows carry the staging header

    def message(self, **fields: object) -> KafkaSinkMessage:
        return KafkaSinkMessage(
            slot=self.who.partition,
            batch=self.batch,
            attempt=self.who.attempt,
            rows=self.digest.rows,
            digest=self.digest.hexdigest(),
            diverted=self.diverted,
            **fields,  # type: ignore[arg-type]
        )

    def _rows(self, iterator: Iterator[pa.RecordBatch]) -> Iterator[list[Row]]:
        """Each Arrow batch's rows as the producer sends them; a refused row as its dead letter (K3), or
        DataRefused before anything of the batch is visible."""
        for arrow in iterator:
            rows = RowBatch(arrow, self.plan.columns, self.opts.topic)
            self.digest.add(rows)
            heads = rows.headers if rows.headers is not None else [None] * rows.n
            out: list[Row] = list(zip(rows.topics, rows.values, rows.keys, heads, rows.partitions, strict=True))
            for i, why in (self.screen.refused(rows, stage_tag=self.stage_tag) if rows.n else {}).items():
                rec = rows.record(i)
                if self.opts.errors_topic is None:
                    raise self.screen.refuse(rec, why, self.where)
                self.diverted += 1
                letter = dead_letter(rec, why, self.opts.errors_topic, self._dead_letter_limit())
                out[i] = (self.opts.errors_topic, letter.value, letter.key, letter.headers, None)
            yield out

    def _dead_letter_limit(self) -> int:
        if self._errors_limit is None:
            assert self.opts.errors_topic is not None
            topic = self.lookups.require(self.opts.errors_topic, "errors.topic")
            self._errors_limit = min(topic.max_message_bytes, self.screen.message_max_bytes)
        if self.stage_tag is not None:  # a staged dead letter carries the staging header too
            return self._errors_limit - stage_header_size(self.stage_tag, self.opts.errors_topic, None)
        return self._errors_limit

    # -- visibility=partition: the task writes and commits its rows with its marker ------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkMessage:
        name = slot_name(self.opts.sink_id, self.who.partition)
        marker_topic = self.opts.markers_on
        assert marker_topic is not None
        producer, marker, warm = self._slot_producer(name, marker_topic)
        try:
            done = meet_marker(self.plan, marker, self.batch, f"task slot {self.who.partition}")
            if done:
                assert marker is not None
                return self._replayed(iterator, marker)
            if self.plan.written:  # a replay of a partly written batch: the driver publishes (K2)
                return self.stage(iterator, checked=True)
            batches = self._rows(iterator)
            first = next(batches, None)  # the query's work before the first row runs here, outside any transaction
            if warm:  # the transaction begins now, at the first row (K4): its clock starts here
                assert marker is not None
                producer = self._prove(producer, name, marker_topic, marker)
            else:
                producer.begin()
            try:
                for rows in itertools.chain([] if first is None else [first], batches):
                    producer.send(rows)
            except BaseException:
                producer.abort_quietly()
                raise
            faults.point("sink.after_write", spec=self.opts.faults, **self.fctx, rows="transaction")
            written = Marker(
                batch=self.batch,
                lineage=self.plan.lineage,
                query=self.plan.query,
                rows=self.digest.rows,
                digest=self.digest.hexdigest(),
                mode="partition",
            )
            producer.commit([(marker_offsets(marker_topic, written), name)])
        except BaseException:
            forget(producer)  # failed or fenced (its open transaction aborted): the slot's next task initialises anew
            raise
        faults.point("sink.task.after_commit", spec=self.opts.faults, **self.fctx)
        return self.message()

    def _slot_producer(self, name: str, marker_topic: str) -> tuple[TxnProducer, Marker | None, bool]:
        """The slot's producer, its last marker, and whether the producer is a warm one still to prove itself
        (``_prove``, at the first row). A producer this worker kept from the slot's last task
        (``slot_producer``) is used without initialising when the slot has a marker to prove itself with;
        otherwise, and for a retried attempt, a new producer initialises, fencing every older one and
        aborting its open transaction."""
        producer, warm = slot_producer(
            self.conf, name, timeout=self.timeout, context=self.plan.context, fresh=self.who.attempt > 0
        )
        if warm:
            try:
                marker = read_marker(self.conf, name, marker_topic, timeout=min(self.timeout, 3.0))
            except RetriableError:  # a transaction holds the marker: another producer with our id is at work
                marker = None
            if marker is not None:
                return producer, marker, True
            forget(producer)
            producer, _ = slot_producer(self.conf, name, timeout=self.timeout, context=self.plan.context, fresh=True)
        try:
            producer.init()  # fences every older attempt of this slot, aborting its open transaction
            return producer, read_marker(self.conf, name, marker_topic, timeout=self.timeout), False
        except BaseException:
            forget(producer)
            raise

    def _prove(self, producer: TxnProducer, name: str, marker_topic: str, marker: Marker) -> TxnProducer:
        """The warm producer proves it is still the slot's newest producer: it opens the task's transaction with
        the slot's marker as read (the coordinator refuses a fenced producer). Done at the first row, so the
        transaction's clock (kafka.transaction.timeout.ms) starts where the docs say. A producer that fails
        (fenced: another attempt of the slot initialised since; or a failed begin) is let go, its transaction
        aborted, and a new one initialises; the slot's marker must still be the one the task met, else another
        attempt wrote the slot meanwhile and this one fails (retriable: Spark's next attempt meets the marker)."""
        try:
            producer.begin()
            producer.add_markers([(marker_offsets(marker_topic, marker), name)])
            return producer
        except (RetriableError, FatalError) as exc:
            log.info(
                "%s: %s: the kept producer of the slot failed its proof (%s); a new one takes over",
                self.plan.context,
                self.where,
                exc,
            )
            forget(producer)
        fresh, _ = slot_producer(self.conf, name, timeout=self.timeout, context=self.plan.context, fresh=True)
        try:
            fresh.init()
            now = read_marker(self.conf, name, marker_topic, timeout=self.timeout)
            if now != marker:
                raise RetriableError(
                    f"{self.plan.context}: {self.where}: the slot's marker changed while this task ran (it met "
                    f"{marker.describe()}, the slot now holds {now.describe() if now else 'none'}): another attempt of "
                    "the slot wrote it meanwhile. Nothing of this attempt is visible; Spark's next attempt meets the marker",
                    batch_id=self.batch,
                    partition=self.who.partition,
                )
            fresh.begin()
            return fresh
        except BaseException:
            forget(fresh)
            raise

    def _replayed(self, iterator: Iterator[pa.RecordBatch], marker: Marker) -> KafkaSinkMessage:
        """K2: this slot wrote the batch before; its rows now must be the rows it wrote."""
        for arrow in iterator:
            self.digest.add(RowBatch(arrow, self.plan.columns, self.opts.topic))
        if (self.digest.rows, self.digest.hexdigest()) != (marker.rows, marker.digest):
            raise FatalError(
                f"{self.plan.context}: {self.where} was written before ({marker.describe()}), but this replay gives "
                f"the partition {self.digest.rows} other rows: the query's partitioning or its transformations changed "
                "between the crash and the restart (minPartitions, maxRecordsPerPartition, repartition, the code). "
                "With visibility=partition a replay must give each task the rows it had. Nothing more was written. "
                "Restore the query as it was to finish this batch, then change it. "
                + _schema_hint(self.plan)
                + replay_help(self.opts.sink_id),
                batch_id=self.batch,
                partition=self.who.partition,
            )
        log.info("%s: %s was written before; this task writes nothing", self.plan.context, self.where)
        return self.message(skipped=True)

    # -- visibility=batch: the task stages its rows; the driver publishes the batch -------------------

    def stage(self, iterator: Iterator[pa.RecordBatch], *, checked: bool = False) -> KafkaSinkMessage:
        """Send the rows to the staging topic; ``checked``: the caller met this slot's marker already."""
        marker_topic = self.opts.markers_on
        assert marker_topic is not None
        # Not fenced by a task, a publish may hold its marker in an open transaction (a driver that died mid-publish,
        # until the next publish fences it): the last committed marker is what may be skipped on (K1).
        published = (
            None
            if checked
            else read_marker(
                self.conf, publish_name(self.opts.sink_id), marker_topic, timeout=self.timeout, stable=False
            )
        )
        if meet_marker(self.plan, published, self.batch, "the publish"):
            for _ in iterator:
                pass
            log.info("%s: batch %d was published before; nothing staged", self.plan.context, self.batch)
            return self.message(skipped=True)
        staging = self.lookups.require(self.opts.staging_topic, "staging.topic")
        target = self.who.partition % staging.partitions
        tag = self.stage_tag = f"{self.plan.nonce}:{self.who.partition}:{self.who.attempt}"
        producer = StagingProducer(self.conf, timeout=self.timeout, context=self.plan.context)
        staging_topic = self.opts.staging_topic
        routes: dict[tuple[str | None, int | None], bytes] = {}  # the header, encoded once per destination
        for rows in self._rows(iterator):
            staged: list[Row] = []
            for topic, value, key, headers, part in rows:
                route = routes.get((topic, part))
                if route is None:
                    route = routes[(topic, part)] = stage_route(tag, topic, part)
                staged.append((staging_topic, value, key, [*(headers or ()), (STAGE_HEADER, route)], target))
            producer.send(staged)
        ranges = producer.finish()
        faults.point("sink.after_write", spec=self.opts.faults, **self.fctx, rows="staged")
        return self.message(
            tag=tag, staged=tuple((p, first, last, n) for p, (first, last, n) in sorted(ranges.items()))
        )


def _schema_hint(plan: KafkaSinkPlan) -> str:
    """With encoded columns the bytes also follow the writer schema: a new version between the crash and this
    replay changes them though the rows are the same (key.schema/value.schema latest)."""
    if not plan.encoders:
        return ""
    ids = ", ".join(f"{c}.schema=id:{e.schema_id}" for c, e in sorted(plan.encoders.items()))
    return (
        f"The {'/'.join(sorted(plan.encoders))} column is encoded with this replay's writer schema ({ids}): if the "
        "subject got a new version since the crash (latest), pin the schema the batch was written with "
        "(id:N, found in the records already written) instead of resetting the sink, which would write rows twice. "
    )
