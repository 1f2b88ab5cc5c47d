"""Driver-side Kafka look-ups: partitions, earliest/latest/timestamp offsets, group offsets, bounded and retried."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from connectors.errors import ConfigError, ServiceError
from sources.kafka.offsets import PartitionOffsets, TopicPartition

__all__ = ["KafkaMetadataClient"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_INTERNAL = ("__consumer_offsets", "__transaction_state")


class KafkaMetadataClient:
    """Lazily created consumer and admin client for one source; never pickled (see __getstate__)."""

    def __init__(
        self,
        config: dict[str, str],
        *,
        timeout_ms: int,
        retries: int,
        retry_interval_ms: int,
        read_committed: bool,
    ) -> None:
        self.config = dict(config)
        self.timeout = timeout_ms / 1000.0
        self.retries = retries
        self.retry_interval = retry_interval_ms / 1000.0
        self.read_committed = read_committed
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_admin"] = None
        return state

    @property
    def bootstrap(self) -> str:
        return self.config.get("bootstrap.servers", "")

    def _conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = dict(self.config)
        conf["enable.auto.commit"] = False
        conf["auto.offset.reset"] = "error"
        return conf

    def consumer(self) -> Consumer:
        if self._consumer is None:
            try:
                self._consumer = Consumer(self._conf())
            except KafkaException as exc:
                raise ConfigError(
                    f"kafka-eos: the kafka.* options are not a valid consumer configuration: {exc}"
                ) from None
        return self._consumer

    def admin(self) -> AdminClient:
        if self._admin is None:
            conf = {k: v for k, v in self._conf().items() if not _consumer_only(k)}
            try:
                self._admin = AdminClient(conf)
            except KafkaException as exc:
                raise ConfigError(
                    f"kafka-eos: the kafka.* options are not a valid client configuration: {exc}"
                ) from None
        return self._admin

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # closing is best effort; nothing to lose
                log.debug("closing the metadata consumer failed", exc_info=True)
            self._consumer = None
        self._admin = None

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                return fn()
            except (KafkaException, ServiceError) as exc:
                if isinstance(exc, KafkaException) and _fatal(exc):
                    raise ServiceError(f"kafka-eos: {what} failed at {self.bootstrap}: {exc}") from None
                attempt += 1
                if attempt > self.retries:
                    raise ServiceError(
                        f"kafka-eos: {what} failed at {self.bootstrap} after {attempt} attempt(s) of up to "
                        f"{self.timeout:g}s each (kafkaConsumer.pollTimeoutMs, fetchOffset.numRetries): {exc}. "
                        "Check kafka.bootstrap.servers and that the brokers are reachable.",
                        bootstrap=self.bootstrap,
                    ) from None
                log.warning("kafka-eos: %s failed (%s); retry %d of %d", what, exc, attempt, self.retries)
                time.sleep(self.retry_interval)

    def topics(self) -> dict[str, int]:
        """Every topic with its partition count (internal topics left out)."""

        def fetch() -> dict[str, int]:
            md = self.consumer().list_topics(timeout=self.timeout)
            out = {}
            for name, t in md.topics.items():
                if t.error is not None or name in _INTERNAL:
                    continue
                out[name] = len(t.partitions)
            return out

        return self._retry("listing topics", fetch)

    def partitions_for(
        self,
        *,
        subscribe: Sequence[str] | None = None,
        pattern: str | None = None,
        assign: dict[str, list[int]] | None = None,
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """(partitions that exist now, assigned partitions that do not) for one topic selection."""
        topics = self.topics()
        if subscribe is not None:
            tps = [TopicPartition(t, p) for t in subscribe if t in topics for p in range(topics[t])]
            return sorted(tps), []
        if pattern is not None:
            rx = re.compile(pattern)
            tps = [TopicPartition(t, p) for t in topics if rx.search(t) for p in range(topics[t])]
            return sorted(tps), []
        assert assign is not None
        have: list[TopicPartition] = []
        missing: list[TopicPartition] = []
        for t, ps in assign.items():
            for p in ps:
                (have if t in topics and p < topics[t] else missing).append(TopicPartition(t, int(p)))
        return sorted(have), sorted(missing)

    def list_offsets(self, specs: dict[TopicPartition, Any]) -> PartitionOffsets:
        """Offsets for OffsetSpec values (earliest, latest = LSO under read_committed, timestamp; -1 when none)."""
        if not specs:
            return {}
        level = IsolationLevel.READ_COMMITTED if self.read_committed else IsolationLevel.READ_UNCOMMITTED

        def fetch() -> PartitionOffsets:
            request = {CkTopicPartition(tp.topic, tp.partition): spec for tp, spec in specs.items()}
            futures = self.admin().list_offsets(request, isolation_level=level, request_timeout=self.timeout)
            out: PartitionOffsets = {}
            for ctp, fut in futures.items():
                info = fut.result(timeout=self.timeout + 1)
                out[TopicPartition(ctp.topic, ctp.partition)] = int(info.offset)
            return out

        return self._retry("fetching offsets", fetch)

    def earliest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        return self.list_offsets({tp: OffsetSpec.earliest() for tp in tps})

    def latest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        return self.list_offsets({tp: OffsetSpec.latest() for tp in tps})

    def for_timestamps(self, stamps: dict[TopicPartition, int]) -> PartitionOffsets:
        return self.list_offsets({tp: OffsetSpec.for_timestamp(ts) for tp, ts in stamps.items()})

    def committed(self, group: str, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where it has none)."""
        tps = list(tps)
        if not tps:
            return {}

        def fetch() -> dict[TopicPartition, int | None]:
            c = Consumer({**self._conf(), "group.id": group})
            try:
                got = c.committed([CkTopicPartition(tp.topic, tp.partition) for tp in tps], timeout=self.timeout)
            finally:
                c.close()
            return {TopicPartition(x.topic, x.partition): (x.offset if x.offset >= 0 else None) for x in got}

        return self._retry(f"reading committed offsets of group {group!r}", fetch)

    def commit(self, group: str, offsets: PartitionOffsets) -> None:
        """Commit offsets to a group (monitoring only); a failure is logged, never raised."""
        if not offsets:
            return
        try:
            c = Consumer({**self._conf(), "group.id": group})
            try:
                c.commit(
                    offsets=[CkTopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()],
                    asynchronous=False,
                )
            finally:
                c.close()
        except KafkaException as exc:
            log.warning("kafka-eos: committing offsets to group %r failed (monitoring only, ignored): %s", group, exc)


def _consumer_only(key: str) -> bool:
    return key in {
        "group.id",
        "isolation.level",
        "enable.auto.commit",
        "auto.offset.reset",
        "fetch.wait.max.ms",
        "fetch.min.bytes",
        "max.partition.fetch.bytes",
        "fetch.max.bytes",
        "session.timeout.ms",
        "max.poll.interval.ms",
        "heartbeat.interval.ms",
        "auto.commit.interval.ms",
        "enable.partition.eof",
        "check.crcs",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "partition.assignment.strategy",
        "group.instance.id",
        "enable.auto.offset.store",
        "group.protocol",
        "group.remote.assignor",
    }


def _fatal(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return bool(err.fatal()) or err.code() in (
            KafkaError._INVALID_ARG,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            KafkaError.SASL_AUTHENTICATION_FAILED,
            KafkaError._AUTHENTICATION,
        )
    return False
