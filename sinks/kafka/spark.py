"""The Spark classes of the ``kafka-eos`` sink (batch and stream writers, the checks the driver makes
when it builds them) and the foreachBatch adapter ``kafka_batch``."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from eos_core.errors import ConfigError
from sinks.kafka.client import KafkaLookups, fence
from sinks.kafka.committer import commit_batch
from sinks.kafka.formats import column_encoders
from sinks.kafka.markers import publish_name, read_slot_markers, slot_groups
from sinks.kafka.options import CONTEXT, OPTIONS, KafkaSinkOptions, parse_options
from sinks.kafka.plan import KafkaSinkMessage, KafkaSinkPlan, build_plan, partly_written
from sinks.kafka.privileges import STAGING_HEADER, staging_size
from sinks.kafka.writer import write_task

__all__ = ["KafkaBatchWriter", "KafkaStreamWriter", "check_services", "kafka_batch"]

log = logging.getLogger("sinks.kafka")

# what check_services found good (the producer settings it derived), and when: per process
_CHECKED: dict[tuple[object, ...], tuple[float, tuple[tuple[str, str], ...]]] = {}
_CHECK_TTL = 300.0
# (bootstrap, sink id, query) whose task slots this driver process fenced, at its first survey (K2)
_FENCED: set[tuple[str, str, str]] = set()
_DEFAULT_BATCH_SIZE = 1_000_000  # librdkafka's batch.size
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588  # a broker's message.max.bytes (a new topic's max.message.bytes)


def check_services(opts: KafkaSinkOptions) -> tuple[tuple[str, str], ...]:
    """On the driver, before any task: the topics exist (the staging topic is made), the transaction
    timeout is one the broker accepts. Returns the producer settings they call for: librdkafka batches
    records up to batch.size into one record batch, which the broker refuses whole when it is over the
    topic's max.message.bytes (Java's producer splits it; librdkafka does not), so batch.size is kept
    under the smallest limit of the topics written. Cached for a few minutes per process (the writer is
    built per batch)."""
    key = (opts.bootstrap, opts.topic, opts.markers_on, opts.errors_topic, opts.staged and opts.staging_topic)
    seen = _CHECKED.get(key)
    if seen is not None and time.monotonic() - seen[0] < _CHECK_TTL:
        return seen[1]
    conf = opts.producer_config()
    overrides: tuple[tuple[str, str], ...] = ()
    lookups = KafkaLookups(conf, timeout=opts.timeout_ms / 1000, context=CONTEXT)
    try:
        if opts.marker_topic:
            lookups.require(opts.marker_topic, "marker.topic")
        if opts.errors_topic:
            dead = lookups.require(opts.errors_topic, "errors.topic")
            if dead.compacted:
                raise ConfigError(
                    f"{CONTEXT}: errors.topic {opts.errors_topic!r} is compacted (cleanup.policy compact): the broker "
                    "refuses a record without a key there, and a dead letter keeps its row's key, which may be null "
                    "(a keyless row refused for a compacted topic). Dead letters would fail the batch on every attempt. "
                    "Give errors.topic cleanup.policy=delete (kafka-configs --alter --add-config cleanup.policy=delete), "
                    "or name another topic",
                    option="errors.topic",
                )
        if opts.staged:
            ensure_staging(lookups, opts, conf)
        written = [lookups.require(t, "topic") for t in (opts.topic, opts.errors_topic) if t]
        smallest = min((t.max_message_bytes for t in written), default=None)
        batch_size = int(conf.get("batch.size", _DEFAULT_BATCH_SIZE))
        if smallest is not None and batch_size > smallest - 512:
            overrides = (("batch.size", str(max(1024, smallest - 512))),)
        limit = lookups.transaction_max_timeout_ms()
        ours = opts.transaction_timeout_ms
        if limit is not None and ours > limit:
            raise ConfigError(
                f"{CONTEXT}: kafka.transaction.timeout.ms is {ours}, above the broker's transaction.max.timeout.ms "
                f"{limit}: the broker refuses such producers. Lower kafka.transaction.timeout.ms (it must outlast a "
                "task's write and a batch's publish), or raise the broker's limit",
                option="kafka.transaction.timeout.ms",
            )
    finally:
        lookups.close()
    _CHECKED[key] = (time.monotonic(), overrides)
    return overrides


def _survey(plan: KafkaSinkPlan) -> KafkaSinkPlan:
    """visibility=partition: the task slots' markers, met on the driver before any task runs (K1), and
    which slots wrote this batch already (K2). A partly written batch's other slots stage their rows for
    the publish: fence the publish's id first, so a publish that died open holds no slot's marker.

    The first survey of a sink in a driver process fences every task slot the sink has (K2, K4): a task of a
    crashed driver may still hold a slot's transaction open, and a replay whose partitioning changed runs no
    task with that slot's id to fence it, so its rows could join the replay's. Within one driver every slot of
    a batch is fenced by its own retries. The markers are then read stable (an open transaction waited out)."""
    opts = plan.opts
    assert opts.markers_on is not None
    conf = plan.producer_config()
    timeout = opts.timeout_ms / 1000
    lookups = KafkaLookups(conf, timeout=timeout, context=plan.context)
    try:
        key = (opts.bootstrap, opts.sink_id, plan.query)
        if key not in _FENCED:
            groups = slot_groups(lookups.admin, opts.sink_id, timeout=timeout)
            fence(conf, sorted(groups.values()), timeout=timeout, context=plan.context)
            log.info("%s: fenced the %d task slots of earlier runs before the first batch", plan.context, len(groups))
            _FENCED.add(key)
        slots = read_slot_markers(lookups.admin, conf, opts.sink_id, opts.markers_on, timeout=timeout)
        written = partly_written(plan, slots)
        if written:
            log.warning(
                "%s: batch %s was partly written before (slots %s); the other slots stage their rows and the driver "
                "publishes them with their markers in one transaction",
                plan.context,
                plan.batch,
                [w[0] for w in written],
            )
            ensure_staging(lookups, opts, conf)
            fence(conf, [publish_name(opts.sink_id)], timeout=timeout, context=plan.context)
    finally:
        lookups.close()
    return dataclasses.replace(plan, written=written)


def ensure_staging(lookups: KafkaLookups, opts: KafkaSinkOptions, conf: dict[str, str]) -> None:
    """The staging topic, created when missing, able to take every record the target topic takes."""
    target = lookups.require(opts.topic, "topic") if opts.topic else None
    # at least what a topic made with Kafka's defaults takes: the staging topic is shared by every sink of the
    # cluster, and the first one to make it (one without a topic option, whose records name theirs) must not
    # make it too small for the next one's target (its check below would refuse that sink)
    wanted = max(
        target.max_message_bytes if target else 0,
        int(conf.get("message.max.bytes", 1_000_000)),
        KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    )
    # created with more headroom than the check asks (a producer's message.max.bytes over the target's too)
    staging = lookups.ensure_topic(
        opts.staging_topic,
        opts.staging_partitions,
        {"retention.ms": str(opts.staging_retention_ms), "max.message.bytes": str(wanted + 4096)},
        "staging.topic",
    )
    if target is not None and staging.max_message_bytes < staging_size(target.max_message_bytes):
        need = staging_size(target.max_message_bytes)
        where = conf.get("bootstrap.servers", "<bootstrap>")
        raise ConfigError(
            f"{CONTEXT}: the staging topic {opts.staging_topic!r} takes records up to {staging.max_message_bytes} "
            f"bytes (max.message.bytes), topic {opts.topic!r} up to {target.max_message_bytes}: a record the target "
            f"takes could not be staged with its staging header ({STAGING_HEADER} bytes). Set the staging topic's "
            f"max.message.bytes to at least {need}: kafka-configs.sh --bootstrap-server {where} --command-config "
            f"admin.properties --alter --entity-type topics --entity-name '{opts.staging_topic}' --add-config "
            f"max.message.bytes={need}",
            option="staging.topic",
        )


class _Roles:
    """Built by Spark on the driver for every batch, where it plans the batch's tasks and again where it
    commits: the plan, checked. Only the first is pickled to the tasks: the survey of the task slots'
    markers (visibility=partition) runs then, once per batch, never in the process that commits (there
    every slot has written, and the survey would cost a look-up of every group for nothing)."""

    plan: KafkaSinkPlan
    # the encoded columns' encoders (their schemas registered or looked up in the Schema Registry) are made when the
    # writer is pickled for the tasks, before any task runs; the process that commits never makes them
    _schema: StructType

    def _setup(self, options: Mapping[str, str], schema: StructType, *, streaming: bool) -> None:
        opts = parse_options(options, streaming=streaming)
        plan = build_plan(opts, schema, encode=False)
        self.plan = dataclasses.replace(plan, overrides=check_services(opts))
        self._schema = schema

    def __getstate__(self) -> dict[str, object]:
        if self.plan.encoded and not self.plan.encoders:  # before the survey: a refused schema reads no marker
            self.plan = dataclasses.replace(self.plan, encoders=column_encoders(self.plan.opts, self._schema))
        if self.plan.opts.direct and self.plan.batch is not None and self.plan.written is None:
            self.plan = _survey(self.plan)  # pickled for the tasks: on the driver, before any task runs (K1, K2)
        return dict(self.__dict__)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkMessage:
        return write_task(self.plan, iterator)


class KafkaBatchWriter(_Roles, DataSourceArrowWriter):
    """``df.write.format("kafka-eos")`` with ``sink.id`` and ``batch.id``."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self._setup(options, schema, streaming=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        assert self.plan.opts.batch_id is not None
        commit_batch(self.plan, messages, self.plan.opts.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info(
            "%s: batch %s aborted; nothing of it is visible beyond the tasks' own commits (visibility=%s)",
            self.plan.context,
            self.plan.opts.batch_id,
            self.plan.opts.visibility,
        )


class KafkaStreamWriter(_Roles, DataSourceStreamArrowWriter):
    """``df.writeStream.format("kafka-eos")`` (append output mode)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self._setup(options, schema, streaming=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.plan, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("%s: batch %d aborted; the query runs it again from its checkpoint", self.plan.context, batchId)


def kafka_batch(data_source: Any, **options: Any) -> Callable[[Any, int], None]:
    """A ``foreachBatch(df, batch_id)`` function writing each micro-batch through the exactly-once Kafka sink
    of ``data_source`` (the ``kafka-eos`` format, which it registers with the batch's session; its
    ``write_options`` drops a read's options from a shared options map).

    ``sink.id`` and ``checkpointLocation`` (the query's own) are required; every option is a keyword (its
    name in snake case: ``sink_id=``, ``checkpoint_location=``, ``errors_topic=``) or a dotted name
    (``**{"sink.id": "orders"}``). The micro-batch id becomes ``batch.id``.
    """
    # the format's own rule for a read's options in a write's map (dropped, with a log line), as writer() applies it
    raw = data_source.write_options({k: str(v) for k, v in OPTIONS.from_keywords(options).items()})
    if "batch.id" in {k.lower() for k in raw}:
        raise ConfigError(
            f"{CONTEXT}: kafka_batch sets 'batch.id' from the micro-batch id; do not pass it", option="batch.id"
        )
    parse_options({**raw, "batch.id": "0"}, streaming=False)  # refuse bad options now, not at the first batch
    if not any(k.lower() == "checkpointlocation" for k in raw):
        raise ConfigError(
            f"{CONTEXT}: kafka_batch needs option 'checkpointLocation', the streaming query's own checkpoint location "
            "(the one given to writeStream), so that each micro-batch's marker is bound to the offsets Spark planned",
            option="checkpointLocation",
        )

    def write_batch(df: Any, batch_id: int) -> None:
        df.sparkSession.dataSource.register(data_source)
        df.write.format(data_source.name()).options(**raw).option("batch.id", str(batch_id)).mode("append").save()

    write_batch.__name__ = f"kafka_batch[{raw.get('sink.id')}]"
    return write_batch
