"""Driver side of kafka-eos: partition discovery, start/end resolution, admission control, data-loss checks."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from eos_core import faults
from eos_core.errors import ConfigError, DataLossError, FatalError, ServiceError
from sources.kafka.client import KafkaMetadataClient
from sources.kafka.offsets import EARLIEST, LATEST, PartitionOffsets, TopicPartition, from_json, to_json
from sources.kafka.options import KafkaSourceOptions, consumer_config
from sources.kafka.split import KafkaInputPartition, OffsetRange, ReadSettings, split_ranges

__all__ = ["KafkaPlanner", "Limits", "rate_limit"]

log = logging.getLogger(__name__)


class Limits:
    """The admission limits of one latestOffset call (None = no such limit)."""

    def __init__(self, max_rows: int | None = None, min_rows: int | None = None, max_bytes: int | None = None) -> None:
        self.max_rows, self.min_rows, self.max_bytes = max_rows, min_rows, max_bytes

    def __repr__(self) -> str:
        return f"Limits(max_rows={self.max_rows}, min_rows={self.min_rows}, max_bytes={self.max_bytes})"


def rate_limit(
    start: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int], limit: int
) -> PartitionOffsets:
    """Cap ``until`` so that at most about ``limit`` records are read, shared in proportion to backlog.

    Like Spark's KafkaMicroBatchStream.rateLimit: a partition's share is floor(limit * its backlog /
    total backlog), rounded up when below 1 so no partition with data is starved.
    """
    sizes = {tp: end - start[tp] for tp, end in until.items() if tp in start and end > start[tp]}
    total = sum(sizes.values())
    if total <= limit:
        return dict(until)
    out: PartitionOffsets = {}
    for tp, end in until.items():
        if tp not in sizes:
            out[tp] = end
            continue
        share = limit * (sizes[tp] / total)
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, start[tp] + take)
    return out


class KafkaPlanner:
    """Everything the driver decides for one source; holds a lazy Kafka client, state stays on the driver."""

    def __init__(self, opts: KafkaSourceOptions, *, streaming: bool) -> None:
        self.opts = opts
        self.streaming = streaming
        config = consumer_config(opts)
        config.setdefault("group.id", opts.group_id or _generated_group(opts))
        self.config = config
        self.client = KafkaMetadataClient(
            config,
            timeout_ms=opts.poll_timeout_ms,
            retries=opts.fetch_offset_num_retries,
            retry_interval_ms=opts.fetch_offset_retry_interval_ms,
            read_committed=opts.read_committed,
        )
        self.settings = ReadSettings(
            consumer_config=config,
            include_headers=opts.include_headers,
            fail_on_data_loss=opts.fail_on_data_loss,
            poll_timeout_ms=opts.poll_timeout_ms,
            arrow_batch_rows=opts.arrow_batch_rows,
            arrow_batch_bytes=opts.arrow_batch_bytes,
            faults=opts.faults,
            read_committed=opts.read_committed,
        )

    # ---- partitions -----------------------------------------------------------------------

    def discover(self) -> list[TopicPartition]:
        """The partitions the query reads now; assigned ones that are missing raise ConfigError."""
        have, missing = self.client.partitions_for(
            subscribe=self.opts.subscribe, pattern=self.opts.subscribe_pattern, assign=self.opts.assign
        )
        if missing and self.opts.subscribe is not None:
            shown = ", ".join(repr(tp.topic) for tp in missing)
            raise ConfigError(
                f"kafka-eos: option 'subscribe' names topic(s) that do not exist at {self.client.bootstrap}: {shown}. "
                "Create them first (the source never creates topics; check the spelling), or use subscribePattern "
                "to pick topics up as they appear.",
                option="subscribe",
            )
        if missing:
            shown = ", ".join(str(tp) for tp in missing)
            raise ConfigError(
                f"kafka-eos: option 'assign' names partitions that do not exist at {self.client.bootstrap}: {shown}",
                option="assign",
            )
        return have

    def current(self) -> list[TopicPartition]:
        """Like discover(), but missing assigned partitions are left out (data loss is judged by the caller)."""
        have, _ = self.client.partitions_for(
            subscribe=self.opts.subscribe, pattern=self.opts.subscribe_pattern, assign=self.opts.assign
        )
        return have

    # ---- start ------------------------------------------------------------------------------

    def starting_is_deterministic(self) -> bool:
        """True when the start is fully given as concrete offsets (nothing to resolve against Kafka)."""
        o = self.opts
        if o.starting_timestamp is not None or o.starting_offsets_by_timestamp is not None:
            return False
        spec = (o.starting_offsets or "").strip()
        if not spec.startswith("{"):
            return False
        return all(off >= 0 for parts in json.loads(spec).values() for off in parts.values())

    def symbolic_start(self, tps: Sequence[TopicPartition]) -> PartitionOffsets:
        """A start that names the intent (-2 earliest, -1 anything resolved later) for each partition."""
        o = self.opts
        spec = (o.starting_offsets or ("latest" if self.streaming else "earliest")).strip()
        if o.starting_timestamp is None and o.starting_offsets_by_timestamp is None and spec.startswith("{"):
            return {TopicPartition(t, int(p)): off for t, parts in json.loads(spec).items() for p, off in parts.items()}
        value = (
            EARLIEST
            if spec.lower() == "earliest" and o.starting_timestamp is None and o.starting_offsets_by_timestamp is None
            else LATEST
        )
        return {tp: value for tp in tps}

    def resolve_start(self, tps: Sequence[TopicPartition]) -> PartitionOffsets:
        """Concrete start offsets with Spark's precedence: startingTimestamp > ...ByTimestamp > startingOffsets."""
        o = self.opts
        tps = list(tps)
        if o.starting_timestamp is not None:
            return self._by_timestamp({tp: o.starting_timestamp for tp in tps}, "startingTimestamp", start=True)
        if o.starting_offsets_by_timestamp is not None:
            stamps = self._cover(o.starting_offsets_by_timestamp, tps, "startingOffsetsByTimestamp")
            return self._by_timestamp(stamps, "startingOffsetsByTimestamp", start=True)
        spec = (o.starting_offsets or ("latest" if self.streaming else "earliest")).strip()
        low = spec.lower()
        if low == "earliest":
            return self.client.earliest(tps)
        if low == "latest":
            return self.client.latest(tps)
        if low == "group":
            assert o.group_id is not None
            committed = self.client.committed(o.group_id, tps)
            earliest = self.client.earliest([tp for tp, off in committed.items() if off is None])
            return {tp: (off if off is not None else earliest[tp]) for tp, off in committed.items()}
        given = self._cover(json.loads(spec), tps, "startingOffsets")
        return self.resolve_sentinels(given)

    def _cover(
        self, spec: Mapping[str, Mapping[str, int]], tps: Sequence[TopicPartition], option: str
    ) -> PartitionOffsets:
        given = {TopicPartition(t, int(p)): v for t, parts in spec.items() for p, v in parts.items()}
        missing = sorted(set(tps) - set(given))
        if missing:
            raise ConfigError(
                f"kafka-eos: option '{option}' does not cover partitions {', '.join(map(str, missing))}; when it "
                "names specific offsets it must name every partition the query reads",
                option=option,
            )
        unknown = sorted(set(given) - set(tps))
        if unknown:
            raise ConfigError(
                f"kafka-eos: option '{option}' names partitions that do not exist or are not read: "
                f"{', '.join(map(str, unknown))}",
                option=option,
            )
        return given

    def resolve_sentinels(self, given: PartitionOffsets) -> PartitionOffsets:
        earliest = self.client.earliest([tp for tp, off in given.items() if off == EARLIEST])
        latest = self.client.latest([tp for tp, off in given.items() if off == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, off)) if off < 0 else off for tp, off in given.items()}

    def _by_timestamp(self, stamps: PartitionOffsets, option: str, *, start: bool) -> PartitionOffsets:
        found = self.client.for_timestamps(stamps)
        missing = [tp for tp, off in found.items() if off < 0]
        if missing:
            if start and self.opts.starting_offsets_by_timestamp_strategy == "error":
                shown = ", ".join(f"{tp} (timestamp {stamps[tp]})" for tp in missing)
                raise FatalError(
                    f"kafka-eos: option '{option}': no record at or after the timestamp in {shown}; set "
                    "startingOffsetsByTimestampStrategy=latest to start such partitions at the latest offset"
                )
            latest = self.client.latest(missing)  # an end timestamp past the last record means latest
            found.update(latest)
        return found

    def persisted_start(self, tps: Sequence[TopicPartition]) -> PartitionOffsets:
        """Resolve the start once and keep it in startingOffsetsLocation (first writer wins)."""
        path = self.opts.starting_offsets_location
        assert path
        if os.path.exists(path):
            return _read_offsets(path)
        resolved = self.resolve_start(tps)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kafka-eos-start-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(to_json(resolved), fh, separators=(",", ":"))
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # atomic create-if-absent: a concurrent or earlier writer wins
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        return _read_offsets(path)

    # ---- end of a micro-batch ------------------------------------------------------------------

    def latest_end(
        self, start: PartitionOffsets, *, target: PartitionOffsets | None = None
    ) -> tuple[PartitionOffsets, PartitionOffsets]:
        """``(end, latest)`` for a concrete ``start``, before any read limit.

        ``end`` is the uncapped end of the next micro-batch (new partitions pinned at their earliest
        offset); ``latest`` is the topic's end for every partition read (under AvailableNow, the
        ``target`` snapshot), what Spark's source reports as its latest offset.
        """
        present = set(self.current())
        if target is not None:
            # AvailableNow: never beyond the snapshot; partitions that appeared after it are not read
            present &= set(target) | set(start)
            latest = {tp: target.get(tp, start.get(tp, 0)) for tp in present}
        else:
            latest = self.client.latest(sorted(present))
        self._retry_stale(start, latest, target)
        end: PartitionOffsets = {}
        for tp, s in start.items():
            if tp not in present:
                self.data_loss(
                    f"partition {tp} is gone (topic or partition deleted) with offsets from {s} unread",
                    tp,
                    skipping=f"{tp} is no longer read; if it is there again later, it is read from its earliest offset",
                )
                continue  # failOnDataLoss=false: stop tracking it
            if latest[tp] < s:
                self.data_loss(
                    f"the offsets of {tp} went back from {s} to {latest[tp]} (still so after "
                    f"{self.opts.fetch_offset_num_retries} re-fetch(es), fetchOffset.numRetries; topic recreated?)",
                    tp,
                    skipping=f"the query keeps offset {s} of {tp} (an offset never moves back) and reads on from "
                    f"there once the partition has it: the records it gets below {s} ({s - latest[tp]} offset(s) "
                    "from now on) are never read",
                )
                latest[tp] = s  # failOnDataLoss=false: never move the checkpoint back (no record is read twice)
            end[tp] = latest[tp]
        new = sorted(present - set(start))
        if new:
            # New partitions are pinned at earliest by this batch and read from the next one,
            # so a replay never depends on when the partition was first seen.
            end.update(self.client.earliest(new))
        return end, latest

    def planned_end(
        self, start: PartitionOffsets, recorded: Mapping[str, str], *, target: PartitionOffsets | None = None
    ) -> tuple[PartitionOffsets, PartitionOffsets, PartitionOffsets, dict[str, str]]:
        """``(start, end, latest, ids)``: ``latest_end`` for a start whose topics' ids were ``recorded`` with it,
        the start as the end is planned from (without a re-created topic's partitions) and the topics' ids now.

        A topic whose id changed since is one deleted and re-created under its name (``recreated``): with
        failOnDataLoss=false its partitions are taken as new ones, pinned at the new topic's earliest offsets by
        this batch and read from the next. The ids are asked for before and after the offsets, and the whole
        look-up made again (at most 3 times) when a topic was re-created in between: an end never holds
        offsets of one topic under the id of another."""
        for _ in range(3):
            topics = {tp.topic for tp in self.current()} | {tp.topic for tp in start}
            ids = self.client.topic_ids(topics)
            gone = self.recreated(recorded, ids, start)
            kept = {tp: off for tp, off in start.items() if tp.topic not in gone}
            end, latest = self.latest_end(kept, target=target)
            if self.client.topic_ids(topics) == ids:
                return kept, end, latest, ids
            log.warning(
                "kafka-eos: a topic of %s was re-created while its offsets were looked up; again", sorted(topics)
            )
        raise ServiceError(
            "kafka-eos: topics were deleted and re-created three times while the batch's offsets were looked up; "
            "the next trigger tries again"
        )

    def recreated(self, recorded: Mapping[str, str], now: Mapping[str, str], offsets: PartitionOffsets) -> set[str]:
        """The topics of ``offsets`` whose id is not the one ``recorded`` with them (deleted and re-created under
        the name). failOnDataLoss=true: DataLossError naming the topic and both ids; false: logged, and returned for
        the caller to read the topic as a new one. A topic with no recorded id (offsets of Spark's source or an
        earlier kafka-eos) or that does not exist now is not judged here."""
        out: set[str] = set()
        for topic in sorted({tp.topic for tp in offsets}):
            old, new = recorded.get(topic), now.get(topic)
            if old is None or new is None or old == new:
                continue
            held = ", ".join(f"{tp}@{off}" for tp, off in sorted(offsets.items()) if tp.topic == topic)
            self.data_loss(
                f"topic {topic!r} was deleted and re-created under its name: the checkpoint's offsets of it ({held}) "
                f"are of topic id {old}, the topic now has id {new}, so the old topic's records past them are gone "
                "and the offsets would mean other records of the new topic. Start the query on a new checkpoint to "
                "read the new topic as you choose",
                TopicPartition(topic, 0),
                skipping=f"the new topic {topic!r} (id {new}) is read from its earliest offsets, as a new topic: "
                "pinned by this batch, read from the next; the old topic's unread records are skipped",
            )
            out.add(topic)
        return out

    def replayable(
        self, start: PartitionOffsets, start_ids: Mapping[str, str], end: PartitionOffsets, end_ids: Mapping[str, str]
    ) -> tuple[PartitionOffsets, PartitionOffsets]:
        """The ``(start, end)`` of a planned batch as they may be read now. A topic whose id differs between them
        was found re-created when the batch was planned (failOnDataLoss=false): its partitions are new in it
        (pinned at their earliest: nothing read). A topic re-created since the batch was planned (its replay
        after a restart) is judged by ``recreated``: refused, or left out of the batch (its records are gone)."""
        fresh = {t for t, tid in end_ids.items() if start_ids.get(t, tid) != tid}
        start = {tp: off for tp, off in start.items() if tp.topic not in fresh}
        now = self.client.topic_ids({tp.topic for tp in end if tp.topic in end_ids}) if end_ids else {}
        gone = self.recreated(end_ids, now, end)
        if gone:
            start = {tp: off for tp, off in start.items() if tp.topic not in gone}
            end = {tp: off for tp, off in end.items() if tp.topic not in gone}
        return start, end

    def _retry_stale(self, start: PartitionOffsets, latest: PartitionOffsets, target: PartitionOffsets | None) -> None:
        """Re-fetch a latest offset below the known one, as Spark does for KAFKA-7703 (a broker that has just
        become leader can answer with a stale end): up to fetchOffset.numRetries times, fetchOffset.retryIntervalMs
        apart. ``latest`` (and an AvailableNow ``target``) are updated in place."""
        stale = sorted(tp for tp, s in start.items() if tp in latest and latest[tp] < s)
        attempt = 0
        while stale and attempt < self.opts.fetch_offset_num_retries:
            attempt += 1
            shown = ", ".join(f"{tp} {latest[tp]} < {start[tp]}" for tp in stale)
            log.warning(
                "kafka-eos: latest offset below the known one (%s); re-fetching (%d of %d)",
                shown,
                attempt,
                self.opts.fetch_offset_num_retries,
            )
            time.sleep(self.opts.fetch_offset_retry_interval_ms / 1000.0)
            fresh = self.client.latest(stale)
            for tp, off in fresh.items():
                latest[tp] = off
                if target is not None and tp in target:
                    target[tp] = off
            stale = [tp for tp in stale if latest[tp] < start[tp]]

    def cap(self, start: PartitionOffsets, end: PartitionOffsets, limits: Limits) -> PartitionOffsets:
        """``end`` (from latest_end) cut down to the read limits' maximum rows / bytes."""
        end = dict(end)
        capped = {tp: e for tp, e in end.items() if tp in start and e >= start[tp]}
        backlog = sum(e - start[tp] for tp, e in capped.items())
        max_rows = limits.max_rows
        if limits.max_bytes is not None and backlog > 0:
            per = self._avg_record_bytes(start, capped)
            by_bytes = max(1, limits.max_bytes // max(per, 1))
            max_rows = by_bytes if max_rows is None else min(max_rows, by_bytes)
        if max_rows is not None:
            end.update(rate_limit(start, capped, max_rows))
        return end

    _avg_bytes: float | None = None
    SAMPLE_RECORDS = 200
    SAMPLE_BUDGET_S = 1.0

    def _avg_record_bytes(self, start: PartitionOffsets, until: PartitionOffsets) -> int:
        """Average record size, sampled from the first records of the backlog (maxBytesPerTrigger is an estimate).

        The cost is bounded: at most SAMPLE_RECORDS records in all, never past a partition's end of
        the backlog (a small backlog is sampled whole and returns as soon as it has arrived), and
        never longer than SAMPLE_BUDGET_S (a range ending in a gap, e.g. a transaction marker).
        Without any sample the running average (or 1 KiB) is used.
        """
        from confluent_kafka import TopicPartition as CkTopicPartition

        todo = {tp: e for tp, e in until.items() if e > start[tp]}
        if not todo:
            return max(1, int(self._avg_bytes or 1024))
        share = max(1, self.SAMPLE_RECORDS // len(todo))
        stop = {tp: min(e, start[tp] + share) for tp, e in todo.items()}
        wanted = sum(stop[tp] - start[tp] for tp in stop)
        c = self.client.consumer()
        c.assign([CkTopicPartition(tp.topic, tp.partition, start[tp]) for tp in sorted(todo)])
        sizes: list[int] = []
        open_ = set(stop)
        deadline = time.monotonic() + min(self.SAMPLE_BUDGET_S, self.opts.poll_timeout_ms / 1000)
        try:
            while open_ and len(sizes) < wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for m in c.consume(num_messages=max(1, wanted - len(sizes)), timeout=min(0.1, left)):
                    if m.error() is not None:
                        continue
                    tp = TopicPartition(str(m.topic()), int(m.partition() or 0))
                    off = int(m.offset() or 0)
                    if tp not in open_:
                        continue
                    if off < stop[tp]:
                        headers: Any = m.headers() or []
                        sizes.append(
                            len(m.key() or b"")
                            + len(m.value() or b"")
                            + sum(len(k) + len(v or b"") for k, v in headers)
                        )
                    if off + 1 >= stop[tp]:
                        open_.discard(tp)
        finally:
            c.unassign()
        if sizes:
            avg = sum(sizes) / len(sizes)
            self._avg_bytes = avg if self._avg_bytes is None else (self._avg_bytes + avg) / 2
        return max(1, int(self._avg_bytes or 1024))

    def data_loss(self, what: str, tp: TopicPartition | None = None, *, skipping: str = "skipping") -> None:
        """Fail (failOnDataLoss=true) or log ``what`` and what is skipped (``skipping``) and go on."""
        if self.opts.fail_on_data_loss:
            raise DataLossError(
                f"kafka-eos: {what}. Some data may have been lost; set failOnDataLoss=false to log such cases "
                "and go on (records that are gone are skipped).",
                topic_partition=str(tp) if tp else None,
            )
        log.warning("kafka-eos: %s; %s (failOnDataLoss=false)", what, skipping)

    # ---- input partitions --------------------------------------------------------------------

    def input_partitions(self, start: PartitionOffsets, end: PartitionOffsets) -> list[KafkaInputPartition]:
        ranges = []
        # A partition in the end but not the start is new in this batch: kafka-eos pins it at its earliest
        # offset (nothing to read), Spark's own source reads it from earliest; reading [earliest, end) does both.
        new = [tp for tp in end if tp not in start and end[tp] > 0]
        first = self.client.earliest(sorted(new)) if new else {}
        for tp, e in sorted(end.items()):
            s = start.get(tp)
            if s is None:
                s = first.get(tp, e)
                if s >= e:
                    continue  # pinned by this batch (or retention passed the end: judged by the next batch)
            if s < 0 or e < 0:
                raise FatalError(f"kafka-eos: unresolved offset for {tp} in a planned batch ({s}, {e})")
            if e < s:
                self.data_loss(f"the offsets of {tp} went back from {s} to {e}", tp)
                continue
            ranges.append(OffsetRange(tp.topic, tp.partition, s, e))
        pieces = split_ranges(
            ranges,
            min_partitions=self.opts.min_partitions,
            max_records_per_partition=self.opts.max_records_per_partition,
        )
        return [KafkaInputPartition(r, self.settings) for r in pieces]

    # ---- batch ends ---------------------------------------------------------------------------

    def resolve_end(self, tps: Sequence[TopicPartition]) -> PartitionOffsets:
        """Batch end offsets with Spark's precedence: endingTimestamp > endingOffsetsByTimestamp > endingOffsets."""
        o = self.opts
        if o.ending_timestamp is not None:
            return self._by_timestamp({tp: o.ending_timestamp for tp in tps}, "endingTimestamp", start=False)
        if o.ending_offsets_by_timestamp is not None:
            stamps = self._cover(o.ending_offsets_by_timestamp, tps, "endingOffsetsByTimestamp")
            return self._by_timestamp(stamps, "endingOffsetsByTimestamp", start=False)
        spec = (o.ending_offsets or "latest").strip()
        if spec.lower() == "latest":
            return self.client.latest(tps)
        return self.resolve_sentinels(self._cover(json.loads(spec), tps, "endingOffsets"))

    def plan_batch(self) -> list[KafkaInputPartition]:
        tps = self.discover()
        start = self.resolve_start(tps)
        end = self.resolve_end(tps)
        bad = [tp for tp in tps if start[tp] > end[tp]]
        if bad:
            shown = ", ".join(f"{tp} [{start[tp]}, {end[tp]})" for tp in bad)
            raise ConfigError(
                f"kafka-eos: the starting offsets are after the ending offsets for {shown}; make the start <= the end",
                option="startingOffsets",
            )
        faults.point("source.plan", spec=self.opts.faults, batch="batch")
        return self.input_partitions(start, end)


def _generated_group(opts: KafkaSourceOptions) -> str:
    # Never used for commits; only librdkafka wants a group id on every consumer.
    selection = json.dumps([opts.subscribe, opts.subscribe_pattern, opts.assign], sort_keys=True)
    return f"{opts.group_id_prefix}-{zlib.crc32(selection.encode()):08x}"


def _read_offsets(path: str) -> PartitionOffsets:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        return from_json(text, what=f"startingOffsetsLocation file {path}")
    except ConfigError as exc:
        raise FatalError(f"kafka-eos: {exc}; delete the file to resolve the start again") from None


def limits_from(limit: Any, default: Any, opts: KafkaSourceOptions, *, available_now: bool) -> Limits:
    """Translate Spark's ReadLimit into our Limits: the default limit means every configured option."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

    if isinstance(limit, ReadAllAvailable) or limit is None:
        return Limits()
    if limit == default:
        return Limits(
            max_rows=opts.max_offsets_per_trigger,
            min_rows=None if available_now else opts.min_offsets_per_trigger,
            max_bytes=opts.max_bytes_per_trigger,
        )
    if isinstance(limit, ReadMaxRows):
        return Limits(max_rows=limit.max_rows)
    if isinstance(limit, ReadMinRows):
        return Limits(min_rows=None if available_now else limit.min_rows)
    if isinstance(limit, ReadMaxBytes):
        return Limits(max_bytes=limit.max_bytes)
    raise FatalError(f"kafka-eos: unsupported read limit {limit!r}")


__all__ += ["limits_from"]
