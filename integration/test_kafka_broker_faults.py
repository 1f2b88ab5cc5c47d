"""Broker faults on Apache Kafka, rows F20-F25 of the crash matrix (docs/guarantees.md).

The broker is a module-scoped embedded Apache Kafka of these tests alone (``ApacheKafka``, never tansu),
with settings small enough that retention and the log cleaner act within a second, so crashing it or
deleting its segments disturbs no other test. It is secured as the session's is (SASL_SSL, ACLs enforced):
the tests set up and check as its admin, each pipeline runs as a principal holding exactly the ACLs the
kafka-eos source declares for it (READ on its topic; ``Pipeline.kafka_acls``). Each pipeline is the crash matrix's runner (``kafka-eos``
-> JSON parse -> ``postgres-2pc``) in its own process group; each test proves that its fault really
happened (the broker JVM's SIGKILL exit status, records of aborted transactions and markers in the
log, the log start offset past the query's position, the cleaner's gaps, the new partitions) and ends
with the exact checker (``pipe.report()``, ``checker.verify``): no duplicate, no loss, no phantom, no
changed payload, no prepared transaction left, the sink's last decision = Spark's last ``commits/n``.
Where the fault itself destroys input (F22, F24) the test says exactly which records the checker must
find missing or extra, and checks the sink record for record against that.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from connectors.services.apache_kafka import ApacheKafka
from connectors.toolkit import checker
from connectors.toolkit.chaos import make_records
from connectors.toolkit.harness import PipelineProcess, descendants, process_state, wait_until
from eos_core.kafka_config import client_settings
from integration.fixtures.kafka import module_broker, module_principal
from integration.harness.matrix import Pipeline, pipeline_maker
from sources.kafka.offsets import TopicPartition as OffsetsTP
from sources.kafka.offsets import batch_start

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.usefixtures("own_broker")]

BROKER_CONFIG = {
    "log.retention.check.interval.ms": "500",  # F22: retention deletes segments within a second ...
    "log.initial.task.delay.ms": "0",  # ... also in the broker's first 30 s
    "log.segment.delete.delay.ms": "0",  # a deleted segment's records are gone at once
    "log.cleaner.backoff.ms": "200",  # F23: the log cleaner looks for work 5 times a second
    "log.cleaner.dedupe.buffer.size": str(8 << 20),  # a small heap
}
LOSS_WORDS = ("are gone", "went back", "is gone", "data may have been lost", "failOnDataLoss=false")


@pytest.fixture(scope="module")
def broker() -> Iterator[ApacheKafka]:
    kafka = module_broker(config=BROKER_CONFIG, heap="256m")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(autouse=True)
def _broker_running(broker: ApacheKafka) -> None:
    """A test that crashed the broker and failed before starting it again leaves it to the next one."""
    if not broker.running():
        broker.start()


@pytest.fixture(scope="module")
def app(broker: ApacheKafka, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str | None]:
    """The pipelines' principal: READ on each pipeline's topic, what the kafka-eos source declares, nothing else."""
    return module_principal(broker, "bf", tmp_path_factory.mktemp("bf-app"))


@pytest.fixture
def make_pipeline(broker: ApacheKafka, app: tuple[Any, str | None], postgres_service: Any, tmp_path: Any) -> Any:
    return pipeline_maker(broker, app, postgres_service.dsn, tmp_path, "bf")


# ---- Kafka helpers --------------------------------------------------------------------------------


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **client_settings()})


def _create_topic(bootstrap: str, topic: str, partitions: int, config: Mapping[str, str] | None = None) -> None:
    admin = _admin(bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1, config=dict(config or {}))])[topic].result(30)
    wait_until(
        lambda: _partition_count(admin, topic) == partitions, timeout=30, what=f"{topic} with {partitions} partitions"
    )


def _partition_count(admin: AdminClient, topic: str) -> int:
    t = admin.list_topics(topic, timeout=10).topics.get(topic)
    if t is None or t.error is not None or any(p.leader < 0 for p in t.partitions.values()):
        return -1
    return len(t.partitions)


def _part(record: Mapping[str, Any], partitions: int) -> int:
    return zlib.crc32(str(record["id"]).encode()) % partitions


def _send(
    producer: Producer,
    topic: str,
    records: Sequence[Mapping[str, Any]],
    partitions: int | None = None,
    *,
    partition: int | None = None,
    timestamp: int | None = None,
) -> None:
    """JSON values keyed by the record's ``key``, to ``partition`` or spread over ``partitions`` by id."""
    for rec in records:
        p = partition if partition is not None else _part(rec, partitions or 1)
        extra = {"timestamp": timestamp} if timestamp is not None else {}
        producer.produce(
            topic,
            value=json.dumps(dict(rec), sort_keys=True).encode(),
            key=str(rec["key"]).encode(),
            partition=p,
            **extra,
        )
        producer.poll(0)


def _produce(
    bootstrap: str,
    topic: str,
    records: Sequence[Mapping[str, Any]],
    partitions: int | None = None,
    *,
    partition: int | None = None,
    timestamp: int | None = None,
    **conf: Any,
) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, **client_settings(), "linger.ms": 5, "enable.idempotence": True, **conf}
    )
    _send(producer, topic, records, partitions, partition=partition, timestamp=timestamp)
    assert producer.flush(60) == 0, f"records to {topic} not delivered in 60 s"


def _log_records(bootstrap: str, topic: str, isolation: str) -> list[tuple[int, int, dict[str, Any]]]:
    """(partition, offset, value) of every record a plain consumer with ``isolation`` gets, to each partition's end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **client_settings(),
            "group.id": f"bf-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, -2) for p in parts])  # -2: each partition's earliest offset
        out: list[tuple[int, int, dict[str, Any]]] = []
        done: set[int] = set()
        deadline = time.monotonic() + 60
        while len(done) < len(parts):
            assert time.monotonic() < deadline, f"reading {topic}: partitions {sorted(set(parts) - done)} never ended"
            for m in c.consume(500, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        done.add(int(m.partition() or 0))
                    continue
                out.append((int(m.partition() or 0), int(m.offset() or 0), json.loads(m.value() or b"null")))
        return out
    finally:
        c.close()


def _marks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's (log start offset, high watermark): every offset the log has, markers and aborted too."""
    c = Consumer({"bootstrap.servers": bootstrap, **client_settings(), "group.id": f"bf-{uuid.uuid4().hex[:8]}"})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) for p in parts}
    finally:
        c.close()


def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's last stable offset: where a read_committed reader (the query) ends."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **client_settings(),
            "group.id": f"bf-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
        }
    )
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts}
    finally:
        c.close()


# ---- checkpoint, sink and log helpers -------------------------------------------------------------


def _planned(checkpoint: str, topic: str) -> dict[int, dict[int, int]]:
    """Batch n -> {partition: end offset} from each ``offsets/n`` Spark wrote."""
    out: dict[int, dict[int, int]] = {}
    folder = os.path.join(checkpoint, "offsets")
    for name in os.listdir(folder):
        if name.isdigit():
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                ends = json.loads(fh.read().splitlines()[-1]).get(topic, {})
            out[int(name)] = {int(p): int(o) for p, o in ends.items()}
    return dict(sorted(out.items()))


def _ranges_with_gaps(
    planned: Mapping[int, Mapping[int, int]], present: set[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """(partition, start, end) of each planned batch range that holds offsets with no record in ``present``
    (aborted records, transaction markers, compacted records). Batch 0 starts at offset 0 (earliest)."""
    out = []
    start: dict[int, int] = {}
    for ends in planned.values():
        for p, e in ends.items():
            s = start.get(p, 0)
            if s < e and sum(1 for o in range(s, e) if (p, o) in present) < e - s:
                out.append((p, s, e))
        start = dict(ends)
    return out


def _rows(pipe: Pipeline) -> list[dict[str, Any]]:
    with psycopg.connect(pipe.check_dsn, autocommit=True) as conn:
        return checker.read_table(conn, pipe.table)


def _count(pipe: Pipeline) -> int:
    with psycopg.connect(pipe.check_dsn, autocommit=True) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {pipe.table}").fetchone()[0])


def _log_from(pipe: Pipeline, offset: int) -> str:
    with open(pipe.log_path, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def _log_size(pipe: Pipeline) -> int:
    return os.path.getsize(pipe.log_path) if os.path.exists(pipe.log_path) else 0


def _drained(pipe: Pipeline, proc: PipelineProcess, rows: int, timeout: float = 240) -> None:
    """Wait until a running query (processing-time trigger) has committed ``rows`` rows and read to the end of
    the topic (its last stable offsets), and plans nothing more: stopping it (SIGKILL) leaves no batch in flight."""

    def idle() -> bool:
        last = checker.last_commit(pipe.checkpoint)
        if last is None or last != checker.last_offsets(pipe.checkpoint) or _count(pipe) != rows:
            return False
        return _planned(pipe.checkpoint, pipe.topic)[last] == _ends(pipe.bootstrap, pipe.topic)

    wait_until(idle, timeout=timeout, what=f"{rows} rows in {pipe.table}, the topic read", alive=proc.alive)
    time.sleep(2)  # two more triggers: they find nothing new
    assert idle(), f"the query went on planning after {rows} rows\n{pipe.describe()}"


def _sink_state(pipe: Pipeline) -> tuple[int, int | None, list[str], int | None]:
    """(rows, Spark's last commits/n, prepared gids of the sink, the sink's last decided batch)."""
    with psycopg.connect(pipe.check_dsn, autocommit=True) as conn:
        rows = int(conn.execute(f"SELECT count(*) FROM {pipe.table}").fetchone()[0])
        prepared = checker.prepared_gids(conn, pipe.sink_id)
        decided = checker.last_decided_batch(conn, pipe.sink_id)
    return rows, checker.last_commit(pipe.checkpoint), prepared, decided


def _assert_ok(report: checker.Report, pipe: Pipeline) -> None:
    assert report.ok, f"{report.table()}\n{pipe.describe()}"


# ---------------------------------------------------------------------------------------------------
# F20: the broker SIGKILLed while a read task is in the middle of its range, restarted on the same log dir


def test_f20_broker_sigkilled_mid_batch_and_restarted(broker: ApacheKafka, make_pipeline: Any) -> None:
    pipe = make_pipeline("f20", max_offsets=100)
    _create_topic(broker.bootstrap, pipe.topic, 2)
    records = make_records(400, seed=20, prefix=f"{pipe.table}-")
    _produce(broker.bootstrap, pipe.topic, records, 2)
    # 4 batches. Each read task of batch 1 is held for 2 s as it starts (before it fetches anything: librdkafka
    # prefetches a small range whole at once, so a kill after the first fetch would miss the read), and
    # the kill lands then; the sink's after_write point logs when each task had read and written its range
    spec = "source.read.start:batch=1:action=sleep:seconds=2;sink.after_write:batch=1:action=sleep:seconds=0"
    proc = pipe.process(spec, state="F20").start()
    try:
        wait_until(
            lambda: pipe.fired("source.read.start", batch=1), timeout=300, what="batch 1's read tasks", alive=proc.alive
        )
        before = checker.last_commit(pipe.checkpoint)
        jvm, log_dir = broker.proc, broker.log_dir
        assert jvm is not None
        broker.crash()
        assert jvm.returncode == -signal.SIGKILL, f"the broker JVM ended with {jvm.returncode}, not by SIGKILL"
        killed_at = time.time()
        time.sleep(6)  # the read tasks wake up to a dead broker and wait for it
        restarted_at = time.time()
        broker.start()  # same log dir and ports
        assert broker.proc is not None and broker.proc.pid != jvm.pid and broker.log_dir == log_dir
        out = proc.wait(400)
    finally:
        proc.stop()
    pipe.outcomes.append(out)
    # the query did not fail: the read tasks waited for the broker (pollTimeoutMs) and went on
    assert out.returncode == 0, f"the query failed across a broker restart\n{pipe.describe()}"
    # the kill landed mid-batch: batch 1's read tasks had started when it came, and each had read and written
    # its range only after the broker was started again (the records came from the restarted broker)
    starts = pipe.fired("source.read.start", batch=1)
    writes = pipe.fired("sink.after_write", batch=1)
    assert starts and min(float(e["time"]) for e in starts) < killed_at, starts
    assert len(writes) == 2 and all(float(e["time"]) > restarted_at for e in writes), (restarted_at, writes)
    after = checker.last_commit(pipe.checkpoint)
    assert after is not None and (before is None or before < after) and after >= 3, (before, after)
    report = pipe.report()
    _assert_ok(report, pipe)  # every record produced before the crash is in the sink once
    assert report.info["source_records"] == len(records) == report.info["sink_rows"]


# ---------------------------------------------------------------------------------------------------
# F21: the broker restarted while a producer's transaction is open; aborted and committed ones mixed


def test_f21_broker_restarted_with_a_transaction_open(broker: ApacheKafka, make_pipeline: Any) -> None:
    pipe = make_pipeline("f21", max_offsets=40)  # small batches: their ends fall on aborted records and markers
    bootstrap, topic = broker.bootstrap, pipe.topic
    _create_topic(bootstrap, topic, 2)

    def recs(kind: str, n: int, seed: int) -> list[dict[str, Any]]:
        return make_records(n, seed=seed, prefix=f"{pipe.table}-{kind}{seed}-")

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **client_settings(),
            "transactional.id": f"{pipe.table}-tx",
            "linger.ms": 5,
            "transaction.timeout.ms": 60000,
            "log_level": 0,
        }
    )  # quiet across the crash
    producer.init_transactions(30)
    txns: list[tuple[str, list[dict[str, Any]]]] = []

    def transaction(records: list[dict[str, Any]], outcome: str) -> None:
        producer.begin_transaction()
        _send(producer, topic, records, 2)
        if outcome == "commit":
            producer.commit_transaction(30)
        elif outcome == "abort":
            producer.flush(30)  # the aborted records are in the log, then the abort marker
            producer.abort_transaction(30)
        txns.append((outcome, records))

    transaction(recs("c", 60, 1), "commit")
    transaction(recs("a", 30, 2), "abort")
    proc = pipe.process(state="F21", trigger="processing:1").start()
    try:
        _drained(pipe, proc, 60)  # the running query has read past an aborted transaction and its marker
        open_records = recs("o", 40, 3)
        producer.begin_transaction()
        _send(producer, topic, open_records, 2)
        assert producer.flush(30) == 0  # in the log, not committed: the last stable offset stops before them
        jvm = broker.proc
        assert jvm is not None
        broker.crash()  # with the transaction open and the query running
        assert jvm.returncode == -signal.SIGKILL, jvm.returncode
        broker.start()
        producer.commit_transaction(60)  # the open transaction survived the restart
        txns.append(("commit", open_records))
        transaction(recs("a", 20, 4), "abort")
        transaction(recs("c", 60, 5), "commit")
        committed = [r for outcome, rs in txns if outcome == "commit" for r in rs]
        _drained(pipe, proc, len(committed))
    finally:
        out = proc.stop()
    pipe.outcomes.append(out)
    assert out.killed, f"the query must have run until we stopped it (it did not fail)\n{pipe.describe()}"
    aborted = [r for outcome, rs in txns if outcome == "abort" for r in rs]

    # the aborted records are in the log: a read_uncommitted reader sees them, and the high watermark of each
    # partition counts every record and one marker per transaction that wrote to it
    everything = _log_records(bootstrap, topic, "read_uncommitted")
    assert sorted(v["id"] for _, _, v in everything) == sorted(r["id"] for _, rs in txns for r in rs)
    marks = _marks(bootstrap, topic)
    for p, (low, high) in marks.items():
        records_in_p = sum(1 for r in (*committed, *aborted) if _part(r, 2) == p)
        markers_in_p = sum(1 for _, rs in txns if any(_part(r, 2) == p for r in rs))
        assert (low, high) == (0, records_in_p + markers_in_p), (p, low, high, records_in_p, markers_in_p)
    # ... and batches really spanned them: some planned range holds offsets that are no committed record
    kept = {(p, o) for p, o, _ in _log_records(bootstrap, topic, "read_committed")}
    gaps = _ranges_with_gaps(_planned(pipe.checkpoint, topic), kept)
    assert gaps, f"no batch range held an aborted record or a marker: {_planned(pipe.checkpoint, topic)}"
    log = _log_from(pipe, 0)
    assert not [w for w in LOSS_WORDS if w in log], "markers or aborted offsets were reported as data loss"

    report = pipe.report()
    _assert_ok(report, pipe)  # read_committed: exactly the committed records, each once; nothing aborted
    assert report.info["source_records"] == len(committed) == report.info["sink_rows"] == 160


# ---------------------------------------------------------------------------------------------------
# F22: retention deletes segments past the position of a stopped query


def test_f22_retention_deletes_records_a_stopped_query_has_not_read(broker: ApacheKafka, make_pipeline: Any) -> None:
    pipe = make_pipeline("f22", max_offsets=400)
    bootstrap, topic = broker.bootstrap, pipe.topic
    # segment.ms: a record an hour newer than its segment's first one starts a new segment
    _create_topic(bootstrap, topic, 2, {"segment.ms": "60000"})
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000

    def recs(tag: str, n: int) -> list[dict[str, Any]]:
        return make_records(n, seed=22, prefix=f"{pipe.table}-{tag}-")

    read_0, lost_0, kept_0 = recs("p0read", 50), recs("p0lost", 50), recs("p0kept", 50)
    read_1, more_1 = recs("p1read", 50), recs("p1more", 50)
    # partition 0: records stamped two hours ago, of which the query reads the first 50 ...
    _produce(bootstrap, topic, read_0, partition=0, timestamp=two_hours_ago)
    _produce(bootstrap, topic, read_1, partition=1)  # partition 1: records of now, never deleted
    first = pipe.run()
    assert first.returncode == 0, pipe.describe()
    last = checker.last_commit(pipe.checkpoint)
    assert last is not None
    position = _planned(pipe.checkpoint, topic)[last]
    assert position == {0: 50, 1: 50}, position
    # ... then, with the query stopped, 50 more of two hours ago and 50 of now (the first of these rolls a segment)
    _produce(bootstrap, topic, lost_0, partition=0, timestamp=two_hours_ago)
    _produce(bootstrap, topic, kept_0, partition=0)
    _produce(bootstrap, topic, more_1, partition=1)
    assert _marks(bootstrap, topic) == {0: (0, 150), 1: (0, 100)}
    # retention of one hour: the segment of partition 0 with the old records goes, offsets 0-99 (real retention:
    # the broker deletes whole segments older than retention.ms; no DeleteRecords)
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin = _admin(bootstrap)  # kept: the futures fail if their client is gone
    next(iter(admin.incremental_alter_configs([resource]).values())).result(30)
    wait_until(lambda: _marks(bootstrap, topic)[0][0] > 0, timeout=60, what="retention to delete a segment")
    marks = _marks(bootstrap, topic)
    assert marks == {0: (100, 150), 1: (0, 100)}, marks
    assert marks[0][0] > position[0]  # the log start moved past the query's position: offsets 50-99 are gone
    before = _sink_state(pipe)
    assert before == (100, last, [], last), before

    # failOnDataLoss=true: the query stops, naming topic, partition and offsets; sink and checkpoint unchanged
    out = pipe.run()
    assert out.returncode == 2, pipe.describe()
    assert "RUNNER FAILED" in out.log_tail
    assert f"records 50..99 of {topic}-0 are gone (earliest offset is now 100)" in out.log_tail, out.log_tail
    assert "set failOnDataLoss=false to skip it" in out.log_tail
    assert _sink_state(pipe) == before

    # failOnDataLoss=false: the documented skip, counted in the log; the rest is read exactly once
    size = _log_size(pipe)
    out = pipe.run(fail_on_data_loss="false")
    assert out.returncode == 0, pipe.describe()
    log = _log_from(pipe, size)
    skip = f"skipped 50 offset(s) of {topic}-0, [50, 100) (failOnDataLoss=false)"
    assert log.count(skip) >= 1 and "skipped" not in log.replace(skip, ""), log[-3000:]
    rows = _rows(pipe)
    assert sorted((r["src_partition"], r["src_offset"]) for r in rows) == sorted(
        [(0, o) for o in (*range(50), *range(100, 150))] + [(1, o) for o in range(100)]
    )

    report = pipe.report()
    # the checker reads the topic as it is now: the 50 records the query read before retention deleted them
    # are in the sink and no longer in the topic (phantoms to it); every check but that one holds
    assert [c.name for c in report.failures] == ["records.phantoms"], report.table()
    phantoms = report.get("records.phantoms")
    assert phantoms.counts["phantoms"] == 50 and set(phantoms.ids["phantoms"]) <= {r["id"] for r in read_0}
    assert report.info["source_records"] == 150 and report.info["sink_rows"] == 200
    # record for record: the sink holds what was read before the deletion and what retention left, once each
    expected = [*read_0, *kept_0, *read_1, *more_1]
    checks = checker.compare_records(expected, rows, payload_fields=("key", "amount"))
    assert all(c.ok for c in checks), [c.summary for c in checks]


# ---------------------------------------------------------------------------------------------------
# F25: records deleted between the plan of a query's first batch (startingOffsets=earliest) and its replay


def test_f25_records_deleted_before_the_first_batch_is_replayed_are_data_loss(
    broker: ApacheKafka, make_pipeline: Any
) -> None:
    pipe = make_pipeline("f25", max_offsets=400)
    bootstrap, topic = broker.bootstrap, pipe.topic
    _create_topic(bootstrap, topic, 1)
    records = make_records(60, seed=25, prefix=f"{pipe.table}-")
    _produce(bootstrap, topic, records, partition=0)
    # the whole group dies as the first data batch starts reading: offsets/n written, nothing decided
    out = pipe.run("source.read.start:action=kill-group:once", state="F25")
    assert out.killed and pipe.fired("source.read.start", action="kill-group"), pipe.describe()
    planned = _planned(pipe.checkpoint, topic)
    assert planned == {0: {0: 60}}, planned  # batch 0 reads [0, 60) ...
    with open(os.path.join(pipe.checkpoint, "offsets", "0"), encoding="utf-8") as fh:
        assert batch_start(fh.read().splitlines()[-1]) == {OffsetsTP(topic, 0): 0}  # ... from the start it recorded
    before = _sink_state(pipe)
    assert before[:3] == (0, None, []), before
    # the oldest 20 records go (DeleteRecords, as retention would) before the batch is replayed
    admin = _admin(bootstrap)  # kept: the futures fail if their client is gone
    admin.delete_records([TopicPartition(topic, 0, 20)])[TopicPartition(topic, 0, 20)].result(30)
    assert _marks(bootstrap, topic) == {0: (20, 60)}

    # failOnDataLoss=true: the replay asks for 0..59 and stops, naming them; nothing written or moved
    out = pipe.run()
    assert out.returncode == 2, pipe.describe()
    assert f"records 0..19 of {topic}-0 are gone (earliest offset is now 20)" in out.log_tail, out.log_tail
    assert _sink_state(pipe) == before

    # failOnDataLoss=false: the documented, logged skip; the 40 left are read once
    size = _log_size(pipe)
    assert pipe.run(fail_on_data_loss="false").returncode == 0, pipe.describe()
    assert f"skipped 20 offset(s) of {topic}-0, [0, 20) (failOnDataLoss=false)" in _log_from(pipe, size)
    rows = _rows(pipe)
    assert sorted(r["src_offset"] for r in rows) == list(range(20, 60))
    checks = checker.compare_records(records[20:], rows, payload_fields=("key", "amount"))
    assert all(c.ok for c in checks), [c.summary for c in checks]


# ---------------------------------------------------------------------------------------------------
# F23: a compacted topic after the log cleaner ran: gaps inside the batches' ranges


def test_f23_compacted_topic_is_read_exactly_as_the_cleaner_left_it(broker: ApacheKafka, make_pipeline: Any) -> None:
    pipe = make_pipeline("f23", max_offsets=60)
    bootstrap, topic = broker.bootstrap, pipe.topic
    _create_topic(
        bootstrap,
        topic,
        2,
        {
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
        },
    )
    # every other record has a key of its own (it stays); the others share three keys (all but the last go)
    records = [
        {"id": f"{pipe.table}-{i:04d}", "key": f"u{i:03d}" if i % 2 == 0 else f"dup{i % 6}", "amount": i + 1}
        for i in range(240)
    ]
    plain = {"enable.idempotence": False}  # no producer state for the cleaner to keep batches for
    _produce(bootstrap, topic, records, 2, **plain)
    time.sleep(0.5)  # older than segment.ms: the next record starts a new segment, and the cleaner may clean the old
    tails = [{"id": f"{pipe.table}-tail-{p}", "key": f"tail{p}", "amount": 7} for p in (0, 1)]
    for p, tail in enumerate(tails):
        _produce(bootstrap, topic, [tail], partition=p, **plain)
    last_of_key = {(_part(r, 2), r["key"]): r for r in records}
    survivors = sorted([r["id"] for r in last_of_key.values()] + [t["id"] for t in tails])

    def cleaned() -> bool:
        return sorted(v["id"] for _, _, v in _log_records(bootstrap, topic, "read_uncommitted")) == survivors

    try:
        wait_until(cleaned, timeout=180, interval=0.5, what="the log cleaner to compact the topic")
    except TimeoutError:
        lines = broker.log_path.read_text(errors="replace").splitlines()
        said = [line for line in lines if "leaner" in line or topic in line]  # the cleaner's words, the topic's
        raise AssertionError(
            f"the log cleaner did not compact {topic} in 180 s; broker log:\n" + "\n".join(said[-60:])
        ) from None
    marks = _marks(bootstrap, topic)
    assert sum(high - low for low, high in marks.values()) == len(records) + 2 > len(survivors)  # gaps: compacted
    out = pipe.run()
    assert out.returncode == 0, pipe.describe()
    # the batches' ranges held gaps (offsets the cleaner removed), and no gap was taken for data loss
    kept = {(p, o) for p, o, _ in _log_records(bootstrap, topic, "read_uncommitted")}
    gaps = _ranges_with_gaps(_planned(pipe.checkpoint, topic), kept)
    assert len(gaps) >= 4, f"the batches' ranges held no gaps: {_planned(pipe.checkpoint, topic)}"
    log = _log_from(pipe, 0)
    assert not [w for w in LOSS_WORDS if w in log], "compaction gaps were reported as data loss"
    report = pipe.report()
    _assert_ok(report, pipe)  # the sink equals a plain consumer's read of the compacted topic, once each
    assert report.info["source_records"] == len(survivors) == report.info["sink_rows"]
    assert sorted(r["id"] for r in checker.read_topic(bootstrap, topic)) == survivors


# ---------------------------------------------------------------------------------------------------
# F24: partitions added, then the topic deleted and re-created, under a running query (subscribe)


@contextlib.contextmanager
def _frozen(proc: PipelineProcess) -> Iterator[None]:
    """The query's processes stopped (SIGSTOP to its process group, Spark's Python daemon's group too) for the
    block, then continued; proves they were stopped (state T) before the block runs."""
    groups = {proc.pid, *_daemon_groups(proc.pid)}
    for g in groups:
        os.killpg(g, signal.SIGSTOP)
    try:
        time.sleep(1)  # a call under way in a process not yet stopped (a planner's look-up) ends before the block
        assert process_state(proc.pid) == "T", f"the query's driver (pid {proc.pid}) was not stopped"
        yield
    finally:
        for g in groups:
            os.killpg(g, signal.SIGCONT)


def _daemon_groups(leader: int) -> set[int]:
    """Process groups other than ``leader``'s holding its descendants (Spark's Python daemon makes its own)."""
    groups = set()
    for pid in descendants(leader):
        with contextlib.suppress(OSError):  # ended meanwhile
            groups.add(os.getpgid(pid))
    return groups - {leader}


def _wait_topic_gone(admin: AdminClient, topic: str) -> None:
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, timeout=60, what=f"{topic} deleted")


def test_f24_partitions_added_and_topic_recreated_under_a_running_query(
    broker: ApacheKafka, make_pipeline: Any
) -> None:
    pipe = make_pipeline("f24", max_offsets=500)
    bootstrap, topic = broker.bootstrap, pipe.topic
    admin = _admin(bootstrap)
    _create_topic(bootstrap, topic, 2)
    first = make_records(100, seed=24, prefix=f"{pipe.table}-1-")
    _produce(bootstrap, topic, first, 2)
    proc = pipe.process(state="F24", trigger="processing:1").start()
    try:
        _drained(pipe, proc, 100)
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        wait_until(lambda: _partition_count(admin, topic) == 4, timeout=30, what="4 partitions")
        second = make_records(100, seed=24, start=100, prefix=f"{pipe.table}-2-")
        _produce(bootstrap, topic, second, 4)
        _drained(pipe, proc, 200)
        # the added partitions were read from offset 0 (their earliest), every record once
        rows = _rows(pipe)
        for p in (2, 3):
            n = sum(1 for r in second if _part(r, 4) == p)
            assert n > 0 and sorted(r["src_offset"] for r in rows if r["src_partition"] == p) == list(range(n)), p
        before = _sink_state(pipe)
        position = _planned(pipe.checkpoint, topic)[before[1]]  # type: ignore[index]
        # the topic deleted and re-created with fewer records than the query has read (2 a partition)
        assert all(position[p] > 2 for p in range(4)), position
        third = [
            {"id": f"{pipe.table}-3-{p}-{i}", "key": "k", "amount": i + 1, "_p": p} for p in range(4) for i in range(2)
        ]
        # the query frozen (SIGSTOP) while the topic is deleted and re-created, so that its next trigger finds the new
        # topic under the old name: a trigger between the two finds the topic gone, which stops the query too but is
        # another refusal (a slow machine met it). A look-up under way when frozen ends first (a second's grace).
        with _frozen(proc):
            admin.delete_topics([topic])[topic].result(30)
            _wait_topic_gone(admin, topic)
            _create_topic(bootstrap, topic, 4)
            for p in range(4):
                _produce(bootstrap, topic, [r for r in third if r["_p"] == p], partition=p)
        out = proc.wait(120)  # failOnDataLoss=true: the query stops by itself
    finally:
        proc.stop()
    pipe.outcomes.append(out)
    assert out.returncode == 2, f"a re-created topic must stop the query\n{pipe.describe()}"
    # (its message holds the query's plan: the log's tail may start past the RUNNER FAILED: line)
    assert proc.logged("RUNNER FAILED") and proc.logged(f"topic '{topic}' was deleted and re-created"), out.log_tail
    assert proc.logged("Some data may have been lost; set failOnDataLoss=false"), out.log_tail
    assert _sink_state(pipe) == before

    # failOnDataLoss=false: the query goes on, reading the new topic (its new id) as a new topic, from its
    # earliest offsets; the old topic's unread records are gone (the query had read them all)
    size = _log_size(pipe)
    proc = pipe.process(state="F24-false", trigger="processing:1", fail_on_data_loss="false").start()
    try:
        as_new = f"the new topic {topic!r} (id "
        wait_until(
            lambda: as_new in _log_from(pipe, size), timeout=240, what="the data loss in the log", alive=proc.alive
        )
        _drained(pipe, proc, 200 + len(third))
        fourth = [
            {"id": f"{pipe.table}-4-{p}-{i}", "key": "k", "amount": i + 1, "_p": p} for p in range(4) for i in range(5)
        ]
        for p in range(4):
            _produce(bootstrap, topic, [r for r in fourth if r["_p"] == p], partition=p)
        _drained(pipe, proc, 200 + len(third) + len(fourth))
    finally:
        out = proc.stop()
    pipe.outcomes.append(out)
    assert out.killed, f"with failOnDataLoss=false the query must go on\n{pipe.describe()}"
    log = _log_from(pipe, size)
    assert f"topic {topic!r} was deleted and re-created under its name" in log and "(failOnDataLoss=false)" in log
    rows = _rows(pipe)
    for p in range(4):  # each partition of the new topic read from offset 0, once
        n = sum(1 for r in (*third, *fourth) if r["_p"] == p)
        new = sorted(
            r["src_offset"] for r in rows if r["src_partition"] == p and r["id"].startswith(f"{pipe.table}-3-")
        )
        new += sorted(
            r["src_offset"] for r in rows if r["src_partition"] == p and r["id"].startswith(f"{pipe.table}-4-")
        )
        assert new == list(range(n)), (p, new)
    report = pipe.report()
    # the checker reads the re-created topic: the 200 records of the deleted one are phantoms to it; nothing is lost
    assert [c.name for c in report.failures] == ["records.phantoms"], report.table()
    assert report.get("records.phantoms").counts["phantoms"] == 200
    expected = [*first, *second, *({k: v for k, v in r.items() if k != "_p"} for r in (*third, *fourth))]
    checks = checker.compare_records(expected, rows, payload_fields=("key", "amount"))
    assert all(c.ok for c in checks), [c.summary for c in checks]
