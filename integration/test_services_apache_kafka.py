"""The embedded Apache Kafka broker: real Kafka behaviour (aborted records keep their offsets), data on
disk across a crash, a clean stop that leaves nothing, and the jar cache that is fetched once."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from connectors import services
from connectors.services import _proc, maven
from connectors.services import apache_kafka as ak
from connectors.services.apache_kafka import ApacheKafka
from eos_core.errors import ServiceError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker() -> Iterator[ApacheKafka]:
    kafka = ApacheKafka()
    try:
        yield kafka
    finally:
        kafka.stop()


def _topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"ak-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
    return name


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    offsets: list[int] = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for v in values:
        p.produce(topic, value=v, partition=0, on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()))
    assert p.flush(30) == 0
    return offsets


def _read(bootstrap: str, topic: str, *, isolation: str = "read_uncommitted") -> list[tuple[int, bytes | None]]:
    """Every record of partition 0 a consumer with ``isolation`` gets, up to the end of the partition."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    out: list[tuple[int, bytes | None]] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise KafkaException(msg.error())
            out.append((msg.offset(), msg.value()))
        raise AssertionError(f"no end of {topic}[0] within 30s; read {out}")
    finally:
        c.close()


def _last_start(kafka: ApacheKafka) -> str:
    """The broker log from the previous start's end to the last start's end: a stop and a start."""
    return kafka.log_path.read_text().split("Kafka Server started")[-2]


def _high_watermark(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def test_a_real_broker_produces_and_consumes(broker: ApacheKafka) -> None:
    assert (broker.kind, broker.is_tansu, broker.version) == ("embedded", False, ak.kafka_version())
    assert broker.running() and broker.bootstrap == f"127.0.0.1:{broker.port}"
    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert not str(md.cluster_id).startswith("tansu") and list(md.brokers) == [1]
    topic = _topic(broker.bootstrap)
    values = [b"v%d" % i for i in range(10)]
    assert _produce(broker.bootstrap, topic, values) == list(range(10))
    assert _read(broker.bootstrap, topic) == list(enumerate(values))
    # the readiness probe cleans up after itself: no consumer group of its own is left
    # the client must outlive its future: a collected AdminClient purges its queue and the future never ends
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    groups = admin.list_consumer_groups(request_timeout=30).result(40)
    assert not [g.group_id for g in groups.valid if g.group_id.startswith("spark-eos-health-")]
    assert broker.log_path.is_file() and "Kafka Server started" in broker.log_path.read_text()


def test_aborted_records_occupy_offsets_read_committed_skips_them(broker: ApacheKafka) -> None:
    topic = _topic(broker.bootstrap)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"aborted-%d" % i, partition=0)
    p.flush(30)  # written to the log before the abort
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=b"committed-%d" % i, partition=0)
    p.commit_transaction(30)

    committed = _read(broker.bootstrap, topic, isolation="read_committed")
    assert [v for _, v in committed] == [b"committed-0", b"committed-1"]
    # Apache Kafka stores the aborted records and a marker after each transaction: 3 aborted (0-2),
    # abort marker (3), 2 committed (4-5), commit marker (6). tansu drops aborted records altogether.
    assert [o for o, _ in committed] == [4, 5]
    assert _high_watermark(broker.bootstrap, topic) == 7
    uncommitted = _read(broker.bootstrap, topic)
    assert [o for o, _ in uncommitted] == [0, 1, 2, 4, 5]


def test_crash_then_start_keeps_what_was_written(broker: ApacheKafka) -> None:
    topic = _topic(broker.bootstrap)
    values = [b"before-crash-%d" % i for i in range(20)]
    _produce(broker.bootstrap, topic, values)
    pid, bootstrap = broker.pid, broker.bootstrap
    broker.crash()
    assert not broker.running() and not _proc.pid_alive(pid)
    assert (broker.log_dir / f"{topic}-0").is_dir()  # the segments stay on disk
    with pytest.raises(ServiceError, match="not running; nothing to crash"):
        broker.crash()
    broker.start()
    assert broker.running() and broker.pid != pid and broker.bootstrap == bootstrap  # same ports
    assert "no clean shutdown file was found" in _last_start(broker)  # it was a crash, not a stop
    assert _read(broker.bootstrap, topic) == list(enumerate(values))
    # the transaction and group coordinators answer again at once (start() waited for them)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(10)
    broker.start()  # running: a no-op
    assert broker.running()


def test_restart_is_clean_and_keeps_data(broker: ApacheKafka) -> None:
    topic = _topic(broker.bootstrap)
    _produce(broker.bootstrap, topic, [b"a", b"b"])
    broker.restart()
    assert "no clean shutdown file was found" not in _last_start(broker)
    assert [v for _, v in _read(broker.bootstrap, topic)] == [b"a", b"b"]


def test_config_overrides_reach_the_broker_and_stop_cleans_up() -> None:
    kafka = ApacheKafka(config={"log.segment.bytes": 1048576, "log.retention.check.interval.ms": "1000"})
    base, pid = kafka.base, kafka.pid
    try:
        assert "log.segment.bytes=1048576" in kafka.properties_path.read_text()
        resource = ConfigResource(ResourceType.BROKER, "1")
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        configs = admin.describe_configs([resource])[resource].result(10)
        assert configs["log.segment.bytes"].value == "1048576"
        assert configs["log.retention.check.interval.ms"].value == "1000"
        tree = _proc.process_tree(pid)
        assert pid in tree
    finally:
        kafka.stop()
    assert not base.exists()
    assert not [p for p in tree if _proc.pid_alive(p)]
    assert not kafka.running()
    kafka.stop()  # idempotent
    with pytest.raises(ServiceError, match="is gone"):
        kafka.start()


def test_services_pick_apache_kafka_unless_told_tansu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOS_SERVICES", "embedded")
    monkeypatch.delenv("EOS_KAFKA_EMBEDDED", raising=False)
    with services.kafka() as default:
        assert isinstance(default, ApacheKafka) and not default.is_tansu
    monkeypatch.setenv("EOS_KAFKA_EMBEDDED", "tansu")
    with services.kafka() as tansu:
        assert tansu.is_tansu and not isinstance(tansu, ApacheKafka)


def test_the_jar_cache_is_reused_without_ivy(monkeypatch: pytest.MonkeyPatch, broker: ApacheKafka) -> None:
    if os.environ.get(ak.JARS_ENV):
        pytest.fail(f"{ak.JARS_ENV} is set: this test checks the cache that is used without it")
    jars = ak.resolve_jars()  # the broker fixture resolved (or found) them already
    assert broker.jars_dir == jars
    marker = jars / ak.MARKER
    before = (marker.stat().st_mtime_ns, marker.read_text())
    recorded = json.loads(before[1])
    assert recorded["version"] == broker.version and f"kafka_2.13-{broker.version}.jar" in recorded["jars"]
    assert "-retrieve" in recorded["command"] and any(a.endswith(".jar") and "ivy" in a for a in recorded["command"])

    def no_ivy(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ivy ran although the cache is complete")

    monkeypatch.setattr(maven, "_run_ivy", no_ivy)
    assert ak.resolve_jars() == jars
    assert (marker.stat().st_mtime_ns, marker.read_text()) == before
    assert sorted(p.name for p in jars.glob("*.jar")) == recorded["jars"]


def test_start_refuses_a_taken_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServiceError, match=rf"127\.0\.0\.1:{port}: the port is in use"):
            ApacheKafka(port=port)
