"""confluent-kafka against the brokers: topics, produce, consume from an offset, watermarks, transactions.

Every test runs twice: against the session's broker (a container when a Docker engine answers)
and against an embedded tansu started here, so the embedded path is proven in every run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from connectors.services.base import KafkaService
from connectors.services.embedded_kafka import EmbeddedKafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["session", "embedded"])
def kafka_service(request: pytest.FixtureRequest, kafka_service: KafkaService) -> Iterator[KafkaService]:
    """The session's broker, then a private embedded tansu (the topic and produce fixtures follow)."""
    if request.param == "session":
        yield kafka_service
        return
    embedded = EmbeddedKafka()
    try:
        assert embedded.kind == "embedded" and embedded.is_tansu
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture(scope="module")
def kafka_admin(kafka_service: KafkaService) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_service.bootstrap, **kafka_service.client_config()})


def _consume(
    kafka: KafkaService,
    topic: str,
    partition: int,
    offset: int,
    *,
    isolation: str = "read_uncommitted",
    expect: int | None = None,
    timeout: float = 20.0,
) -> list[tuple[int, bytes | None]]:
    """Read ``topic``/``partition`` from ``offset`` up to the high watermark (or ``expect`` records)."""
    import time

    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            **kafka.client_config(),
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "error",
        }
    )
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        c.assign([TopicPartition(topic, partition, offset)])
        out: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if expect is not None and len(out) >= expect:
                break
            msg = c.poll(0.5)
            if msg is None:
                if expect is None and c.position([TopicPartition(topic, partition)])[0].offset >= high:
                    break
                continue
            if msg.error():
                raise KafkaException(msg.error())
            out.append((msg.offset(), msg.value()))
            if expect is None and msg.offset() + 1 >= high:
                break
        return out
    finally:
        c.close()


def test_create_produce_consume_from_offset_and_watermarks(
    kafka_service: KafkaService, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(partitions=2, prefix="svc")
    written = produce(topic, [(b"k%d" % i, b"v%d" % i, i % 2) for i in range(10)])
    # produce() reports every record, in input order, with consecutive offsets per partition.
    assert [p for p, _ in written] == [i % 2 for i in range(10)]
    assert [o for p, o in written if p == 0] == list(range(5))
    assert [o for p, o in written if p == 1] == list(range(5))

    c = Consumer({"bootstrap.servers": kafka_service.bootstrap, **kafka_service.client_config(), "group.id": "wm"})
    try:
        for part in (0, 1):
            low, high = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
            assert (low, high) == (0, 5), f"watermarks of partition {part}"
        # ListOffsets by time: the earliest offset at or after timestamp 0 is the first record.
        found = c.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)
        assert found[0].offset == 0
    finally:
        c.close()

    assert _consume(kafka_service, topic, 0, 3) == [(3, b"v6"), (4, b"v8")]
    assert _consume(kafka_service, topic, 1, 0) == [(i, b"v%d" % (2 * i + 1)) for i in range(5)]


def test_transactions_committed_visible_aborted_not(kafka_service: KafkaService, new_topic: Callable[..., str]) -> None:
    topic = new_topic(prefix="svc-tx")
    p = Producer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            **kafka_service.client_config(),
            "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"committed-%d" % i, partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=b"aborted-%d" % i, partition=0)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"after", partition=0)
    p.commit_transaction(30)

    committed = [v for _, v in _consume(kafka_service, topic, 0, 0, isolation="read_committed", expect=4)]
    assert committed == [b"committed-0", b"committed-1", b"committed-2", b"after"]
    # Neither broker shows aborted records under read_committed (tansu does not even store them).
    assert not any(v and v.startswith(b"aborted") for v in committed)
