"""The sink's Kafka clients: a transactional producer whose every failure is sorted (fenced, abort and
retry, retry the call, fatal), an idempotent producer that reports where its records landed, and the
look-ups (topic limits, the broker's transaction timeout) the checks need. Every wait is bounded."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType  # type: ignore[attr-defined]

from eos_core import kafka_clients
from eos_core.errors import ConfigError, FatalError, RetriableError
from eos_core.kafka_config import admin_config
from eos_core.privileges import KafkaAcl, acl_command
from eos_core.waits import StillRunning, within
from sinks.kafka.records import TopicLimits

__all__ = [
    "Fenced",
    "KafkaLookups",
    "Row",
    "StagingProducer",
    "TxnProducer",
    "fence",
    "forget",
    "kafka_error",
    "produce_all",
    "slot_producer",
]

log = logging.getLogger("sinks.kafka")
T = TypeVar("T")

_DEFAULT_MAX_MESSAGE_BYTES = 1048588  # the broker's message.max.bytes default (a topic's max.message.bytes)
# Kafka's internal topics (org.apache.kafka.common.internals.Topic): known by name, so a row naming one is
# diverted (or refused) whether or not the principal may describe it; other names beginning with "__" are
# asked of the cluster's metadata (_internal)
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
# what limits() says of an internal topic, without a look-up: no record may be written to it, so its
# partitions and limits never matter
_INTERNAL_LIMITS = TopicLimits(partitions=0, max_message_bytes=0, compacted=False, internal=True)
# how long past its own timeout a librdkafka call that may not honour it is waited for (TxnProducer._bounded)
_GRACE = 5.0


class Fenced(FatalError):
    """A newer producer with the same transactional id took over: this attempt's transaction is aborted."""


def kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


Row = tuple[str, Any, Any, Any, "int | None"]  # (topic, value, key, headers, partition) as produce() takes them


def produce_all(producer: Producer, rows: list[Row], *, timeout: float, context: str) -> None:
    """Queue ``rows``; while librdkafka's queue is full, serve delivery reports and try again, for at most
    ``timeout`` seconds without progress (K4)."""
    produce = producer.produce
    for topic, value, key, headers, partition in rows:
        args = (topic, value, key, -1 if partition is None else partition)
        try:
            if headers:
                produce(*args, headers=headers)
            else:
                produce(*args)
        except BufferError:
            deadline = time.monotonic() + timeout
            while True:
                producer.poll(0.05)
                try:
                    produce(*args, headers=headers) if headers else produce(*args)
                    break
                except BufferError:
                    if time.monotonic() > deadline:
                        raise RetriableError(
                            f"{context}: librdkafka's queue stayed full for {timeout:.0f} s: the brokers take records "
                            "slower than they come, or are unreachable"
                        ) from None
    producer.poll(0)


class TxnProducer:
    """One transactional producer (``transactional.id`` = ``name``) for one transaction at a time."""

    def __init__(self, conf: dict[str, str], name: str, *, timeout: float, context: str) -> None:
        self.name = name
        self.conf = conf
        self.timeout = timeout
        self.context = context
        self._group_metadata: dict[str, Any] = {}  # by marker group: made once, by a consumer that never joins it
        self.errors: list[str] = []
        self.stuck: str | None = None  # the call this producer was given up in (_bounded): it takes no other
        self.in_transaction = False  # begun, not yet committed or aborted (``forget`` aborts it)
        self.denied_topics: set[str] = set()  # topics a delivery report said the principal may not write
        self.sent_topics: set[str] = set()  # the topics of the open transaction's records
        self.refusals: list[KafkaError] = []  # authorization failures librdkafka reported to the error_cb
        self.watch = kafka_clients.Watch(conf, context, also=self._error)
        self.producer = kafka_clients.producer(
            {
                **conf,
                "transactional.id": name,
                "enable.idempotence": "true",
                "delivery.report.only.error": True,
                "on_delivery": self._delivered,
            },
            self.watch,
        )

    def _error(self, err: KafkaError) -> None:
        if err.fatal():
            self.errors.append(f"{err.name()}: {err.str()}")
        if err.code() in _AUTHORIZATION:
            self.refusals.append(err)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self.denied_topics.add(msg.topic())
        if err is not None and len(self.errors) < 5:
            self.errors.append(f"{msg.topic()}-{msg.partition()}: {err.name()} ({err.str()})")

    def _cause(self, err: KafkaError) -> KafkaError:
        """``err``, or for an ``_STATE`` of an open transaction (one that failed before this call, its records
        purged) what failed it: librdkafka names the cause (e.g. a partition it could not add: WRITE refused)
        only to the commit it then refuses."""
        if err.code() != KafkaError._STATE or not self.in_transaction:
            return err
        try:
            self.producer.commit_transaction(min(self.timeout, 5.0))
        except KafkaException as exc:
            return kafka_error(exc) or err
        return err

    def _denied(
        self, what: str, err: KafkaError, marker_topic: str | None, topics: set[str] | None = None
    ) -> FatalError | None:
        """An authorization failure as the ACLs the principal lacks (no retry helps until they are granted);
        ``topics``: those the failed call wrote to."""
        from sinks.kafka.markers import names_of

        code = err.code()
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED and topics:
            self.denied_topics |= topics
        elif code == KafkaError.TOPIC_AUTHORIZATION_FAILED and "add partition" in err.str().lower():
            # the transaction failed adding a partition it produced to (AddPartitionsToTxn: WRITE), and the
            # call that reports it (send_offsets, commit) is not the one refused
            self.denied_topics |= self.sent_topics
        names = names_of(self.name)
        acls: list[KafkaAcl] = []
        if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            acls.append(KafkaAcl("transactional_id", names, "WRITE", prefixed=True, why="the sink's transactions"))
        elif code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            acls.append(KafkaAcl("group", names, "READ", prefixed=True, why="commit the batch's marker for its group"))
        elif code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            acls.append(KafkaAcl("cluster", "", "IDEMPOTENT_WRITE", why="an idempotent producer (brokers before 3.0)"))
        elif code == KafkaError.TOPIC_AUTHORIZATION_FAILED or self.denied_topics:
            if marker_topic is not None and not self.denied_topics:
                acls.append(
                    KafkaAcl(
                        "topic",
                        marker_topic,
                        "READ",
                        why="the batch's marker is an offset committed against it (option 'marker.topic', default "
                        "'topic')",
                    )
                )
            acls += [KafkaAcl("topic", t, "WRITE", why="write the rows") for t in sorted(self.denied_topics)]
        if not acls:
            return None
        if self.in_transaction:
            self.abort_quietly()
        text = kafka_clients.refused_access(self.conf, err, acls, f"{self.context}: {what}")
        return FatalError(f"{text}. Nothing of the transaction is visible", transactional_id=self.name)

    def _call(self, what: str, fn: Callable[[float], T], *, marker_topic: str | None = None) -> T:
        """Run a transactional call: retry while librdkafka says retriable, within the timeout; a fenced
        producer is ``Fenced``; an abortable error aborts and is retriable (the task or batch runs again).
        ``fn`` gets the seconds left: each try waits at most that, so the call ends within the timeout
        (a try given the whole timeout again after a slow retriable failure could wait twice as long)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                # tries of at most _SLICE seconds (a timed-out transactional call may be made again: it goes
                # on where it was), so that a refused login, which librdkafka reports only to the error_cb
                # while the call just waits, fails the step within seconds
                return fn(min(_left(deadline), _SLICE))
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None:
                    raise
                with contextlib.suppress(KafkaException):  # a producer in a fatal state raises its error again
                    self.producer.poll(0)
                self.watch.check()
                err = self._cause(err)
                denied = self._denied(what, err, marker_topic)
                if denied is not None:
                    raise denied from None
                if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                    self.in_transaction = False  # the producer that fenced this one aborted its transaction
                    raise Fenced(
                        f"{self.context}: the producer {self.name!r} was fenced during {what}: a newer one with the "
                        "same transactional id took over (another attempt of this task: speculation or a retry; or "
                        "another query writing with the same sink.id), or its transaction outlived "
                        f"kafka.transaction.timeout.ms ({self.conf.get('transaction.timeout.ms')} ms) and the broker "
                        "aborted it (raise it, up to the broker's transaction.max.timeout.ms, if a task's write or a "
                        "batch's publish takes that long). Its transaction is aborted; nothing of it is visible",
                        transactional_id=self.name,
                    ) from None
                if err.fatal():
                    raise FatalError(f"{self.context}: {what} failed: {err.name()} ({err.str()})") from None
                if err.txn_requires_abort():
                    self.abort_quietly()
                    detail = "; ".join(self.errors[:3]) or err.str()
                    raise RetriableError(
                        f"{self.context}: {what} failed and its transaction was aborted (nothing of it is visible): "
                        f"{err.name()} ({detail})",
                        transactional_id=self.name,
                    ) from None
                if err.retriable() and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                raise RetriableError(
                    f"{self.context}: {what} did not complete within {self.timeout:.0f} s (kafkaProducer.timeoutMs): "
                    f"{err.name()} ({err.str()})",
                    transactional_id=self.name,
                ) from None

    def init(self) -> None:
        """Fence every older producer with this id and abort its open transaction."""
        self._call("init_transactions", self.producer.init_transactions)

    def begin(self) -> None:
        self.errors.clear()
        self.sent_topics.clear()
        self._call("begin_transaction", lambda _left: self.producer.begin_transaction())
        self.in_transaction = True

    def send(self, rows: list[Row]) -> None:
        """Queue ``rows`` in the open transaction."""
        self.sent_topics.update(r[0] for r in rows)
        try:
            produce_all(self.producer, rows, timeout=self.timeout, context=self.context)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError._STATE and self.in_transaction:
                err = self._cause(err)
                denied = self._denied("produce", err, None, topics={r[0] for r in rows})
                if denied is not None:
                    raise denied from None
            if err is not None and err.txn_requires_abort():
                self.abort_quietly()
                raise RetriableError(f"{self.context}: a produce failed: {err.name()} ({err.str()})") from None
            raise FatalError(f"{self.context}: a produce failed: {exc}") from None

    def poll(self) -> None:
        self.producer.poll(0)

    def commit(self, markers: list[tuple[list[TopicPartition], str]]) -> None:
        """Commit the transaction with each (offsets, consumer group) of ``markers`` in it."""
        self.add_markers(markers)
        topic = markers[0][0][0].topic if markers and markers[0][0] else None
        self._call("commit_transaction", self.producer.commit_transaction, marker_topic=topic)
        self.in_transaction = False

    def add_markers(self, markers: list[tuple[list[TopicPartition], str]]) -> None:
        """Put each (offsets, consumer group) of ``markers`` in the open transaction (the coordinator checks the
        producer's epoch: a fenced producer fails here, ``Fenced``). A later call for a group replaces them."""
        for offsets, group in markers:
            metadata = self._group_metadata.get(group)
            if metadata is None:  # a consumer that never joins the group: only its metadata (the group id) is used
                settings = {**admin_config(self.conf), "group.id": group, "enable.auto.commit": "false"}
                consumer = kafka_clients.consumer(settings, kafka_clients.Watch(settings, self.context))
                try:
                    metadata = self._group_metadata[group] = consumer.consumer_group_metadata()
                finally:
                    consumer.close()
            topic = offsets[0].topic if offsets else None
            self._call(
                "send_offsets_to_transaction", partial(self._send_offsets, offsets, metadata), marker_topic=topic
            )

    def _send_offsets(self, offsets: list[TopicPartition], metadata: Any, left: float) -> None:
        send = self.producer.send_offsets_to_transaction
        self._bounded("send_offsets_to_transaction", lambda: send(offsets, metadata, left), left)

    def _bounded(self, what: str, fn: Callable[[], T], timeout: float) -> T:
        """``fn()``, a librdkafka call given ``timeout`` that it may not honour, waited for at most ``_GRACE`` s
        past it (``eos_core.waits.within``). librdkafka 2.x's ``send_offsets_to_transaction`` can block for good when
        the group coordinator's broker goes away mid-call (its coordinator requests never check their timeout:
        confluentinc/librdkafka #5456, #5511; CI: a task waited 380 s after F27's broker restart, with a 30 s
        bound). A call that outlives the bound is given up: the producer is marked ``stuck`` (it takes no
        other call) and the step fails retriably. Its transaction is aborted by the next producer with its id
        (``init`` fences it), or by the broker after transaction.timeout.ms. The blocked thread ends with its
        process: a task's Python worker exits when its task fails; in a driver (the publish of a foreachBatch
        adapter) it waits, a daemon thread, until librdkafka returns or the process ends."""
        try:
            return within(fn, timeout + _GRACE, name=f"spark-eos {what}")
        except StillRunning:
            self.stuck = what
            raise RetriableError(
                f"{self.context}: {what} did not return within {self.timeout:.0f} s (kafkaProducer.timeoutMs) and "
                f"{_GRACE:.0f} s more: librdkafka did not honour its timeout (known for a coordinator whose broker "
                "went away: confluentinc/librdkafka#5456). The producer is given up; its transaction is aborted by "
                "the next attempt (which fences it) or by the broker after kafka.transaction.timeout.ms",
                transactional_id=self.name,
            ) from None

    def abort_quietly(self) -> None:
        self.in_transaction = False
        if self.stuck is not None:  # librdkafka refuses a second transactional call while one is in progress
            log.warning(
                "%s: %s was given up during %s; its transaction is left to the next producer with its id "
                "or to the broker's timeout",
                self.context,
                self.name,
                self.stuck,
            )
            return
        try:
            self.producer.abort_transaction(min(self.timeout, 30.0))
        except KafkaException as exc:
            log.warning(
                "%s: aborting the transaction of %s failed (%s); the broker aborts it after "
                "transaction.timeout.ms, or the next producer with its id does",
                self.context,
                self.name,
                exc,
            )

    def close(self) -> None:
        """Let go of the producer; never raises (a fenced or failed producer fails its flush too, and the
        error that matters is the one already raised)."""
        try:
            self.producer.flush(0)
        except KafkaException as exc:
            log.debug("%s: closing %s: %s", self.context, self.name, exc)


_WARM: OrderedDict[tuple[str, str], TxnProducer] = OrderedDict()  # this worker's producers of task slots
_WARM_MAX = 8


def slot_producer(
    conf: dict[str, str], name: str, *, timeout: float, context: str, fresh: bool = False
) -> tuple[TxnProducer, bool]:
    """The transactional producer of task slot ``name`` in this Python worker: the one an earlier task of
    the slot left here (True: initialised, its last transaction committed), else a new one (False: the
    caller initialises it, which fences every older producer of the slot). ``fresh``: always a new one
    (a retried or speculative attempt: another worker's producer of the slot may have taken over since
    this one was used, and a task attempt must not be spent finding that out).

    Initialising again for every micro-batch costs a round trip, and half a second when the broker is
    still completing the slot's previous transaction. Skipping it is safe: any other producer with the
    id (a speculative or retried attempt) initialises, which fences this one; it then fails at its
    first send or commit and drops out of the cache (``forget``)."""
    key = (name, repr(sorted(conf.items())))
    found = _WARM.pop(key, None)
    if found is not None and fresh:
        found.close()
    elif found is not None:
        _WARM[key] = found
        return found, True
    made = TxnProducer(conf, name, timeout=timeout, context=context)
    _WARM[key] = made
    while len(_WARM) > _WARM_MAX:
        _, old = _WARM.popitem(last=False)
        old.close()
    return made, False


def forget(producer: TxnProducer) -> None:
    """Drop ``producer`` from the worker's cache (it failed, or was fenced) and let it go, aborting the
    transaction it has open (K4: a transaction left open would hold its rows and the slot's marker until
    kafka.transaction.timeout.ms)."""
    for key, cached in list(_WARM.items()):
        if cached is producer:
            del _WARM[key]
    if producer.in_transaction:
        producer.abort_quietly()
    producer.close()


def fence(conf: dict[str, str], names: list[str], *, timeout: float, context: str) -> None:
    """Initialise a producer with each transactional id of ``names`` (at most 16 at once) and let it go: every
    older producer with the id is fenced and its open transaction aborted (K4). Fails (RetriableError,
    FatalError) when any id could not be fenced within ``timeout``."""

    def one(name: str) -> None:
        producer = TxnProducer(conf, name, timeout=timeout, context=context)
        try:
            producer.init()
        finally:
            producer.close()

    if names:
        with ThreadPoolExecutor(min(16, len(names)), thread_name_prefix="spark-eos-fence") as pool:
            list(pool.map(one, names))


class StagingProducer:
    """An idempotent producer that keeps, per partition, the first and last offset and the count of what
    it wrote, for the records' reader to find them again."""

    def __init__(self, conf: dict[str, str], *, timeout: float, context: str) -> None:
        self.timeout = timeout
        self.context = context
        self.errors: list[str] = []
        self.ranges: dict[int, list[int]] = {}  # partition -> [first, last, count]
        self.conf = conf
        self.denied: tuple[str, KafkaError] | None = None  # a topic the broker refused the principal to write
        watch = kafka_clients.Watch(conf, context)
        self.producer = kafka_clients.producer(
            {**conf, "enable.idempotence": "true", "on_delivery": self._delivered}, watch
        )
        kafka_clients.connect(self.producer, watch, timeout)  # a refused login fails now, within seconds

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and self.denied is None:
                self.denied = (msg.topic(), err)
            if len(self.errors) < 5:
                self.errors.append(f"{msg.topic()}-{msg.partition()}: {err.name()} ({err.str()})")
            return
        offset = msg.offset()
        found = self.ranges.get(msg.partition())
        if found is None:
            self.ranges[msg.partition()] = [offset, offset, 1]
        else:
            found[0] = min(found[0], offset)
            found[1] = max(found[1], offset)
            found[2] += 1

    def send(self, rows: list[Row]) -> None:
        try:
            produce_all(self.producer, rows, timeout=self.timeout, context=self.context)
        except KafkaException as exc:  # librdkafka refused a record (its size, a bad partition): the screen missed it
            raise FatalError(
                f"{self.context}: staging a record failed: {exc}; nothing of the batch is visible"
            ) from None

    def finish(self) -> dict[int, tuple[int, int, int]]:
        """Wait for every record; the ranges, or RetriableError if any was not written."""
        left = self.producer.flush(self.timeout)
        if self.denied is not None:
            topic, err = self.denied
            acl = KafkaAcl("topic", topic, "WRITE", why="tasks stage their rows (staging.topic)")
            raise FatalError(kafka_clients.refused_access(self.conf, err, [acl], f"{self.context}: staging"))
        if left or self.errors:
            raise RetriableError(
                f"{self.context}: staging failed ({left} records undelivered after {self.timeout:.0f} s; "
                f"{'; '.join(self.errors) or 'no delivery error'}); the task fails and Spark runs it again"
            )
        return {p: (r[0], r[1], r[2]) for p, r in self.ranges.items()}


class KafkaLookups:
    """Admin look-ups of one sink, made lazily and cached for the process."""

    def __init__(self, conf: dict[str, str], *, timeout: float, context: str) -> None:
        self.conf = {k: v for k, v in conf.items() if not k.startswith(("partitioner", "transaction"))}
        self.timeout = timeout
        self.context = context
        self._admin: AdminClient | None = None
        self._limits: dict[str, TopicLimits | None] = {}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            watch = kafka_clients.Watch(self.conf, self.context)
            self._admin = kafka_clients.admin(admin_config(self.conf), watch)
            kafka_clients.connect(self._admin, watch, self.timeout)  # a refused login fails now, within seconds
        return self._admin

    def limits(self, topics: list[str]) -> dict[str, TopicLimits | None]:
        """Each topic's partitions, max.message.bytes and cleanup policy; None for a topic that does not exist."""
        for t in INTERNAL_TOPICS.intersection(topics):
            self._limits[t] = _INTERNAL_LIMITS
        wanted = [t for t in topics if t not in self._limits]
        if wanted:
            meta = self._retry("topic metadata", lambda left: self.admin.list_topics(timeout=left))
            self._refuse_undescribable([t for t in wanted if t not in meta.topics])
            present = [t for t in wanted if t in meta.topics and meta.topics[t].error is None]
            for t in wanted:
                if t not in present:
                    self._limits[t] = None
            if present:
                configs = self._retry(
                    "topic configs",
                    lambda left: {
                        r.name: f.result(timeout=left)
                        for r, f in self.admin.describe_configs(
                            [ConfigResource(ResourceType.TOPIC, t) for t in present], request_timeout=left
                        ).items()
                    },
                    denied=[
                        KafkaAcl("topic", t, "DESCRIBE_CONFIGS", why="read max.message.bytes and cleanup.policy")
                        for t in present
                    ],
                )
                internal = self._internal([t for t in present if t.startswith("__")])
                for t in present:
                    entries = configs.get(t, {})
                    max_bytes = entries.get("max.message.bytes")
                    policy = entries.get("cleanup.policy")
                    self._limits[t] = TopicLimits(
                        partitions=len(meta.topics[t].partitions),
                        max_message_bytes=int(max_bytes.value)
                        if max_bytes and max_bytes.value
                        else _DEFAULT_MAX_MESSAGE_BYTES,
                        compacted="compact" in (policy.value if policy and policy.value else ""),
                        internal=t in internal,
                    )
        return {t: self._limits[t] for t in topics}

    def _refuse_undescribable(self, topics: list[str]) -> None:
        """Kafka leaves a topic the principal may not describe out of a listing, as if it did not exist: the
        missing ones are described by name (DescribeTopics never creates a topic), and one the broker refuses
        is said as such, with the ACL."""
        if not topics:
            return
        futures = self.admin.describe_topics(TopicCollection(topics), request_timeout=self.timeout)
        for t, future in futures.items():
            try:
                future.result(timeout=self.timeout + _GRACE)
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    acl = KafkaAcl("topic", t, "WRITE", why="write to it (WRITE implies DESCRIBE)")
                    raise FatalError(
                        kafka_clients.refused_access(self.conf, err, [acl], self.context), topic=t
                    ) from None

    def _internal(self, topics: list[str]) -> set[str]:
        """The topics of ``topics`` the cluster's metadata flags internal (DescribeTopics). Asked only for names
        that begin with ``__``, as every internal topic of Kafka's does, so a write to ordinary topics pays nothing."""
        if not topics:
            return set()
        described = self._retry(
            "topic descriptions",
            lambda left: {
                name: f.result(timeout=left)
                for name, f in self.admin.describe_topics(TopicCollection(topics), request_timeout=left).items()
            },
        )
        return {name for name, d in described.items() if d.is_internal}

    def require(self, topic: str, option: str) -> TopicLimits:
        found = self.limits([topic])[topic]
        if found is None:
            raise ConfigError(
                f"{self.context}: topic {topic!r} (option '{option}') does not exist on {self.conf.get('bootstrap.servers')}; "
                "the sink never creates the topics it writes: create it (kafka-topics --create --topic ...)",
                option=option,
            )
        if found.internal and option in ("topic", "errors.topic"):
            raise self._internal_topic(topic, option)
        return found

    def _internal_topic(self, topic: str, option: str) -> ConfigError:
        return ConfigError(
            f"{self.context}: topic {topic!r} (option '{option}') is internal to Kafka: the broker refuses every "
            "record written to it. Name a topic of your own",
            option=option,
        )

    def transaction_max_timeout_ms(self) -> int | None:
        """The broker's transaction.max.timeout.ms (None when the principal may not describe the cluster)."""
        try:
            meta = self.admin.list_topics(timeout=self.timeout)
            broker = next(iter(meta.brokers))
            futures = self.admin.describe_configs(
                [ConfigResource(ResourceType.BROKER, str(broker))], request_timeout=self.timeout
            )
            entries = next(iter(futures.values())).result(timeout=self.timeout)
            value = entries.get("transaction.max.timeout.ms")
            return int(value.value) if value and value.value else None
        except (KafkaException, StopIteration, ValueError) as exc:
            log.info("%s: cannot read the broker's transaction.max.timeout.ms (%s); not checked", self.context, exc)
            return None

    def ensure_topic(self, topic: str, partitions: int, config: dict[str, str], option: str) -> TopicLimits:
        """The topic, created with ``partitions`` and ``config`` when missing."""
        found = self.limits([topic])[topic]
        if found is not None and found.internal:
            raise self._internal_topic(topic, option)
        if found is not None:
            return found
        future = self.admin.create_topics(
            [NewTopic(topic, partitions, -1, config=config)], request_timeout=self.timeout
        )[topic]
        try:
            future.result(timeout=self.timeout)
            log.info("%s: created topic %s (%d partitions, %s)", self.context, topic, partitions, config)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                where = self.conf.get("bootstrap.servers", "<bootstrap>")
                settings = " ".join(f"--config {k}={v}" for k, v in sorted(config.items()))
                create = (
                    f"kafka-topics.sh --bootstrap-server {where} --command-config admin.properties --create "
                    f"--topic '{topic}' --partitions {partitions} {settings}"
                )
                grant = acl_command(KafkaAcl("topic", topic, "CREATE"), kafka_clients.principal(self.conf), where)
                raise ConfigError(
                    f"{self.context}: topic {topic!r} (option '{option}') does not exist and could not be created: "
                    f"{exc}. Create it as an admin ({create}) or grant the sink's principal CREATE on it ({grant})",
                    option=option,
                ) from None
        self._limits.pop(topic, None)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            found = self.limits([topic])[topic]
            if found is not None and found.partitions:
                return found
            self._limits.pop(topic, None)
            time.sleep(0.1)
        raise RetriableError(f"{self.context}: topic {topic!r} was created but its metadata did not appear")

    def _retry(self, what: str, fn: Callable[[float], T], denied: list[KafkaAcl] | None = None) -> T:
        """``fn`` retried while its error is retriable, each try given the seconds left of the timeout; an
        authorization failure is a FatalError naming ``denied``, the ACLs the look-up needs."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn(_left(deadline))
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is not None and denied and err.code() in _AUTHORIZATION:
                    raise FatalError(
                        kafka_clients.refused_access(self.conf, err, denied, f"{self.context}: {what}")
                    ) from None
                if err is not None and err.retriable() and time.monotonic() < deadline:
                    time.sleep(0.25)
                    continue
                raise RetriableError(
                    f"{self.context}: {what} from {self.conf.get('bootstrap.servers')} failed: {exc}"
                ) from None

    def close(self) -> None:
        self._admin = None


_SLICE = 2.0  # seconds: the longest try of a transactional call (TxnProducer._call)
_AUTHORIZATION = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def _left(deadline: float) -> float:
    """The seconds left until ``deadline`` (``time.monotonic()``), at least 0.1: a last try, never none."""
    return max(0.1, deadline - time.monotonic())
