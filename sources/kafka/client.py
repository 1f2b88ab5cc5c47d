"""Driver-side Kafka look-ups: partitions, earliest/latest/timestamp offsets, group offsets, bounded and retried."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicCollection
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from eos_core import kafka_clients
from eos_core.errors import FatalError, ServiceError
from eos_core.kafka_config import admin_config
from eos_core.privileges import KafkaAcl
from eos_core.waits import StillRunning, within
from sources.kafka.offsets import PartitionOffsets, TopicPartition, kafka_uuid

__all__ = ["KafkaMetadataClient"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_INTERNAL = ("__consumer_offsets", "__transaction_state")
# A topic that does not exist (never created, or deleted); any other topic-level error is not deletion.
UNKNOWN_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
# Retrying cannot help: the principal may not describe/read the topic, or authentication failed.
DENIED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
    }
)


def access_denied(topic: str, err: Any, *, option: str, conf: dict[str, Any]) -> FatalError:
    """The error for a topic the configured principal may not use (no retry helps): the ACLs it lacks and the
    commands that grant them; a refused login is said as such."""
    code = err.code() if isinstance(err, KafkaError) else None
    if code in kafka_clients.REFUSED:
        return FatalError(kafka_clients.refused_login(conf, err, "kafka-eos"), topic=topic, option=option)
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        group = str(conf.get("group.id", "?"))
        return group_denied(group, err, conf, "DESCRIBE", "read the group's committed offsets")
    acls = [KafkaAcl("topic", topic, "READ", why=f"look up its partitions and offsets, read its records ({option})")]
    text = kafka_clients.refused_access(conf, err, acls, "kafka-eos")
    hidden = (
        " (Kafka answers alike for a topic that does not exist: to a principal that may not describe it, it hides it)"
    )
    return FatalError(text + hidden, topic=topic, option=option)


def group_denied(group: str, err: Any, conf: dict[str, Any], operation: str, why: str) -> FatalError:
    """The error for a consumer group the principal may not use (startingOffsets=group, commitOffsetsToGroup)."""
    acls = [KafkaAcl("group", group, operation, why=f"{why} (option 'kafka.group.id')")]
    return FatalError(kafka_clients.refused_access(conf, err, acls, "kafka-eos"), group=group)


def _code_name(err: Any) -> str:
    if isinstance(err, KafkaError):
        return f"{err.name()} ({err.str()})"
    return str(err)


class TopicMetadataError(ServiceError):
    """A topic-level metadata error that is not 'unknown topic' (e.g. LEADER_NOT_AVAILABLE): retried, never
    taken for deletion."""


def _close_within(consumer: Consumer, what: str, timeout: float) -> None:
    """``consumer.close()`` for at most ``timeout`` seconds (librdkafka's close has no timeout of its own
    and can wait on a group coordinator that is gone): a query's stop, which waits for its source's,
    must not hang on it. Best effort: nothing of a closing consumer is needed."""

    def close() -> None:
        try:
            consumer.close()
        except Exception:  # closing is best effort; nothing to lose
            log.debug("closing %s failed", what, exc_info=True)

    try:
        within(close, timeout, name=f"kafka-eos close {what}")
    except StillRunning:
        log.warning("kafka-eos: closing %s took over %.0f s; left to finish in the background", what, timeout)


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
        self.watch = kafka_clients.Watch(self.config, "kafka-eos")
        self._connected = False
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._committer: tuple[str, Consumer] | None = None  # (group, consumer) reused by every commit
        self._no_topic_ids = False  # the brokers do not know DescribeTopics (topic_ids)
        self._answers: list[tuple[Any, Any]] = []  # the commit consumer's answers (its on_commit)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_admin"] = None
        state["_committer"] = None
        state["_answers"] = []
        state["watch"] = kafka_clients.Watch(self.config, "kafka-eos")
        state["_connected"] = False
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
            self._consumer = kafka_clients.consumer(self._conf(), self.watch)
        if not self._connected:  # a refused login fails now, not after fetchOffset.numRetries timeouts
            kafka_clients.connect(self._consumer, self.watch, self.timeout)
            self._connected = True
        return self._consumer

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = kafka_clients.admin(admin_config(self._conf()), self.watch)
        return self._admin

    def close_committer(self) -> None:
        if self._committer is not None:
            _close_within(self._committer[1], "the commit consumer", self.timeout)
            self._committer = None

    def close(self) -> None:
        self.close_committer()
        if self._consumer is not None:
            _close_within(self._consumer, "the metadata consumer", self.timeout)
            self._consumer = None
        self._admin = None

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                return fn()
            except (KafkaException, ServiceError) as exc:
                self.watch.check(self._consumer)  # a refused login or handshake: no retry helps
                if isinstance(exc, KafkaException) and _fatal(exc):
                    raise ServiceError(f"kafka-eos: {what} failed at {self.bootstrap}: {exc}") from None
                attempt += 1
                if attempt > self.retries:
                    raise ServiceError(
                        f"kafka-eos: {what} failed at {self.bootstrap} after {attempt} attempt(s) of up to "
                        f"{self.timeout:g}s each (kafkaConsumer.pollTimeoutMs, fetchOffset.numRetries): {exc}. "
                        + (
                            _METADATA_HINT
                            if isinstance(exc, TopicMetadataError)
                            else "Check kafka.bootstrap.servers and that the brokers are reachable."
                        ),
                        bootstrap=self.bootstrap,
                    ) from None
                log.warning("kafka-eos: %s failed (%s); retry %d of %d", what, exc, attempt, self.retries)
                time.sleep(self.retry_interval)

    def topics(self) -> dict[str, int]:
        """Every topic with its partition count (internal topics and topics that do not exist left out).

        A topic listed with another error (leader election, a broker still loading it) is retried and
        then fails: it is never taken for a deleted topic.
        """

        def fetch() -> dict[str, int]:
            md = self.consumer().list_topics(timeout=self.timeout)
            out = {}
            for name, t in md.topics.items():
                if name in _INTERNAL:
                    continue
                if t.error is not None:
                    if t.error.code() in UNKNOWN_TOPIC:
                        continue
                    self._topic_error(name, t.error, "subscribePattern")
                out[name] = len(t.partitions)
            return out

        return self._retry("listing topics", fetch)

    def describe(self, names: Sequence[str], *, option: str) -> dict[str, int | None]:
        """Partition counts of the named topics only (None: the topic does not exist).

        Asks for these topics alone (never the whole cluster's metadata), so an unauthorized topic is
        reported as such (Kafka leaves topics a principal may not describe out of a full listing).
        """

        def fetch() -> dict[str, int | None]:
            out: dict[str, int | None] = {}
            for name in dict.fromkeys(names):
                md = self.consumer().list_topics(topic=name, timeout=self.timeout)
                t = md.topics.get(name)
                if t is None or (t.error is not None and t.error.code() in UNKNOWN_TOPIC):
                    out[name] = None
                    continue
                if t.error is not None:
                    self._topic_error(name, t.error, option)
                out[name] = len(t.partitions)
            return out

        return self._retry(f"describing topic(s) {', '.join(names)}", fetch)

    def topic_ids(self, names: Iterable[str]) -> dict[str, str]:
        """Each named topic's id (Kafka's text form, ``kafka_uuid``), by DescribeTopics; a topic that does not
        exist is left out, and so is every topic of a broker that gives no ids (before Kafka 2.8: the zero id;
        one that does not know DescribeTopics), whose re-created topics cannot be told. A topic re-created
        under its name has a new id."""
        wanted = sorted(set(names))
        if not wanted or self._no_topic_ids:
            return {}

        def fetch() -> dict[str, str]:
            futures = self.admin().describe_topics(TopicCollection(wanted), request_timeout=self.timeout)
            out: dict[str, str] = {}
            for name, future in futures.items():
                try:
                    tid = kafka_uuid(future.result(timeout=self.timeout + 5).topic_id)
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else None
                    code = err.code() if isinstance(err, KafkaError) else None
                    if code in UNKNOWN_TOPIC:
                        continue
                    if code in (KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION):
                        log.warning(
                            "kafka-eos: the brokers give no topic ids (%s): a re-created topic is not told", err
                        )
                        self._no_topic_ids = True
                        return {}
                    raise
                if tid.strip("A") != "":  # the zero id: a broker without topic ids
                    out[name] = tid
            return out

        return self._retry(f"describing topic(s) {', '.join(wanted)} (their ids)", fetch)

    def _topic_error(self, name: str, err: Any, option: str) -> None:
        if err.code() in DENIED:
            raise access_denied(name, err, option=option, conf=self.config)
        raise TopicMetadataError(
            f"topic {name!r} has a metadata error: {_code_name(err)} (not a deleted topic: nothing is dropped)",
            topic=name,
        )

    def partitions_for(
        self,
        *,
        subscribe: Sequence[str] | None = None,
        pattern: str | None = None,
        assign: dict[str, list[int]] | None = None,
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """(partitions that exist now, partitions of the selection that do not) for one topic selection.

        Missing: each assigned partition that does not exist, and partition 0 of each subscribed topic
        that does not exist (the caller decides whether that is an error or a deletion).
        """
        if pattern is not None:
            everything = self.topics()
            rx = re.compile(pattern)
            tps = [TopicPartition(t, p) for t in everything if rx.search(t) for p in range(everything[t])]
            return sorted(tps), []
        if subscribe is not None:
            counts = self.describe(list(subscribe), option="subscribe")
            tps = [TopicPartition(t, p) for t, n in counts.items() if n is not None for p in range(n)]
            gone = [TopicPartition(t, 0) for t, n in counts.items() if n is None]
            return sorted(tps), sorted(gone)
        assert assign is not None
        topics = self.describe(list(assign), option="assign")
        have: list[TopicPartition] = []
        missing: list[TopicPartition] = []
        for t, ps in assign.items():
            n = topics.get(t)
            for p in ps:
                (have if n is not None and p < n else missing).append(TopicPartition(t, int(p)))
        return sorted(have), sorted(missing)

    def list_offsets(self, specs: dict[TopicPartition, Any]) -> PartitionOffsets:
        """Offsets for OffsetSpec values (earliest, latest = LSO under read_committed, timestamp; -1 when none)."""
        if not specs:
            return {}
        level = IsolationLevel.READ_COMMITTED if self.read_committed else IsolationLevel.READ_UNCOMMITTED

        def once() -> PartitionOffsets:
            request = {CkTopicPartition(tp.topic, tp.partition): spec for tp, spec in specs.items()}
            futures = self.admin().list_offsets(request, isolation_level=level, request_timeout=self.timeout)
            out: PartitionOffsets = {}
            for ctp, fut in futures.items():
                info = fut.result(timeout=self.timeout + 1)
                out[TopicPartition(ctp.topic, ctp.partition)] = int(info.offset)
            return out

        def fetch() -> PartitionOffsets:
            # librdkafka fails a ListOffsets at once while no leader is known, or with the leader epoch it knew
            # before a broker restarted (FENCED_LEADER_EPOCH): one attempt waits for the leader up to
            # pollTimeoutMs, as the Java admin client does within its API timeout, asking with a fresh client
            # (fresh metadata) each time. A partition the client's cached metadata lacks (just added) is asked
            # for again by a fresh client on the next attempt.
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    return once()
                except KafkaException as exc:
                    if _leader_changing(exc) and time.monotonic() < deadline:
                        log.info("kafka-eos: fetching offsets: %s; waiting for the partition leader", exc)
                    else:
                        if _code(exc) in _STALE_METADATA:
                            self._admin = None
                        raise
                self._admin = None
                time.sleep(min(_LEADER_WAIT, max(0.0, deadline - time.monotonic())))

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

        conf = {**self._conf(), "group.id": group}

        def fetch() -> dict[TopicPartition, int | None]:
            c = kafka_clients.consumer(conf, self.watch)
            try:
                got = self._committed_in_slices(c, conf, [CkTopicPartition(tp.topic, tp.partition) for tp in tps])
            finally:
                c.close()
            return {TopicPartition(x.topic, x.partition): (x.offset if x.offset >= 0 else None) for x in got}

        return self._retry(f"reading committed offsets of group {group!r}", fetch)

    def _committed_in_slices(self, c: Consumer, conf: dict[str, Any], tps: list[CkTopicPartition]) -> Any:
        """``committed()`` asked a second at a time, up to the timeout: librdkafka reports a refused group (no
        DESCRIBE on it) only as an event of the consumer, and the call itself just times out, so the events
        are looked at between the slices."""
        deadline = time.monotonic() + self.timeout
        while True:
            step = max(0.1, min(1.0, deadline - time.monotonic()))
            try:
                return c.committed(tps, timeout=step)
            except KafkaException as exc:
                if _code(exc) != KafkaError._TIMED_OUT or time.monotonic() >= deadline:
                    raise
            event = c.poll(0)
            err = event.error() if event is not None else None
            if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise group_denied(conf["group.id"], err, conf, "DESCRIBE", "read the group's committed offsets")

    def commit(self, group: str, offsets: PartitionOffsets) -> None:
        """Commit offsets to a group (monitoring only); a failure is logged, never raised, and the wait is bounded
        (``COMMIT_WAIT_S``): librdkafka's synchronous commit has no timeout, and with the group's coordinator
        SIGKILLed (issue 46: a node of a replicated cluster) the query's trigger would wait on it. A commit not
        answered in time is
        left, and the next batch's, from a fresh consumer that looks the coordinator up again, covers it."""
        if not offsets:
            return
        answers: list[tuple[Any, Any]] = []
        try:
            if self._committer is None or self._committer[0] != group:
                self.close_committer()
                conf = {**self._conf(), "group.id": group, "on_commit": lambda err, parts: answers.append((err, parts))}
                self._committer = (group, kafka_clients.consumer(conf, self.watch))
                self._answers = answers
            answers = self._answers
            answers.clear()
            committer = self._committer[1]
            committer.commit(
                offsets=[CkTopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()],
                asynchronous=True,
            )
            deadline = time.monotonic() + min(self.timeout, COMMIT_WAIT_S)
            while not answers and time.monotonic() < deadline:
                committer.poll(0.1)  # serves the commit's answer (on_commit); the committer reads nothing
            if not answers:
                self.close_committer()
                log.warning(
                    "kafka-eos: committing offsets to group %r got no answer within %gs (monitoring only, ignored; "
                    "the next batch commits again from a fresh consumer)",
                    group,
                    min(self.timeout, COMMIT_WAIT_S),
                )
                return
            err, parts = answers[0]
            failed = err or next((p.error for p in parts or () if p.error is not None), None)
            if failed is not None:
                raise KafkaException(failed)
        except KafkaException as exc:
            self.close_committer()  # the next commit starts from a fresh consumer
            said: Exception = exc
            if _code(exc) == KafkaError.GROUP_AUTHORIZATION_FAILED:
                why = "commit each batch's end offsets for lag monitoring (commitOffsetsToGroup)"
                said = group_denied(group, exc.args[0], {**self._conf(), "group.id": group}, "READ", why)
            log.warning("kafka-eos: committing offsets to group %r failed (monitoring only, ignored): %s", group, said)


# How long a group commit (monitoring only) may hold the batch's commit: the answer of a live coordinator comes in
# milliseconds; librdkafka's synchronous commit would wait on a dead one without a bound
COMMIT_WAIT_S = 10.0

_METADATA_HINT = (
    "A topic with a metadata error (e.g. no leader) is not taken for a deleted one; check the brokers' health, "
    "or raise fetchOffset.numRetries / fetchOffset.retryIntervalMs to wait longer."
)


# The partition leader is unknown or has just changed (a broker restarting, an election): worth waiting for.
_LEADER_CHANGING = frozenset(
    {
        KafkaError._NOENT,  # librdkafka's ListOffsets: "Failed to query partition leaders: No leaders found"
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.FENCED_LEADER_EPOCH,  # asked with the leader epoch known before the broker restarted
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader's high watermark has not caught up yet
    }
)
_LEADER_WAIT = 0.25  # seconds between look-ups while waiting for a leader
# librdkafka's cached metadata lacks the partition (partitions just added, a topic re-created)
_STALE_METADATA = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})


def _code(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def _leader_changing(exc: KafkaException) -> bool:
    return _code(exc) in _LEADER_CHANGING


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
