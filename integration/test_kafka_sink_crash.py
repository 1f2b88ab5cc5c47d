"""The kafka-eos sink's crash matrix on Apache Kafka (rows F26-F30 of docs/guarantees.md).

Each pipeline is ``integration.harness.runner --sink kafka`` in its own process group: Kafka (kafka-eos)
-> JSON parse -> the ``kafka-eos`` sink into a topic of its own. Every step proves its fault happened
(the fault log, the SIGKILLed group, records of aborted transactions in the sink topic's log) and every
test ends with the exact checker for topics (``connectors.toolkit.topic_checker``): the sink topic, read
``read_committed``, equals the source as a multiset (no duplicate, loss, phantom, changed payload), no
transaction of the sink is left open, and the sink's last marker equals Spark's last ``commits/n``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from connectors.toolkit import checker
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from integration.harness.matrix import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.crash]

RECORDS = 1800  # 2 partitions, 200 per trigger: 9 batches
PER_TRIGGER = 200

# F26: the whole process group killed at each step of the protocol, one query per mode, a restart after each
KILLS = {
    "partition": [
        ("before the task writes", "sink.before_write:batch=1:partition=0:action=kill-group:once", "sink.before_write"),
        # rows sent, the task's transaction open: the restart's producer with the slot's id aborts it
        ("rows sent, not committed", "sink.after_write:batch=2:partition=1:action=kill-group:once", "sink.after_write"),
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
        ("before the task writes", "sink.before_write:batch=1:partition=0:action=kill-group:once", "sink.before_write"),
        ("rows staged", "sink.after_write:batch=2:partition=1:action=kill-group:once", "sink.after_write"),
        ("before the publish", "sink.commit.before_decision:batch=3:action=kill-group:once", "sink.commit.before_decision"),
        # half the batch sent in the publish's open transaction: the restart's publish fences and aborts it
        ("mid-publish", "sink.publish.mid:batch=4:k=100:action=kill-group:once", "sink.publish.mid"),
        ("published, commits/n not", "sink.after_commit:batch=5:action=kill-group:once", "sink.after_commit"),
    ],
}


@pytest.fixture
def make_pipeline(kafka_service: Any, tmp_path: Any) -> Any:
    def make(visibility: str, *, records: int = RECORDS, options: tuple[str, ...] = ()) -> Pipeline:
        name = f"ks_{visibility}_{uuid.uuid4().hex[:8]}"
        bootstrap = kafka_service.bootstrap
        create_topic(bootstrap, name, 2)
        produce_records(bootstrap, name, make_records(records, seed=len(name), prefix=f"{name}-"), partitions=2)
        return Pipeline("kafka", bootstrap, name, "", "", f"{name}-out", str(tmp_path / name), PER_TRIGGER,
                        options=(f"visibility={visibility}", *options))  # fmt: skip

    return make


def _uncommitted(pipe: Pipeline) -> int:
    """Records in the sink topic's log that read_committed readers never get (aborted transactions)."""
    every = checker.read_topic(pipe.bootstrap, pipe.table, parse_json=False)
    committed = len(every)
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": f"u-{uuid.uuid4().hex}",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False})  # fmt: skip
    try:
        total = 0
        for p in range(2):
            lo, hi = consumer.get_watermark_offsets(TopicPartition(pipe.table, p), timeout=10)
            total += hi - lo
    finally:
        consumer.close()
    return total - committed  # offsets of aborted records and of transaction markers


@pytest.mark.parametrize("visibility", ["partition", "batch"])
def test_f26_kills_at_every_step_of_the_protocol(visibility: str, make_pipeline: Any) -> None:
    pipe = make_pipeline(visibility)
    for what, spec, point in KILLS[visibility]:
        out = pipe.run(spec, state=point)
        assert out.killed, f"{what}: expected SIGKILL of the group, got {out}\n{pipe.describe()}"
        assert pipe.fired(point, action="kill-group"), f"{what}: {point} never fired\n{pipe.describe()}"
    final = pipe.run()
    assert final.returncode == 0, pipe.describe()
    report = pipe.report(min_faults=len(KILLS[visibility]))
    assert report.ok, f"{report.table()}\n{pipe.describe()}"
    assert report.info["sink_records"] == RECORDS
    # the kills inside open transactions really left aborted records in the log, which no reader got
    assert _uncommitted(pipe) > 2 * len(pipe.outcomes), "no aborted records in the sink topic's log"
