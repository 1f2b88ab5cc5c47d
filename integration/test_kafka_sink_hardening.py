"""Issue 45, items 2, 3, 5, 6: the ``kafka-eos`` sink's task and driver code driven directly (no Spark: a
batch job's ``write_task`` and ``commit_batch``, as Spark's writer calls them) against an embedded Apache Kafka
of this module, whose broker aborts a timed-out transaction within half a second.

- 2: rows ``errors.tolerance=all`` could not divert: a ``topic`` column naming an internal topic went through the
  screen and the broker refused every produce; a compacted ``errors.topic`` refuses a keyless dead letter.
- 3: the warm producer's proof started the transaction's clock at the task's start, not at its first row.
- 5: a warm producer whose ``begin()`` failed stayed cached; a ``LineageMismatch`` after the proof left the
  proof's transaction open.
- 6: ``visibility=batch`` dropped a row's own header named ``spark-eos.stage``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from connectors.toolkit.checker import read_topic, read_topic_settled
from eos_core.errors import ConfigError, RetriableError
from integration.fixtures.kafka import module_broker, module_principal
from integration.fixtures.services import AppKafka
from sinks.kafka import LineageMismatch, client, markers
from sinks.kafka.committer import commit_batch
from sinks.kafka.markers import read_marker, slot_name
from sinks.kafka.options import parse_options
from sinks.kafka.plan import KafkaSinkPlan, build_plan
from sinks.kafka.privileges import ROW_TOPICS, sink_acls
from sinks.kafka.spark import check_services
from sinks.kafka.writer import write_task

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("own_broker")]

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("headers", HEADERS),
    ]
)
ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppKafka]:
    """The module's broker; each plan runs as an app principal granted exactly what the sink declares for it."""
    kafka = module_broker(heap="256m", config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})
    try:
        principal, _ = module_principal(kafka, "hardening", tmp_path_factory.mktemp("hardening-app"))
        yield AppKafka(kafka, principal)
    finally:
        kafka.stop()


@pytest.fixture(autouse=True)
def _cold_workers() -> Iterator[None]:
    """Each test starts as a new Python worker: no producer kept from another test."""
    client._WARM.clear()
    yield
    for producer in list(client._WARM.values()):
        client.forget(producer)
    for reader in list(markers._READERS.values()):
        markers._forget_reader(reader)


def _topics(broker: AppKafka, *names: str, config: dict[str, str] | None = None) -> None:
    admin = AdminClient(broker.admin_config())
    for future in admin.create_topics([NewTopic(n, 1, 1, config=config or {}) for n in names]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while not all(n in admin.list_topics(timeout=10).topics for n in names):
        assert time.monotonic() < deadline, names
        time.sleep(0.1)


def _plan(broker: AppKafka, batch: int, rows: tuple[str, ...] = (), **options: str) -> KafkaSinkPlan:
    """The plan of a write with ``options``, its principal granted what the sink declares for them; ``rows``: the
    topics the rows name (without option ``topic``), granted each what the declaration asks of such a topic."""
    raw = {**broker.app_options, "batch.id": str(batch), "kafkaProducer.timeoutMs": "15000"}
    opts = parse_options({**raw, **options}, streaming=False)
    declared = sink_acls(opts)
    named = [dataclasses.replace(a, name=t) for a in declared if a.name == ROW_TOPICS for t in rows]
    broker.grant_acls([a for a in declared if a.name != ROW_TOPICS] + named)
    return KafkaSinkPlan(**{**build_plan(opts, SCHEMA).__dict__, "overrides": check_services(opts)})


def _rows(*rows: dict[str, Any], delay: float = 0.0) -> Iterator[pa.RecordBatch]:
    time.sleep(delay)  # the query's work before its first row
    yield pa.RecordBatch.from_pylist([{"key": None, "topic": None, "headers": None, **r} for r in rows], schema=ARROW)


def _name() -> str:
    return f"h-{uuid.uuid4().hex[:8]}"


# ---- 2: rows errors.tolerance=all could not divert ----------------------------------------------------------


def test_a_compacted_errors_topic_is_refused_at_start(broker: AppKafka) -> None:
    out, dead = _name(), _name()
    _topics(broker, out)
    _topics(broker, dead, config={"cleanup.policy": "compact"})
    with pytest.raises(ConfigError, match=r"errors.topic .* is compacted.*cleanup.policy=delete") as e:
        _plan(broker, 1, topic=out, **{"sink.id": _name(), "errors.tolerance": "all", "errors.topic": dead})
    assert e.value.option == "errors.topic"


def test_an_internal_topic_is_refused_as_the_topic_option_and_diverted_as_a_rows_topic(broker: AppKafka) -> None:
    out, dead = _name(), _name()
    _topics(broker, out, dead)
    with pytest.raises(ConfigError, match="internal to Kafka") as e:
        _plan(broker, 1, topic="__consumer_offsets", **{"sink.id": _name()})
    assert e.value.option == "topic"
    options = {"sink.id": _name(), "marker.topic": out, "visibility": "partition"}
    # no ACL on the internal topics: the principal may not even describe them, and their rows are still diverted
    # (their names are known; a metadata look-up would be refused)
    plan = _plan(broker, 1, (out,), **options, **{"errors.tolerance": "all", "errors.topic": dead})
    rows = _rows(
        {"value": b"good", "topic": out},
        {"value": b"internal", "topic": "__consumer_offsets"},
        {"value": b"internal too", "topic": "__transaction_state"},
    )
    message = write_task(plan, rows)
    assert message.diverted == 2 and message.rows == 3
    assert [r["value"] for r in read_topic_settled(broker.bootstrap, out, 1, parse_json=False)] == [b"good"]
    letters = read_topic(broker.bootstrap, dead, parse_json=False)
    assert [r["value"] for r in letters] == [b"internal", b"internal too"]
    reasons = [dict(r["headers"])["eos.error.reason"].decode() for r in letters]
    assert all("is internal to Kafka" in why for why in reasons), reasons


# ---- 3: the warm producer's transaction begins at the first row ---------------------------------------------


def test_a_warm_producers_transaction_begins_at_the_first_row(broker: AppKafka) -> None:
    """kafka.transaction.timeout.ms 4 s and 7 s of the query's work before the first row: the warm producer
    (kept from the slot's last task) must not have started the broker's clock at the task's start."""
    out = _name()
    _topics(broker, out)
    options = {"sink.id": _name(), "topic": out, "visibility": "partition", "kafka.transaction.timeout.ms": "4000"}
    write_task(_plan(broker, 1, **options), _rows({"value": b"one"}))
    (kept,) = client._WARM.values()
    begun = time.monotonic()
    message = write_task(_plan(broker, 2, **options), _rows({"value": b"two"}, delay=7.0))
    assert time.monotonic() - begun >= 7.0 and message.rows == 1 and not message.skipped
    assert list(client._WARM.values()) == [kept]  # the warm producer wrote it: its proof held, no new producer
    assert [r["value"] for r in read_topic_settled(broker.bootstrap, out, 2, parse_json=False)] == [b"one", b"two"]


# ---- 5: the warm producer's edge paths ----------------------------------------------------------------------


def test_a_warm_producer_whose_begin_failed_is_not_kept(broker: AppKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _name()
    _topics(broker, out)
    options = {"sink.id": _name(), "topic": out, "visibility": "partition"}
    write_task(_plan(broker, 1, **options), _rows({"value": b"one"}))
    (kept,) = client._WARM.values()
    failed: list[object] = []
    real_begin = client.TxnProducer.begin

    def begin(self: client.TxnProducer) -> None:
        if self is kept:
            failed.append(self)
            raise RetriableError("begin_transaction failed (injected)")
        real_begin(self)

    monkeypatch.setattr(client.TxnProducer, "begin", begin)
    message = write_task(_plan(broker, 2, **options), _rows({"value": b"two"}))  # a new producer takes over
    assert failed == [kept] and message.rows == 1
    assert kept not in client._WARM.values() and len(client._WARM) == 1
    assert [r["value"] for r in read_topic_settled(broker.bootstrap, out, 2, parse_json=False)] == [b"one", b"two"]


def test_a_lineage_mismatch_leaves_no_transaction_open(broker: AppKafka) -> None:
    """Batch 5 written, then a batch job re-run with batch.id 3 (lower: refused, K1). The warm producer's proof
    must not hold the slot's marker in a transaction left open until kafka.transaction.timeout.ms."""
    out, sink = _name(), _name()
    _topics(broker, out)
    options = {"sink.id": sink, "topic": out, "visibility": "partition"}
    write_task(_plan(broker, 5, **options), _rows({"value": b"five"}))
    assert len(client._WARM) == 1
    with pytest.raises(LineageMismatch, match="the query went back"):
        write_task(_plan(broker, 3, **options), _rows({"value": b"three"}))
    conf = broker.admin_config()
    found = read_marker(conf, slot_name(sink, 0), out, timeout=3.0, stable=True)  # no open transaction holds it
    assert found is not None and found.batch == 5


# ---- 6: a row's own header named like the sink's staging header ---------------------------------------------


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_a_rows_header_named_like_the_staging_header_is_kept(broker: AppKafka, visibility: str) -> None:
    out = _name()
    _topics(broker, out)
    plan = _plan(broker, 1, topic=out, visibility=visibility, **{"sink.id": _name(), "staging.topic": _name()})
    mine = [("spark-eos.stage", b"the user's own"), ("other", b"x")]
    message = write_task(plan, _rows({"value": b"v", "headers": [{"key": k, "value": v} for k, v in mine]}))
    commit_batch(plan, [message], 1)
    (record,) = read_topic_settled(broker.bootstrap, out, 1, parse_json=False)
    assert record["headers"] == mine
