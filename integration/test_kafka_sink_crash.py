"""The kafka-eos sink's crash matrix on Apache Kafka, rows F26-F29 of docs/guarantees.md.

Each pipeline is ``integration.harness.runner --sink kafka`` in its own process group: Kafka (kafka-eos)
-> JSON parse -> the ``kafka-eos`` sink into a topic of its own, on an Apache Kafka broker of this
module alone (crashing it disturbs no other test; it aborts timed-out transactions within a second), secured
as the session's (SASL_SSL, ACLs enforced): each query runs as a principal holding exactly the ACLs the source
and the sink declare for its options (``Pipeline.kafka_acls``), the zombies and checks as the broker's admin.
To stay inside the CI budget, one query per visibility mode lives through every fault in turn, at
distinct batches, restarted from its checkpoint after each:

- F26 the whole process group SIGKILLed at each step of the protocol;
- F27 the broker SIGKILLed while a task's transaction (partition) or the driver's publish (batch) is
  open, and restarted on its log dir;
- F28 zombies with the sink's transactional ids (each task slot's, the publish's) holding open
  transactions of junk and a marker when the query runs: fenced, aborted, never visible;
- F29 (partition) a task's transaction outlives ``kafka.transaction.timeout.ms``: the broker aborts
  it, the task fails naming the setting, Spark's retry writes the rows once.

Every step proves its fault happened (the fault log, the SIGKILLed JVMs, the zombies' fenced commits,
aborted records in the sink topic's log) and the query ends with the exact checker for topics
(``connectors.toolkit.topic_checker``): the sink topic, read ``read_committed``, equals the source as
a multiset (no duplicate, loss, phantom, changed payload), no transaction of the sink is left open,
and the sink's last marker equals Spark's last ``commits/n``.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from connectors.services.apache_kafka import ApacheKafka
from connectors.toolkit import checker
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from connectors.toolkit.harness import wait_until
from eos_core.kafka_config import client_settings
from integration.fixtures.kafka import module_broker, module_principal
from integration.harness.matrix import Pipeline
from sinks.kafka.markers import Marker, marker_offsets, publish_name, slot_name

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.usefixtures("own_broker")]

RECORDS = 1000  # 2 partitions, 200 per trigger: 5 batches for F26's kills, one per batch
MORE = 400  # produced before each later fault's run: it has batches to run (the run before drained the topic)
PER_TRIGGER = 200

# F26: (what, fault spec, the point whose firing proves it)
KILLS = {
    "partition": [
        # rows sent, the task's transaction open: the restart's producer with the slot's id aborts it
        (
            "rows sent, not committed",
            "sink.after_write:batch=2:partition=1:rows=transaction:action=kill-group:once",
            "sink.after_write",
        ),
        # slot 0 committed its rows and marker, slot 1 not yet (it waits): the replay skips slot 0 only
        (
            "one task committed",
            "sink.before_write:batch=3:partition=1:action=sleep:seconds=4:once;"
            "sink.task.after_commit:batch=3:partition=0:action=kill-group:once",
            "sink.task.after_commit",
        ),
        # every task committed, Spark's commits/n not written: the replay skips every slot
        ("all committed, commits/n not", "sink.after_commit:batch=4:action=kill-group:once", "sink.after_commit"),
    ],
    "batch": [
        # rows staged, the publish not begun: the replay stages them again (new tags), the publish reads those
        ("rows staged", "sink.after_write:batch=2:partition=1:rows=staged:action=kill-group:once", "sink.after_write"),
        # half the batch sent in the publish's open transaction: the restart's publish fences and aborts it
        ("mid-publish", "sink.publish.mid:batch=3:k=100:action=kill-group:once", "sink.publish.mid"),
        ("published, commits/n not", "sink.after_commit:batch=4:action=kill-group:once", "sink.after_commit"),
    ],
}
# what a Python worker or the driver killed by a client library leaves in the run's log
_CRASHED = ("Segmentation fault", "Fatal Python error", "Python worker exited unexpectedly", "Assertion `")


# F27: where the query is held while the broker is killed, a transaction of the sink open (rows=transaction: a
# replay of a batch a kill left partly written stages its rows, sink.after_write too, with no transaction open)
HELD = {"partition": "sink.after_write:partition=0:rows=transaction", "batch": "sink.publish.mid:k=100"}


@pytest.fixture(scope="module")
def broker() -> Iterator[ApacheKafka]:
    kafka = module_broker(config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}, heap="256m")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def app(broker: ApacheKafka, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str | None]:
    """The queries' principal, granted exactly what the source and the sink declare for each query's options."""
    return module_principal(broker, "ks", tmp_path_factory.mktemp("ks-app"))


@pytest.fixture
def make_pipeline(broker: ApacheKafka, app: tuple[Any, str | None], tmp_path: Any) -> Any:
    principal, properties = app

    def make(visibility: str) -> Pipeline:
        name = f"ks_{visibility}_{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, name, 2)
        _more(broker.bootstrap, name, RECORDS, seed=0)
        pipe = Pipeline(
            "kafka",
            broker.bootstrap,
            name,
            "",
            "",
            f"{name}-out",
            str(tmp_path / name),
            PER_TRIGGER,
            options=(f"visibility={visibility}",),
            kafka_config=properties,
        )
        if principal is not None:
            broker.grant(principal.name, pipe.kafka_acls())
        return pipe

    return make


def _more(bootstrap: str, topic: str, n: int, *, seed: int) -> None:
    produce_records(bootstrap, topic, make_records(n, seed=seed, prefix=f"{topic}-{seed}-"), partitions=2)


def _f27_broker_killed_mid_transaction(pipe: Pipeline, broker: ApacheKafka, held: str) -> None:
    point = held.split(":")[0]
    # each blocking step of the sink bounded at 30 s (default 120): whatever the restart does to the open
    # transaction, the query rides it out or fails loudly inside the run's 400 s; 120 s steps chained over a
    # task's two attempts (commit; init, marker look-up, commit) could outlast it (CI, once: RUNNER TIMEOUT)
    proc = pipe.process(f"{held}:action=sleep:seconds=3:once", state="F27", extra=("kafkaProducer.timeoutMs=30000",))
    proc.start()
    try:
        wait_until(lambda: pipe.fired(point, action="sleep"), timeout=300, what=f"{point} held", alive=proc.alive)
        jvm = broker.proc
        assert jvm is not None
        broker.crash()  # records sent in the transaction, nothing committed
        assert jvm.returncode == -signal.SIGKILL, jvm.returncode
        time.sleep(4)
        broker.start()  # the same log dir: the transaction coordinator finds the open transaction
        assert broker.proc is not None and broker.proc.pid != jvm.pid
        out = proc.wait(400)
    finally:
        proc.stop()
    pipe.outcomes.append(out)
    # the query either rode it out (the task or the publish failed and ran again) or failed loudly, an error of
    # the sink's: never a process killed by a client library (issue 45: a marker read crashed librdkafka on a
    # coordinator error while the restarted broker loaded __consumer_offsets, and the query failed with it)
    assert out.returncode in (0, 2), pipe.describe()
    for crash in _CRASHED:
        assert not proc.logged(crash), f"F27: {crash!r} in the run's log\n{pipe.describe()}"


def _zombie(bootstrap: str, name: str, topic: str, junk: int) -> Producer:
    """A producer with transactional id ``name`` that sent ``junk`` records and a marker for batch 99 in a
    transaction it leaves open (a writer that lost its connection or hung, and comes back later)."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            **client_settings(),
            "transactional.id": name,
            "transaction.timeout.ms": 120000,
            "log_level": 0,
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(junk):
        p.produce(topic, b'{"id": "zombie-%d", "key": "z", "amount": 0}' % i, key=b"z")
    assert p.flush(30) == 0
    group = Consumer({"bootstrap.servers": bootstrap, **client_settings(), "group.id": name})
    m = Marker(batch=99, lineage="zombie", query="zombie", rows=junk, digest="z", mode="partition")
    p.send_offsets_to_transaction(marker_offsets(topic, m), group.consumer_group_metadata(), 30)
    group.close()
    return p


def _logged(bootstrap: str, topic: str) -> int:
    """Offsets in the topic's log: committed and aborted records and transaction markers."""
    c = Consumer({"bootstrap.servers": bootstrap, **client_settings(), "group.id": f"r-{uuid.uuid4().hex}"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(2))
    finally:
        c.close()


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_f26_to_f29_one_query_through_every_fault(visibility: str, broker: ApacheKafka, make_pipeline: Any) -> None:
    pipe = make_pipeline(visibility)

    # F26: the process group killed at each step of the protocol
    for what, spec, point in KILLS[visibility]:
        out = pipe.run(spec, state=point)
        assert out.killed, f"F26 {what}: expected SIGKILL of the group, got {out}\n{pipe.describe()}"
        assert pipe.fired(point, action="kill-group"), f"F26 {what}: {point} never fired\n{pipe.describe()}"

    # F27: the broker killed with the sink's transaction open
    _more(pipe.bootstrap, pipe.topic, MORE, seed=27)
    _f27_broker_killed_mid_transaction(pipe, broker, HELD[visibility])

    # F29 (partition): a transaction timed out by the broker, the task's retry writes its rows once
    if visibility == "partition":
        _more(pipe.bootstrap, pipe.topic, MORE, seed=29)
        out = pipe.run(
            # rows=transaction: the run may begin by replaying a batch F27 left partly written, whose task stages
            # its rows with no transaction open (CI, once: the sleep was spent there and nothing timed out)
            "sink.after_write:partition=0:attempt=0:rows=transaction:action=sleep:seconds=7:once",
            state="F29",
            extra=("kafka.transaction.timeout.ms=3000",),
        )
        assert len(pipe.fired("sink.after_write", partition=0, rows="transaction", action="sleep")) == 2, (
            pipe.describe()
        )
        with open(pipe.log_path, encoding="utf-8") as fh:
            assert "kafka.transaction.timeout.ms (3000 ms)" in fh.read(), f"F29 not reported\n{pipe.describe()}"
        assert out.returncode in (0, 2), pipe.describe()

    # F28: zombies with the sink's transactional ids, transactions open, when the query runs to its end
    names = [slot_name(pipe.sink_id, p) for p in (0, 1)] if visibility == "partition" else [publish_name(pipe.sink_id)]
    _more(pipe.bootstrap, pipe.topic, MORE, seed=28)
    before = _logged(pipe.bootstrap, pipe.table)
    zombies = [_zombie(pipe.bootstrap, n, pipe.table, 25) for n in names]
    assert pipe.run().returncode == 0, pipe.describe()  # the writers fence them: no wait for their timeout
    for z in zombies:  # each zombie comes back to commit: fenced, its transaction was aborted
        with pytest.raises(KafkaException) as err:
            z.commit_transaction(30)
        assert err.value.args[0].fatal(), err.value
    assert _logged(pipe.bootstrap, pipe.table) >= before + 25 * len(zombies)  # the junk is in the log, aborted

    report = pipe.report(min_faults=len(KILLS[visibility]) + 1)
    assert report.ok, f"{report.table()}\n{pipe.describe()}"  # no phantom: no zombie record is visible
    assert report.info["sink_records"] == RECORDS + MORE * (3 if visibility == "partition" else 2)
    # the kills inside open transactions really left aborted records in the log, which no reader got
    committed = len(checker.read_topic(pipe.bootstrap, pipe.table, parse_json=False))
    assert _logged(pipe.bootstrap, pipe.table) - committed > 25 * len(zombies) + 2 * len(pipe.outcomes)
