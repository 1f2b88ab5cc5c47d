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

from eos_core import faults
from eos_core.errors import FatalError, RetriableError
from sinks.kafka.client import KafkaLookups, TxnProducer
from sinks.kafka.markers import Marker, marker_offsets, publish_name, read_marker
from sinks.kafka.plan import KafkaSinkMessage, KafkaSinkPlan, meet_marker
from sinks.kafka.writer import STAGE_HEADER

__all__ = ["commit_batch"]

log = logging.getLogger("sinks.kafka")


def commit_batch(plan: KafkaSinkPlan, messages: Sequence[object], batch: int) -> None:
    """Spark completed ``batch``: make it visible (visibility=batch) or check what the tasks wrote."""
    mine = sorted((m for m in messages if isinstance(m, KafkaSinkMessage)), key=lambda m: m.slot)
    if not plan.opts.staged:
        rows = sum(m.rows for m in mine)
        log.info(
            "%s: batch %d written by %d tasks (%d rows, %d written before, %d to errors.topic)",
            plan.context, batch, len(mine), rows, sum(m.rows for m in mine if m.skipped),
            sum(m.diverted for m in mine),
        )  # fmt: skip
        faults.point("sink.after_commit", spec=plan.opts.faults, batch=batch)
        return
    _Publish(plan, batch).run(mine)


class _Publish:
    def __init__(self, plan: KafkaSinkPlan, batch: int) -> None:
        self.plan, self.batch, self.opts = plan, batch, plan.opts
        self.timeout = self.opts.timeout_ms / 1000
        self.conf = self.opts.producer_config()
        self.name = publish_name(self.opts.sink_id)

    def run(self, messages: list[KafkaSinkMessage]) -> None:
        opts, batch = self.opts, self.batch
        marker_topic = opts.markers_on
        assert marker_topic is not None
        faults.point("sink.commit.before_decision", spec=opts.faults, batch=batch)
        lookups = KafkaLookups(self.conf, timeout=self.timeout, context=self.plan.context)
        producer = TxnProducer(self.conf, self.name, timeout=self.timeout, context=self.plan.context)
        try:
            producer.init()  # fences an older driver (a zombie of a crashed run), aborting its open publish
            marker = read_marker(lookups.admin, self.name, marker_topic, timeout=self.timeout)
            if meet_marker(self.plan, marker, batch, "the publish"):
                log.info("%s: batch %d was published before; nothing to do", self.plan.context, batch)
                return
            skipped = [m.slot for m in messages if m.skipped]
            if skipped:  # a task saw the batch published, the publish finds it not: the marker went away
                raise FatalError(
                    f"{self.plan.context}: tasks {skipped} of batch {batch} found it published, the publish does "
                    "not: the sink's marker group was deleted or reset meanwhile; restart the query",
                    batch_id=batch,
                )
            producer.begin()
            try:
                published = self._copy(producer, messages)
            except BaseException:
                producer.abort_quietly()
                raise
            digest = "+".join(f"{m.slot}:{m.digest}" for m in messages)
            written = Marker(
                batch=batch,
                lineage=self.plan.lineage,
                query=self.plan.query,
                rows=published,
                digest=hashlib.blake2b(digest.encode(), digest_size=16).hexdigest(),
                mode="batch",
            )
            producer.commit(marker_offsets(marker_topic, written), self.name)
        finally:
            producer.close()
            lookups.close()
        log.info(
            "%s: batch %d published (%d records from %d tasks)", self.plan.context, batch, published, len(messages)
        )
        faults.point("sink.after_commit", spec=opts.faults, batch=batch)

    def _copy(self, producer: TxnProducer, messages: list[KafkaSinkMessage]) -> int:
        """Read every task's staged records and send them to their topics in the open transaction."""
        consumer = Consumer(
            {
                **{
                    k: v
                    for k, v in self.conf.items()
                    if k.startswith(("bootstrap", "security", "sasl", "ssl", "client"))
                },
                "group.id": self.name + ":reader",
                "enable.auto.commit": "false",
                "enable.partition.eof": "false",
                "auto.offset.reset": "error",
                "isolation.level": "read_uncommitted",
                "fetch.max.bytes": str(64 * 1024 * 1024),
            }
        )
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
        deadline = time.monotonic() + self.timeout
        tag = m.tag
        position = first
        while position <= last:
            batch = consumer.consume(num_messages=10_000, timeout=1.0)
            if not batch:
                if time.monotonic() > deadline:
                    raise RetriableError(
                        f"{self.plan.context}: the staged records of batch {self.batch}, task {m.slot} ({topic}-{part} "
                        f"offsets {first}..{last}) did not arrive within {self.timeout:.0f} s; the batch is published "
                        "when the query runs it again"
                    )
                continue
            deadline = time.monotonic() + self.timeout
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
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
                headers: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
                route = next((v for k, v in reversed(headers) if k == STAGE_HEADER), None)
                if route is None:
                    continue
                staged: list[Any] = json.loads(route)
                staged_tag, target, partition = staged
                if staged_tag != tag:
                    continue  # another attempt's record in the same partition
                kept = [(k, v) for k, v in headers if k != STAGE_HEADER]
                producer.send(target, msg.value(), msg.key(), kept or None, partition)
                got += 1
                if (before + got) % 100 == 0:
                    faults.point("sink.publish.mid", spec=self.opts.faults, batch=self.batch, k=before + got)
                    if (before + got) % 10_000 == 0:
                        producer.poll()
        if got != count:
            raise RetriableError(
                f"{self.plan.context}: batch {self.batch}, task {m.slot}: {got} staged records found in {topic}-{part} "
                f"offsets {first}..{last}, {count} expected; nothing was published, the query's next run of the batch "
                "stages them again",
                batch_id=self.batch,
            )
        return got
