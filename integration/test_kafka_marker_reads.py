"""Issue 45, item 1: reading a ``kafka-eos`` sink's markers never kills the reading process.

librdkafka 2.16's ``AdminClient.list_consumer_group_offsets`` dereferences a null group handle when the
OffsetFetch answer carries a coordinator error (COORDINATOR_LOAD_IN_PROGRESS while ``__consumer_offsets``
loads, NOT_COORDINATOR after the coordinator moved: confluentinc/librdkafka#5040); the sink read its markers
that way, and a task, the driver's publish or survey, or the CLI died with SIGSEGV (or librdkafka's assertion,
SIGABRT) on a routine broker restart. The markers are now read by consumers of the marker groups
(``committed()``): a child process reads them in a loop, every way the product does, while a fresh embedded
Apache Kafka creates and loads its offsets topic, then while it restarts cleanly and after a SIGKILL, and
must end by itself with every failure a RetriableError.

This module's broker is plaintext, the one left so in the suite: the reader must be running before the broker
exists (its fresh start is the first window), and a principal of a secured broker can only be made once the
broker runs. What is proven is the group protocol's coordinator errors, which a SASL_SSL session meets alike;
the marker reads' ACLs are proven on the secured broker (test_security.py, the Kafka sink's declared ACLs).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.services.apache_kafka import ApacheKafka
from eos_core.kafka_config import CONFIG_ENV
from sinks.kafka.client import TxnProducer
from sinks.kafka.markers import Marker, marker_offsets, publish_name, read_marker, slot_name

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _plaintext_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toolkit's clients (EOS_KAFKA_CONFIG) leave the session broker's security settings aside here."""
    monkeypatch.delenv(CONFIG_ENV, raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_markers(bootstrap: str, sink_id: str, topic: str) -> None:
    """The publish's marker (batch 3) and two task slots' (batch 2), committed as the sink commits them."""
    conf = {"bootstrap.servers": bootstrap}
    for group, batch, mode in (
        (publish_name(sink_id), 3, "batch"),
        *((slot_name(sink_id, s), 2, "partition") for s in (0, 1)),
    ):
        producer = TxnProducer(conf, group, timeout=60, context="test")
        producer.init()
        producer.begin()
        producer.commit([(marker_offsets(topic, Marker(batch, "lin", "q", 1, "d", mode)), group)])
        producer.close()


def test_markers_are_read_while_a_fresh_broker_loads_its_offsets_and_while_it_restarts(tmp_path: Path) -> None:
    port = _free_port()
    bootstrap = f"127.0.0.1:{port}"
    sink_id, topic = f"reads-{uuid.uuid4().hex[:6]}", "markers"
    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-m", "integration.harness.marker_loop", bootstrap, sink_id, topic, str(stop)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    windows: list[tuple[str, float, float]] = []  # (what, from, to): the broker away or loading its offsets
    broker = None
    try:
        begun = time.time()
        broker = ApacheKafka(port=port, heap="256m")  # fresh: __consumer_offsets is created and loaded now
        windows.append(("fresh start", begun, time.time()))
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        _write_markers(bootstrap, sink_id, topic)
        assert read_marker({"bootstrap.servers": bootstrap}, publish_name(sink_id), topic, timeout=30).batch == 3
        time.sleep(2)  # the child reads the markers on a settled broker too
        begun = time.time()
        broker.restart()  # clean: the group coordinator moves away and loads __consumer_offsets again
        windows.append(("restart", begun, time.time()))
        first_pid = broker.pid
        begun = time.time()
        broker.crash()  # SIGKILL: no clean shutdown, the offsets topic is recovered and loaded again
        broker.start()
        windows.append(("crash and start", begun, time.time()))
        assert broker.pid != first_pid
        time.sleep(3)
    finally:
        stop.touch()
        try:
            out, _ = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
            if broker is not None:
                broker.stop()
    assert child.returncode == 0, f"the marker reader died: exit status {child.returncode} (a signal when < 0)"
    result = json.loads(out)
    assert not result["other"], result["other"]
    # the fault happened: reads failed, retriably, while the broker was away or loading, in every window
    failed = [(t, m) for t, m in result["messages"]]
    for what, start, end in windows:
        assert any(start <= t <= end + 1 for t, _ in failed), (what, result["retriable"], failed[:5])
    # and every way of reading answered, the marker as written once the broker was back
    assert set(result["answered"]) == {
        "read_marker",
        "read_marker_fresh",
        "read_slot_markers",
        "status",
        "topic_checker",
    }
    assert "batch=3" in result["last"]["read_marker"] and "batch=2" in result["last"]["read_slot_markers"]
    codes = sorted({m.split(": last ", 1)[-1].split(" ", 1)[0] for _, m in failed if ": last " in m})
    print("retriable reads:", dict(result["retriable"]), "last errors:", codes)
