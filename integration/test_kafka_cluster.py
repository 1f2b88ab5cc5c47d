"""A replicated Kafka (issue 46): three KRaft nodes, three replicas per partition, two in sync required.

The cluster (``connectors.services.kafka_cluster.KafkaCluster``) is this module's alone, started once and
secured as the session's broker is (SASL_SSL, ACLs enforced); its tests run on one pytest worker
(``xdist_group``), so CI starts one cluster. The pipelines are the crash matrix's runner (``kafka-eos`` -> JSON
parse -> ``postgres-2pc``) as an app principal holding exactly the ACLs the source declares; each test proves
its fault happened (a node's JVM SIGKILLed or restarted, the partition's leadership moved) and ends with the
exact checker: no duplicate, no loss, no phantom, no prepared transaction left, the sink's last decision =
Spark's last ``commits/n``.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from connectors.services import embedded_kafka_security
from connectors.services.kafka_cluster import KafkaCluster
from connectors.toolkit.chaos import make_records
from connectors.toolkit.harness import wait_until
from eos_core.kafka_config import client_settings
from integration.fixtures.kafka import module_principal
from integration.harness.matrix import pipeline_maker
from integration.test_kafka_broker_faults import _assert_ok, _drained, _produce

pytestmark = [
    pytest.mark.integration,
    pytest.mark.crash,
    pytest.mark.usefixtures("own_broker"),
    pytest.mark.xdist_group("kafka-cluster"),  # one cluster per CI run: its tests on one worker
]


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(security=embedded_kafka_security(), heap="320m")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _all_nodes_up(broker: KafkaCluster) -> None:
    """A test that left a node down (it failed before starting it again) leaves a whole cluster to the next."""
    broker.start_all()
    broker.wait_in_sync(120)


@pytest.fixture(scope="module")
def app(broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str | None]:
    return module_principal(broker, "rc", tmp_path_factory.mktemp("rc-app"))


@pytest.fixture
def make_pipeline(broker: KafkaCluster, app: tuple[Any, str | None], postgres_service: Any, tmp_path: Any) -> Any:
    return pipeline_maker(broker, app, postgres_service.dsn, tmp_path, "rc")


def _create_topic(broker: KafkaCluster, topic: str, partitions: int) -> None:
    """A topic with the cluster's defaults: a replica on every node, two in sync required."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **client_settings()})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
    wait_until(
        lambda: len(broker.partitions([topic])) == partitions and not broker.out_of_sync(),
        timeout=60,
        what=f"{topic}: {partitions} partitions, every replica in sync",
    )


def test_three_nodes_replicate_every_partition_and_a_crashed_leader_hands_over(broker: KafkaCluster) -> None:
    """The service itself: replicas, the ISR, min.insync.replicas, coordinators, the controller, a node's crash."""
    assert len(broker.nodes) == 3 and len(set(broker.ports)) == 3
    topic = f"rc-service-{uuid.uuid4().hex[:8]}"
    _create_topic(broker, topic, 2)
    for (t, _p), part in broker.partitions([topic]).items():
        assert t == topic and sorted(part.replicas) == [1, 2, 3] and sorted(part.isrs) == [1, 2, 3], part
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **client_settings()})
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    (entries,) = [f.result(30) for f in configs.values()]
    assert entries["min.insync.replicas"].value == "2" and entries["unclean.leader.election.enable"].value == "false"
    for internal in ("__consumer_offsets", "__transaction_state"):
        assert all(len(p.replicas) == 3 for p in broker.partitions([internal]).values()), internal
    assert broker.active_controller() in (1, 2, 3)

    # a group's coordinator as Kafka names it is the one its id hashes to
    group = f"rc-group-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, **client_settings(), "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    (described,) = [f.result(30) for f in admin.describe_consumer_groups([group]).values()]
    assert described.coordinator.id == broker.group_coordinator(group)

    # the leader of partition 0 SIGKILLed: another replica leads, writes with acks=all go on (2 of 3 in sync)
    leader = broker.leader(topic, 0)
    jvm = broker.node(leader).proc
    assert jvm is not None
    broker.node(leader).crash()
    assert jvm.returncode == -signal.SIGKILL, jvm.returncode
    wait_until(lambda: broker.leader(topic, 0) not in (leader, -1), timeout=30, what="a new leader of partition 0")
    producer = Producer({"bootstrap.servers": broker.bootstrap, **client_settings(), "acks": "all"})
    producer.produce(topic, b"after the crash", partition=0)
    assert producer.flush(30) == 0
    assert broker.out_of_sync(), "a partition of the crashed node should be short of a replica"
    broker.node(leader).start()
    broker.wait_in_sync(120)


def test_f31_partition_leader_sigkilled_mid_batch(broker: KafkaCluster, make_pipeline: Any) -> None:
    """The leader of a partition the source reads SIGKILLed while a read task is in the middle of its batch:
    the task reads on from the new leader; the query neither fails nor restarts."""
    pipe = make_pipeline("f31", max_offsets=100)
    _create_topic(broker, pipe.topic, 2)
    records = make_records(400, seed=31, prefix=f"{pipe.table}-")
    _produce(broker.bootstrap, pipe.topic, records, 2, acks="all")
    spec = "source.read.start:batch=1:action=sleep:seconds=3;sink.after_write:batch=1:action=sleep:seconds=0"
    proc = pipe.process(spec, state="F31").start()
    try:
        wait_until(
            lambda: pipe.fired("source.read.start", batch=1), timeout=300, what="batch 1's read tasks", alive=proc.alive
        )
        leader = broker.leader(pipe.topic, 0)
        node = broker.node(leader)
        jvm = node.proc
        assert jvm is not None
        node.crash()
        killed_at = time.time()
        assert jvm.returncode == -signal.SIGKILL, jvm.returncode
        wait_until(
            lambda: broker.leader(pipe.topic, 0) not in (leader, -1), timeout=30, what="partition 0's new leader"
        )
        out = proc.wait(400)
    finally:
        proc.stop()
    pipe.outcomes.append(out)
    assert out.returncode == 0, f"the query failed when a partition's leader died\n{pipe.describe()}"
    writes = pipe.fired("sink.after_write", batch=1)
    assert len(writes) == 2 and all(float(e["time"]) > killed_at for e in writes), (killed_at, writes)
    node.start()
    report = pipe.report()
    _assert_ok(report, pipe)
    assert report.info["source_records"] == len(records) == report.info["sink_rows"]


def test_f32_rolling_restart_of_every_node_under_a_running_query(broker: KafkaCluster, make_pipeline: Any) -> None:
    """Every node restarted in turn (controlled shutdown, start, replicas back in sync before the next) while
    a query runs and a producer writes: the query runs through it without a restart, exactly once."""
    pipe = make_pipeline("f32", max_offsets=50)
    _create_topic(broker, pipe.topic, 2)
    first = make_records(100, seed=32, prefix=f"{pipe.table}-a-")
    _produce(broker.bootstrap, pipe.topic, first, 2, acks="all")
    sent: list[dict[str, Any]] = list(first)
    stop = threading.Event()

    def feed() -> None:  # 20 records every half second, through the whole rolling restart
        i = 0
        while not stop.is_set():
            batch = make_records(20, seed=1000 + i, prefix=f"{pipe.table}-r{i}-")
            _produce(broker.bootstrap, pipe.topic, batch, 2, acks="all")
            sent.extend(batch)
            i += 1
            time.sleep(0.5)

    proc = pipe.process(state="F32", trigger="processing:1").start()
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        _drained(pipe, proc, len(first))
        pids = {n.node_id: n.pid for n in broker.nodes}
        feeder.start()
        restarts = broker.rolling_restart()
        stop.set()
        feeder.join(60)
        assert proc.alive(), f"the query ended during the rolling restart\n{pipe.describe()}"
        _drained(pipe, proc, len(sent))
    finally:
        stop.set()
        out = proc.stop()
    pipe.outcomes.append(out)
    assert out.killed, f"the query must have run until we stopped it (it did not fail)\n{pipe.describe()}"
    # every node was restarted once, in turn, while records kept coming
    assert [r["node"] for r in restarts] == [1, 2, 3]
    assert all(r["old_pid"] == pids[r["node"]] != r["new_pid"] for r in restarts), (pids, restarts)
    assert len(sent) > len(first) + 60, f"only {len(sent) - len(first)} records were written during the restarts"
    report = pipe.report()
    _assert_ok(report, pipe)
    assert report.info["source_records"] == len(sent) == report.info["sink_rows"]
