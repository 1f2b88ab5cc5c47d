"""The kafka-eos readers: the replayable micro-batch reader and the batch reader.

Apart from the data source (``sources.kafka.datasource``), which Spark's planner processes import to
unpickle the format's class and which imports these only when asked for a reader: the planner, the
client and confluent-kafka are then imported by the processes that read, not by every one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from eos_core import faults
from sources.kafka.offsets import (
    EARLIEST,
    LATEST,
    PartitionOffsets,
    batch_start,
    from_json,
    is_symbolic,
    to_json,
    topic_ids,
    with_ids,
    with_start,
)
from sources.kafka.options import KafkaSourceOptions
from sources.kafka.planner import KafkaPlanner, limits_from
from sources.kafka.split import KafkaInputPartition

__all__ = ["KafkaBatchReader", "KafkaStreamReader"]

log = logging.getLogger(__name__)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; its offsets (Spark's offsets/n) are the source's operator state.

    The start of batch 0 is never written to the checkpoint by Spark and ``initialOffset`` is
    called again on restart, so a start that depends on time (latest, timestamps, group) is resolved
    once: into ``startingOffsetsLocation`` when set, otherwise into batch 0's end, which records the
    resolved start beside the end in ``offsets/0`` (``with_start``): a replay of batch 0 reads the
    range it was planned with. Earliest is pinned too: re-resolved on a replay of batch 0, it would
    move past records that retention deleted meanwhile, a loss no check could see; pinned, the replay
    reads from below the log start and failOnDataLoss decides. Batch 0 reads records as every later
    batch does (no empty batch pins the start: its trigger cost a stateful query a whole empty batch),
    so the batch ids are those of Spark's source.
    """

    def __init__(self, opts: KafkaSourceOptions, decoders: dict[str, Any] | None = None) -> None:
        self.opts = opts
        self.decoders = decoders or {}  # key.format/value.format: sources.kafka.formats.column_decoders
        self.planner = KafkaPlanner(opts, streaming=True)
        self._initial: dict[str, Any] | None = None
        self._pinned: dict[str, dict[str, dict[str, int]]] = {}
        self._available_now = False
        self._target: PartitionOffsets | None = None
        # when minOffsetsPerTrigger last let a batch run (monotonic s); None: the first trigger runs at once
        self._last_trigger: float | None = None
        self._latest: PartitionOffsets | None = None

    # Spark pickles the reader to executors; only options and the (client-free) planner travel.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pinned"], state["_target"], state["_latest"] = {}, None, None
        return state

    def initialOffset(self) -> dict:
        if self._initial is None:
            tps = self.planner.discover()
            if self.opts.starting_offsets_location:
                start = self.planner.persisted_start(tps)
            elif self.planner.starting_is_deterministic():
                start = self.planner.resolve_start(tps)
            else:
                start = self.planner.symbolic_start(tps)
            ids = self.planner.client.topic_ids({tp.topic for tp in start})
            self._initial = with_ids(to_json(start, symbolic=True), ids)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.opts
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # The target is snapshotted by the first latestOffset, after the start is resolved (a start
        # resolved later than the snapshot could lie beyond it); Spark's source also takes it there.
        self._available_now = True
        self._target = None

    def _snapshot(self) -> PartitionOffsets:
        target = self.planner.client.latest(self.planner.current())
        log.info("kafka-eos: AvailableNow target %s", to_json(target))
        return target

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start, symbolic=True, what="start offset")
        recorded = topic_ids(start)
        first = is_symbolic(begin)
        if first:
            key = repr(start)
            if key not in self._pinned:
                # resolved once; batch 0's end records it (offsets/0), so a replay of batch 0 reads from it
                ids = self.planner.client.topic_ids({tp.topic for tp in begin})
                self._pinned[key] = with_ids(to_json(self.planner.resolve_start(sorted(begin))), ids)
            resolved = from_json(self._pinned[key], what="resolved start")
            recorded = topic_ids(self._pinned[key])
        else:
            resolved = begin
        if self._available_now and self._target is None:
            self._target = self._snapshot()  # after the start is resolved: the start is never beyond it
        limits = limits_from(limit, self.getDefaultReadLimit(), self.opts, available_now=self._available_now)
        kept, uncapped, self._latest, ids = self.planner.planned_end(resolved, recorded, target=self._target)
        # batch 0 never waits (Spark's source neither): its end must be concrete, as Spark builds batch 0 from it
        if not first and limits.min_rows is not None and self._delay(kept, uncapped, limits.min_rows):
            return start
        end_json = with_ids(to_json(self.planner.cap(kept, uncapped, limits)), ids)
        if first:
            end_json = with_start(end_json, kept)
        elif from_json(end_json, what="end offset") == begin and topic_ids(end_json) == recorded:
            # nothing new: the start as Spark gave it, whose text may hold more (batch 0's end records its start);
            # an end of other text would be a batch to Spark, an empty one
            return start
        if from_json(end_json, what="end offset") != begin:
            faults.point("source.plan", spec=self.opts.faults)
        return end_json

    def _delay(self, begin: PartitionOffsets, latest: PartitionOffsets, min_rows: int) -> bool:
        """Spark's delayBatch: wait while fewer than ``min_rows`` records are available (uncapped) and
        maxTriggerDelay has not passed since the last admitted trigger; the first trigger runs at once."""
        now = time.monotonic()
        if self._last_trigger is None or (now - self._last_trigger) * 1000 >= self.opts.max_trigger_delay_ms:
            self._last_trigger = now
            return False
        if set(latest) != set(begin):
            self._last_trigger = now
            return False  # a trigger that discovers (or loses) partitions runs: it pins them
        available = sum(max(0, e - begin[tp]) for tp, e in latest.items())
        if available < min_rows:
            return True
        self._last_trigger = now
        return False

    def reportLatestOffset(self) -> dict | None:
        """The topic's end for every partition read (the snapshot under AvailableNow), not the capped batch end:
        Spark shows it as the progress's latestOffset, so latestOffset - endOffset is the lag in offsets."""
        return to_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = from_json(start, symbolic=True, what="start offset")
        end_offsets = from_json(end, what="end offset")
        start_ids = topic_ids(start)
        planned_from = batch_start(end)
        if planned_from:
            # batch 0 (or its replay): the start it was planned from, resolved once and recorded in its end, whatever
            # initialOffset() gives now (a start option changed before a restart: Spark's source, too, keeps the
            # start of a batch 0 it planned)
            begin, start_ids = planned_from, topic_ids(end)
        # a topic deleted and re-created under its name (topic ids, kept in the offsets) is not read on blindly
        begin, end_offsets = self.planner.replayable(begin, start_ids, end_offsets, topic_ids(end))
        if is_symbolic(begin):
            # Batch 0 whose end records no start. kafka-eos 0.1.0 pinned the start with an empty batch 0:
            # its end is the resolved start, nothing is read. A batch 0 that Spark's format("kafka") planned and
            # did not commit keeps its start in sources/0/0, which a Python data source cannot read: an earliest
            # partition is read from its earliest offset to that end, as Spark would; a latest one cannot be.
            known = {tp: (end_offsets.get(tp, 0) if off == LATEST else off) for tp, off in begin.items()}
            concrete = {tp: off for tp, off in known.items() if off != EARLIEST}  # earliest: read as new partitions
            return self.planner.input_partitions(concrete, end_offsets)
        return self.planner.input_partitions(begin, end_offsets)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KafkaInputPartition):
            return iter(())  # Spark reads one placeholder partition when a plan has none
        from sources.kafka.reader import read_partition  # Arrow is the executors' (planners never read)

        return read_partition(partition, self.decoders, flat=self.opts.value_layout == "flat")

    def commit(self, end: dict) -> None:
        if self.opts.commit_offsets_to_group and self.opts.group_id:
            self.planner.client.commit(self.opts.group_id, from_json(end, what="end offset"))

    def stop(self) -> None:
        self.planner.client.close()


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("kafka-eos")``: the records between the starting and ending offsets."""

    def __init__(self, opts: KafkaSourceOptions, decoders: dict[str, Any] | None = None) -> None:
        self.opts = opts
        self.decoders = decoders or {}
        self.planner = KafkaPlanner(opts, streaming=False)

    def partitions(self) -> Sequence[InputPartition]:
        try:
            return self.planner.plan_batch()
        finally:  # a planning failure (unknown topic, bad offsets, no broker) must not leak the driver's client
            self.planner.client.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KafkaInputPartition):
            return iter(())  # Spark reads one placeholder partition when a plan has none
        from sources.kafka.reader import read_partition  # Arrow is the executors' (planners never read)

        return read_partition(partition, self.decoders, flat=self.opts.value_layout == "flat")
