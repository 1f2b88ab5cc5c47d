"""The sink's markers: "batch n of this sink is written", kept as a consumer-group offset committed in the
transaction that writes the batch's rows (``send_offsets_to_transaction``), read back by a consumer of the
marker group (``committed()``, ``read_committed``: stable offsets) so an open transaction is never taken for a
decided one, and a coordinator error is a retriable error, never a crash (``read_marker``).

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
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from eos_core import kafka_clients
from eos_core.errors import FatalError, RetriableError
from eos_core.kafka_config import admin_config
from eos_core.privileges import KafkaAcl
from eos_core.waits import StillRunning, within

__all__ = [
    "BATCH_JOB",
    "NAME_PREFIX",
    "Marker",
    "list_groups",
    "marker_offsets",
    "marker_reader_config",
    "publish_name",
    "read_marker",
    "read_markers",
    "read_slot_markers",
    "sink_names",
    "slot_groups",
    "slot_name",
]

log = logging.getLogger("sinks.kafka")

NAME_PREFIX = "spark-eos:"
BATCH_JOB = "batch-job"  # the "query" of df.write with batch.id
MARKER_VERSION = 1
MAX_METADATA = 4096  # the broker's default offset.metadata.max.bytes
_CLOSE_BOUND = 10.0  # seconds a marker reader's close() is waited for
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


def names_of(name: str) -> str:
    """The prefix every id of the sink shares (``sink_names``), out of one of its transactional ids or groups."""
    head, sep, _ = name.rpartition(":task:")
    if sep:
        return head + ":"
    return name[: -len("publish")] if name.endswith("publish") else name


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


def marker_reader_config(conf: Mapping[str, Any], group: str, *, stable: bool) -> dict[str, Any]:
    """The settings of a consumer that reads ``group``'s marker: the connection and security settings of
    ``conf``, the group (never joined: the consumer subscribes to nothing), and ``read_committed`` when the
    read is ``stable`` (librdkafka then asks for stable offsets: an open transaction's are waited out)."""
    return {
        **{k: v for k, v in admin_config(conf).items() if not k.startswith(("partitioner", "transaction"))},
        "group.id": group,
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "isolation.level": "read_committed" if stable else "read_uncommitted",
    }


def _close(consumer: Consumer) -> None:
    """Close a reader within a bound: it never joined its group, but ``close()`` has no timeout of its own."""
    try:
        within(consumer.close, _CLOSE_BOUND, name="spark-eos marker reader close")
    except StillRunning:
        log.warning("kafka-eos sink: a marker reader did not close within %.0f s; left to its thread", _CLOSE_BOUND)
    except (KafkaException, RuntimeError) as exc:
        log.debug("kafka-eos sink: closing a marker reader: %s", exc)


_READERS: OrderedDict[tuple[str, str, bool], Consumer] = OrderedDict()  # this process's readers, by group
_READERS_MAX = 8
_READERS_LOCK = threading.Lock()


def _new_reader(conf: Mapping[str, Any], group: str, stable: bool) -> Consumer:
    settings = marker_reader_config(conf, group, stable=stable)
    return kafka_clients.consumer(settings, kafka_clients.Watch(settings, "kafka-eos sink marker reader"))


def _reader(conf: Mapping[str, Any], group: str, stable: bool) -> Consumer:
    key = (repr(sorted(admin_config(conf).items())), group, stable)
    with _READERS_LOCK:
        found = _READERS.pop(key, None)
        if found is None:
            found = _new_reader(conf, group, stable)
        _READERS[key] = found
        old = [_READERS.popitem(last=False)[1] for _ in range(len(_READERS) - _READERS_MAX)]
    for consumer in old:
        _close(consumer)
    return found


def _forget_reader(consumer: Consumer) -> None:
    with _READERS_LOCK:
        for key, cached in list(_READERS.items()):
            if cached is consumer:
                del _READERS[key]
    _close(consumer)


def _retriable(err: KafkaError) -> bool:
    return err.code() in _UNSTABLE or bool(err.retriable())


def _fetch(
    consumer: Consumer, group: str, topic: str, timeout: float, conf: Mapping[str, Any] | None = None
) -> Marker | KafkaError | None:
    """One OffsetFetch of ``group``'s marker: the marker, None (the group has none), or a retriable error;
    FatalError for any other. Through the consumer's own group handle: a coordinator error in the answer is
    an error here, never librdkafka's null-handle crash of ``AdminClient.list_consumer_group_offsets``
    (confluentinc/librdkafka#5040, see ``read_marker``)."""
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=max(0.5, timeout))
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is None or _retriable(err):
            return err if err is not None else KafkaError(KafkaError._FAIL, str(exc))
        raise _refused(group, topic, err, conf) from None
    if tp.error is not None:
        if _retriable(tp.error):
            return tp.error
        raise _refused(group, topic, tp.error, conf)
    if tp.offset < 0:
        return None
    return Marker.parse(tp.offset, tp.metadata, group=group)


def _refused(group: str, topic: str, err: KafkaError, conf: Mapping[str, Any] | None = None) -> FatalError:
    """Reading a marker was refused: the ACLs the sink's principal lacks for it, and the commands."""
    acls = [
        KafkaAcl("group", names_of(group), "READ", prefixed=True, why="read the sink's markers (its consumer groups)"),
        KafkaAcl("topic", topic, "READ", why="the markers are offsets of it (option 'marker.topic', default 'topic')"),
    ]
    context = f"kafka-eos sink: reading the marker of consumer group {group!r} on {topic}-0"
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        acls = acls[:1]
    elif err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        acls = acls[1:]
    else:
        return FatalError(f"{context} failed: {err.name()} ({err.str()})", group=group)
    return FatalError(kafka_clients.refused_access(conf or {}, err, acls, context), group=group)


def _unreadable(group: str, topic: str, timeout: float, last: object) -> RetriableError:
    return RetriableError(
        f"kafka-eos sink: the marker of consumer group {group!r} on {topic}-0 could not be read within "
        f"{timeout:.0f} s (kafkaProducer.timeoutMs): last {last}. A transaction holding it may still be open "
        "(its producer is fenced or times out after transaction.timeout.ms), or the group coordinator is away "
        "(loading its offsets after a restart, or moving to another broker)",
        group=group,
    )


def read_marker(
    conf: Mapping[str, Any], group: str, topic: str, *, timeout: float, stable: bool = True, cached: bool = True
) -> Marker | None:
    """The group's committed marker, waiting while a transaction holding one is open (``stable``: the
    caller fenced the group's writer, so the wait is short), for at most ``timeout`` seconds; None when
    the group has none. ``stable=False``: the last committed marker, whatever transaction is open.

    Read by a consumer of the marker group that never joins it (``committed()``; ``read_committed`` asks
    for stable offsets), kept for the process when ``cached`` (a fresh one costs a connection and a
    coordinator look-up, ~55 ms; a kept one ~0.5 ms). Never ``AdminClient.list_consumer_group_offsets``:
    librdkafka 2.16 dereferences a null group handle there when the answer carries a coordinator error
    (COORDINATOR_LOAD_IN_PROGRESS while a restarted broker loads ``__consumer_offsets``, NOT_COORDINATOR
    after the coordinator moved; confluentinc/librdkafka#5040) and the process dies. Here such an error is
    retried within ``timeout``, then a RetriableError."""
    deadline = time.monotonic() + timeout
    consumer = _reader(conf, group, stable) if cached else _new_reader(conf, group, stable)
    try:
        while True:
            # a second at a time: a refused group is an event of the consumer only (the call just times out)
            found = _fetch(consumer, group, topic, min(deadline - time.monotonic(), 1.0), conf)
            if not isinstance(found, KafkaError):
                return found
            event = consumer.poll(0)
            refused = event.error() if event is not None else None
            if refused is not None and refused.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise _refused(group, topic, refused, conf)
            # a refused login (a rotated password) fails the read now, not after the timeout of fetches that
            # read as a coordinator away; the reader is let go, a fixed login makes a new one
            try:
                kafka_clients.check(consumer)
            except FatalError:
                if cached:
                    _forget_reader(consumer)
                raise
            if time.monotonic() + 0.2 > deadline:
                if cached:  # a reader that kept failing may hold a stale coordinator: the next read makes a new one
                    _forget_reader(consumer)
                raise _unreadable(group, topic, timeout, f"{found.name()} ({found.str()})")
            time.sleep(0.2)
    finally:
        if not cached:
            _close(consumer)


def read_markers(
    conf: Mapping[str, Any], groups: Sequence[str], topic: str, *, timeout: float, stable: bool = True
) -> dict[str, Marker | Exception | None]:
    """Each group's marker (``read_marker``; None: it has none), read at once by up to 16 new readers;
    a group whose read failed maps to its error (RetriableError, FatalError), for the caller to raise or show.
    Measured against the embedded broker (``python -m bench.marker_reads``): 8 groups 0.07 s, 64 groups 0.17 s,
    200 groups 0.48 s on a quiet machine (0.08, 0.36, 0.6-0.95 s on a loaded one)."""

    def one(group: str) -> Marker | Exception | None:
        try:
            return read_marker(conf, group, topic, timeout=timeout, stable=stable, cached=False)
        except (RetriableError, FatalError) as exc:
            return exc

    if not groups:
        return {}
    with ThreadPoolExecutor(min(16, len(groups)), thread_name_prefix="spark-eos-markers") as pool:
        return dict(zip(groups, pool.map(one, groups), strict=True))


def list_groups(admin: AdminClient, prefix: str, *, timeout: float) -> list[str]:
    """The consumer groups whose names start with ``prefix`` (ListGroups, every broker asked); RetriableError
    when a broker did not answer (the groups it coordinates would be missed)."""
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout + 5)
    except (KafkaException, FutureTimeout) as exc:
        raise RetriableError(
            f"kafka-eos sink: listing consumer groups (to find the sink's markers) failed within {timeout:.0f} s: "
            f"{exc or type(exc).__name__}"
        ) from None
    if listed.errors:  # a broker that did not answer hides the groups it coordinates: a slot's marker unseen
        raise RetriableError(
            f"kafka-eos sink: listing consumer groups (to find the sink's markers) got no answer from every broker: "
            f"{'; '.join(str(e) for e in listed.errors[:3])}"
        )
    return sorted(g.group_id for g in listed.valid if g.group_id.startswith(prefix))


def slot_groups(admin: AdminClient, sink_id: str, *, timeout: float) -> dict[int, str]:
    """Every task slot of the sink that has a marker group (visibility=partition): slot -> group."""
    prefix = f"{sink_names(sink_id)}task:"
    groups = list_groups(admin, prefix, timeout=timeout)
    return {int(g[len(prefix) :]): g for g in groups if g[len(prefix) :].isdigit()}


def read_slot_markers(
    admin: AdminClient, conf: Mapping[str, Any], sink_id: str, topic: str, *, timeout: float
) -> dict[int, Marker]:
    """The last committed marker of every task slot of the sink (visibility=partition), by slot: the sink's
    groups are found by their names' prefix, their markers read at once, stable (an open transaction holding
    a slot's marker is waited out: its outcome decides what the slot wrote, K2). A slot whose marker cannot be
    read fails the whole read (RetriableError, or FatalError when access is refused): a slot counted as never
    written when it did write could let a replay write its rows again."""
    groups = slot_groups(admin, sink_id, timeout=timeout)
    read = read_markers(conf, list(groups.values()), topic, timeout=timeout, stable=True)
    found: dict[int, Marker] = {}
    for slot, group in sorted(groups.items()):
        marker = read[group]
        if isinstance(marker, Exception):
            raise marker
        if marker is not None:
            found[slot] = marker
    return found
