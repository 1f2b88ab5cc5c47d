"""Issue 45, items 1 and 4: how the ``kafka-eos`` sink reads its markers (unit; the broker-side proof is
integration/test_kafka_marker_reads.py).

Markers are read by a consumer of the marker group (``committed()``), never by
``AdminClient.list_consumer_group_offsets`` (librdkafka#5040: a coordinator error in its answer kills the
process); a coordinator error is retried, then a RetriableError; the task slots' survey reads stable, fails on
a slot it could not read (it was dropped, the slot counted as never written), and fences every slot of an
earlier run before its first batch."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eos_core.errors import FatalError, RetriableError
from sinks.kafka import markers
from sinks.kafka.markers import Marker, publish_name, read_marker, read_slot_markers, slot_name
from sinks.kafka.options import parse_options
from sinks.kafka.plan import KafkaSinkPlan

ROOT = Path(__file__).resolve().parents[1]
CONF = {"bootstrap.servers": "127.0.0.1:9", "transaction.timeout.ms": "60000", "linger.ms": "5"}
MARKER = Marker(batch=4, lineage="L", query="q", rows=2, digest="d", mode="partition")


class FakeConsumer:
    """A marker reader: each group answers from its script (a KafkaError raised, a TopicPartition with an
    error, or a marker), the last answer again once the script is used up."""

    scripts: dict[str, list[Any]] = {}
    made: list[dict[str, Any]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.group = conf["group.id"]
        FakeConsumer.made.append(conf)

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[Any]:
        script = FakeConsumer.scripts[self.group]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, KafkaError) and answer.code() < 0 and answer.code() != KafkaError._TIMED_OUT:
            raise KafkaException(answer)  # librdkafka's own errors come raised
        if isinstance(answer, KafkaError):  # the broker's come on the partition
            return [SimpleNamespace(offset=-1001, metadata=None, error=answer)]
        if answer is None:
            return [SimpleNamespace(offset=-1001, metadata=None, error=None)]
        return [SimpleNamespace(offset=answer.batch + 1, metadata=answer.metadata(), error=None)]

    def poll(self, timeout: float) -> None:
        return None  # no event: a refused group is scripted as a committed() answer

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fake_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(markers.kafka_clients, "consumer", lambda conf, watch: FakeConsumer(conf))
    monkeypatch.setattr(markers, "_READERS", type(markers._READERS)())
    monkeypatch.setattr(markers.time, "sleep", lambda s: None)
    FakeConsumer.scripts, FakeConsumer.made = {}, []


def _raised(code: int) -> KafkaError:
    return KafkaError(code, "from the fake")


def test_no_module_of_the_wheel_reads_group_offsets_with_the_admin_client() -> None:
    """librdkafka#5040: list_consumer_group_offsets dies on a coordinator error in its answer."""
    calls = []
    for top in ("connectors", "sinks", "sources", "eos_core"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "list_consumer_group_offsets":
                    calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not calls, calls


def test_a_marker_is_read_by_a_consumer_of_its_group_stable_or_not() -> None:
    group = publish_name("orders")
    FakeConsumer.scripts[group] = [MARKER]
    assert read_marker(CONF, group, "out", timeout=5) == MARKER
    assert read_marker(CONF, group, "out", timeout=5, stable=False) == MARKER
    stable, last = FakeConsumer.made
    assert stable["group.id"] == group and stable["isolation.level"] == "read_committed"  # stable offsets
    assert last["isolation.level"] == "read_uncommitted"
    assert stable["enable.auto.commit"] == "false" and "transaction.timeout.ms" not in stable  # no producer setting
    assert "linger.ms" not in stable
    read_marker(CONF, group, "out", timeout=5)
    assert len(FakeConsumer.made) == 2  # the process keeps its readers: the second stable read made none


@pytest.mark.parametrize(
    "code",
    [KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR, KafkaError._TIMED_OUT, KafkaError._TRANSPORT],
)
def test_a_coordinator_error_is_retried_then_the_marker_is_read(code: int) -> None:
    group = slot_name("orders", 3)
    FakeConsumer.scripts[group] = [_raised(code), _raised(code), MARKER]
    assert read_marker(CONF, group, "out", timeout=5) == MARKER


def test_a_coordinator_error_that_lasts_is_a_retriable_error_naming_it() -> None:
    group = slot_name("orders", 3)
    FakeConsumer.scripts[group] = [_raised(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)]
    with pytest.raises(RetriableError, match=r"consumer group 'spark-eos:orders:task:3'.*COORDINATOR_LOAD_IN_PROGRESS"):
        read_marker(CONF, group, "out", timeout=0.3)


def test_a_refused_read_is_fatal_and_says_what_to_grant() -> None:
    group = publish_name("orders")
    FakeConsumer.scripts[group] = [_raised(KafkaError.GROUP_AUTHORIZATION_FAILED)]
    with pytest.raises(
        FatalError,
        match=r"GROUP_AUTHORIZATION_FAILED.*lacks READ on group prefix 'spark-eos:orders:'.*--resource-pattern-type prefixed",
    ):
        read_marker(CONF, group, "out", timeout=5)


def _admin(groups: list[str]) -> Any:
    listed = SimpleNamespace(valid=[SimpleNamespace(group_id=g) for g in groups], errors=[])
    return SimpleNamespace(list_consumer_groups=lambda request_timeout: SimpleNamespace(result=lambda t: listed))


def test_the_slot_survey_reads_stable_and_fails_on_a_slot_it_could_not_read() -> None:
    """Item 4: a partition-level error of one slot was dropped (the slot counted as never written)."""
    groups = [slot_name("orders", s) for s in (0, 1, 2)] + ["spark-eos:orders:publish", "other"]
    FakeConsumer.scripts = {groups[0]: [MARKER], groups[1]: [None], groups[2]: [MARKER]}
    assert read_slot_markers(_admin(groups), CONF, "orders", "out", timeout=5) == {0: MARKER, 2: MARKER}
    assert {c["isolation.level"] for c in FakeConsumer.made} == {"read_committed"}
    FakeConsumer.scripts[groups[2]] = [_raised(KafkaError.UNSTABLE_OFFSET_COMMIT)]  # a transaction holds it
    with pytest.raises(RetriableError, match="task:2"):
        read_slot_markers(_admin(groups), CONF, "orders", "out", timeout=0.3)


def test_the_first_survey_of_a_driver_fences_every_slot_of_an_earlier_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 4: a crashed driver's task of slot 5 may hold its transaction open; a replay with 2 tasks runs no
    slot 5 to fence it. The driver's first survey fences every slot the sink has; later ones fence none."""
    from sinks.kafka import spark

    fenced: list[list[str]] = []
    slots = {s: slot_name("orders", s) for s in (0, 1, 5)}
    monkeypatch.setattr(spark, "fence", lambda conf, names, timeout, context: fenced.append(names))
    monkeypatch.setattr(spark, "slot_groups", lambda admin, sink_id, timeout: slots)
    monkeypatch.setattr(spark, "read_slot_markers", lambda admin, conf, sink_id, topic, timeout: {})
    monkeypatch.setattr(spark, "KafkaLookups", lambda *a, **k: SimpleNamespace(admin=None, close=lambda: None))
    monkeypatch.setattr(spark, "_FENCED", set())
    raw = {"kafka.bootstrap.servers": "b:9", "sink.id": "orders", "topic": "out", "checkpointLocation": "/tmp/ck"}
    raw["visibility"] = "partition"
    plan = KafkaSinkPlan(parse_options(raw, streaming=True), ("value",), "L", "text", "q-1", "nonce", batch=7)
    assert spark._survey(plan).written == ()
    assert fenced == [sorted(slots.values())]
    spark._survey(dataclasses.replace(plan, batch=8))
    assert fenced == [sorted(slots.values())]  # once per driver process and query
