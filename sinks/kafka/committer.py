"""The driver side of the ``kafka-eos`` sink: when Spark completes a batch, publish its staged rows into
their topics in one transaction with the batch's marker (visibility=batch); check the tasks' messages
(visibility=partition, where each task committed its own rows)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from eos_core import faults, kafka_clients
from eos_core.errors import FatalError, RetriableError
from eos_core.privileges import KafkaAcl
from sinks.kafka.client import KafkaLookups, Row, TxnProducer
from sinks.kafka.markers import Marker, marker_offsets, publish_name, read_marker, read_slot_markers, slot_name
from sinks.kafka.plan import KafkaSinkMessage, KafkaSinkPlan, meet_marker, partly_written, replay_help
from sinks.kafka.records import split_stage_header

__all__ = ["commit_batch"]

_CHUNK = 100  # staged records sent between two looks at the fault point sink.publish.mid (k = records so far)

log = logging.getLogger("sinks.kafka")


def commit_batch(plan: KafkaSinkPlan, messages: Sequence[object], batch: int) -> None:
    """Spark completed ``batch``: make it visible (visibility=batch) or check what the tasks wrote."""
    if plan.batch is not None and plan.batch != batch:  # the markers would bind batch to another batch's lineage
        raise FatalError(
            f"{plan.context}: Spark commits batch {batch} with the writer it built for batch {plan.batch}",
            batch_id=batch,
        )
    mine = sorted((m for m in messages if isinstance(m, KafkaSinkMessage)), key=lambda m: m.slot)
    if plan.opts.direct and any(m.tag is not None for m in mine):
        _Publish(plan, batch).run(mine)  # a partly written batch's other slots staged (K2)
        return
    if plan.opts.direct:
        rows = sum(m.rows for m in mine)
        log.info(
            "%s: batch %d written by %d tasks (%d rows, %d written before, %d to errors.topic)",
            plan.context,
            batch,
            len(mine),
            rows,
            sum(m.rows for m in mine if m.skipped),
            sum(m.diverted for m in mine),
        )
        faults.point("sink.after_commit", spec=plan.opts.faults, batch=batch, sink=plan.opts.sink_id)
        return
    _Publish(plan, batch).run(mine)


class _Publish:
    def __init__(self, plan: KafkaSinkPlan, batch: int) -> None:
        self.plan, self.batch, self.opts = plan, batch, plan.opts
        self.timeout = self.opts.timeout_ms / 1000
        self.conf = plan.producer_config()
        self.name = publish_name(self.opts.sink_id)

    def run(self, messages: list[KafkaSinkMessage]) -> None:
        opts, batch = self.opts, self.batch
        marker_topic = opts.markers_on
        assert marker_topic is not None
        faults.point("sink.commit.before_decision", spec=opts.faults, batch=batch, sink=opts.sink_id)
        lookups = KafkaLookups(self.conf, timeout=self.timeout, context=self.plan.context)
        producer = TxnProducer(self.conf, self.name, timeout=self.timeout, context=self.plan.context)
        try:
            producer.init()  # fences an older driver (a zombie of a crashed run), aborting its open publish
            if opts.staged:
                groups = [self.name]
                staged = messages
            else:  # visibility=partition, a partly written batch: the slots that staged get their markers here
                self._every_written_slot_replayed(lookups, messages)
                staged = [m for m in messages if m.tag is not None]
                groups = [slot_name(opts.sink_id, m.slot) for m in staged]
            found = [read_marker(self.conf, g, marker_topic, timeout=self.timeout) for g in groups]
            done = [
                meet_marker(self.plan, marker, batch, f"group {g}") for g, marker in zip(groups, found, strict=True)
            ]
            if all(done):
                log.info("%s: batch %d was published before; nothing to do", self.plan.context, batch)
                return
            skipped = [m.slot for m in staged if m.skipped]
            if skipped or any(done):  # a task saw the batch published, the publish finds it not: a marker went away
                raise FatalError(
                    f"{self.plan.context}: tasks {skipped} of batch {batch} found it published, the publish does "
                    "not: the sink's marker groups were deleted or reset meanwhile; restart the query",
                    batch_id=batch,
                )
            producer.begin()
            try:
                published = self._copy(producer, staged)
            except BaseException:
                producer.abort_quietly()
                raise
            producer.commit(self._markers(staged, published, groups, marker_topic))
        finally:
            producer.close()
            lookups.close()
        log.info("%s: batch %d published (%d records from %d tasks)", self.plan.context, batch, published, len(staged))
        faults.point("sink.after_commit", spec=opts.faults, batch=batch, sink=opts.sink_id)

    def _every_written_slot_replayed(self, lookups: KafkaLookups, messages: list[KafkaSinkMessage]) -> None:
        """K2 across slots: every slot whose marker says this batch must be among this replay's tasks (and
        have skipped). A replay with fewer task slots than the attempt that wrote part of the batch would
        otherwise publish, through the slots it has, rows a vanished slot already made visible."""
        assert self.opts.markers_on is not None
        slots = read_slot_markers(
            lookups.admin, self.conf, self.opts.sink_id, self.opts.markers_on, timeout=self.timeout
        )
        written = {slot for slot, _rows, _digest in partly_written(self.plan, slots, batch=self.batch)}
        replayed = {m.slot for m in messages if m.skipped}
        if written - replayed:
            raise FatalError(
                f"{self.plan.context}: batch {self.batch} was partly written before: task slots "
                f"{sorted(written)} committed their rows, but this replay ran slots {sorted(m.slot for m in messages)} "
                f"and slots {sorted(written - replayed)} are not among them: the query's partitioning changed between "
                "the crash and the restart (fewer tasks: minPartitions, maxRecordsPerPartition, repartition, the "
                "code). Nothing of this replay was made visible. Restore the query as it was to finish this batch "
                "(its missing slots then skip what they wrote), then change it. " + replay_help(self.opts.sink_id),
                batch_id=self.batch,
            )

    def _markers(
        self, staged: list[KafkaSinkMessage], published: int, groups: list[str], topic: str
    ) -> list[tuple[list[TopicPartition], str]]:
        """The publish's marker (visibility=batch), or each staged slot's own (visibility=partition)."""

        def marker(rows: int, digest: str, mode: str) -> Marker:
            return Marker(self.batch, self.plan.lineage, self.plan.query, rows, digest, mode)

        if self.opts.staged:
            joined = "+".join(f"{m.slot}:{m.digest}" for m in staged)
            digest = hashlib.blake2b(joined.encode(), digest_size=16).hexdigest()
            return [(marker_offsets(topic, marker(published, digest, "batch")), groups[0])]
        return [
            (marker_offsets(topic, marker(m.rows, m.digest, "partition")), g)
            for m, g in zip(staged, groups, strict=True)
        ]

    def _copy(self, producer: TxnProducer, messages: list[KafkaSinkMessage]) -> int:
        """Read every task's staged records and send them to their topics in the open transaction."""
        settings: dict[str, Any] = {
            **{k: v for k, v in self.conf.items() if k.startswith(("bootstrap", "security", "sasl", "ssl", "client"))},
            "group.id": self.name + ":reader",
            "enable.auto.commit": "false",
            "enable.partition.eof": "false",
            "auto.offset.reset": "error",
            "isolation.level": "read_uncommitted",
            "fetch.max.bytes": str(64 * 1024 * 1024),
        }
        consumer = kafka_clients.consumer(settings, kafka_clients.Watch(settings, self.plan.context))
        published = 0
        try:
            for m in messages:
                for part, first, last, count in m.staged:
                    published += self._copy_range(consumer, producer, m, part, first, last, count, published)
        finally:
            consumer.close()
        return published

    def _copy_range(
        self,
        consumer: Consumer,
        producer: TxnProducer,
        m: KafkaSinkMessage,
        part: int,
        first: int,
        last: int,
        count: int,
        before: int,
    ) -> int:
        topic = self.opts.staging_topic
        consumer.assign([TopicPartition(topic, part, first)])
        got = 0
        routes: dict[bytes, tuple[Any, ...]] = {}  # a task attempt's records share a few header values
        deadline = time.monotonic() + self.timeout
        tag = m.tag
        position = first
        while position <= last:
            # never ask for more than the range holds: consume() waits its whole timeout for a count it cannot fill
            batch = consumer.consume(num_messages=max(1, min(10_000, last - position + 1)), timeout=1.0)
            if not batch:
                kafka_clients.check(consumer)  # a refused login fails the publish now, not after the timeout
                if time.monotonic() > deadline:
                    raise RetriableError(
                        f"{self.plan.context}: the staged records of batch {self.batch}, task {m.slot} ({topic}-{part} "
                        f"offsets {first}..{last}) did not arrive within {self.timeout:.0f} s; the batch is published "
                        "when the query runs it again"
                    )
                continue
            deadline = time.monotonic() + self.timeout
            rows: list[Row] = []
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() in (KafkaError._PARTITION_EOF, KafkaError.GROUP_AUTHORIZATION_FAILED):
                        continue  # the reader's group is never used (its coordinator look-up may be refused)
                    if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        acl = KafkaAcl("topic", topic, "READ", why="the publish reads the staged rows (staging.topic)")
                        raise FatalError(kafka_clients.refused_access(self.conf, err, [acl], self.plan.context))
                    raise RetriableError(
                        f"{self.plan.context}: reading the staged records of batch {self.batch} from {topic}-{part} "
                        f"failed: {err.name()} ({err.str()}); staged records older than staging.retention are gone, "
                        "the query's next run of the batch stages them again"
                    )
                offset = msg.offset()
                assert offset is not None
                position = offset + 1
                if offset > last:
                    break
                route, kept = split_stage_header(list(msg.headers() or []))  # type: ignore[arg-type]
                if route is None:
                    continue
                found = routes.get(route)
                if found is None:
                    found = routes[route] = tuple(json.loads(route))
                staged_tag, target, partition = found
                if staged_tag != tag:
                    continue  # another attempt's record in the same partition
                rows.append((target, msg.value(), msg.key(), kept or None, partition))
            for i in range(0, len(rows), _CHUNK):
                producer.send(rows[i : i + _CHUNK])
                got += len(rows[i : i + _CHUNK])
                faults.point(
                    "sink.publish.mid", spec=self.opts.faults, batch=self.batch, k=before + got, sink=self.opts.sink_id
                )
        if got != count:
            raise RetriableError(
                f"{self.plan.context}: batch {self.batch}, task {m.slot}: {got} staged records found in {topic}-{part} "
                f"offsets {first}..{last}, {count} expected; nothing was published, the query's next run of the batch "
                "stages them again",
                batch_id=self.batch,
            )
        return got
