"""Container faults: Postgres SIGKILLed with prepared transactions, containers frozen, the broker killed.

Each test gets its own Kafka and Postgres containers (host network, 127.0.0.1) so that killing or
freezing them disturbs no other test. The pipeline is the crash matrix's runner (``kafka-eos`` ->
``postgres-2pc``) and every pipeline test ends with the exact checker (``connectors.toolkit.checker``):
the table equals the topic as a multiset, no prepared transaction of the sink is left, the sink's
last decision equals Spark's last ``commits/n``, and the injected fault really fired.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from connectors.services.containers import ContainerKafka, ContainerPostgres
from connectors.toolkit import checker
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from connectors.toolkit.harness import wait_until
from integration.harness.matrix import Pipeline

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.crash]

RECORDS = 600  # 2 partitions, 200 per trigger: 3 micro-batches
PER_TRIGGER = 200


def _pipeline(kafka: ContainerKafka, pg: ContainerPostgres, tmp_path: Path, records: int = RECORDS) -> Pipeline:
    name = f"dk_{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, 2)
    produce_records(kafka.bootstrap, name, make_records(records, seed=7, prefix=f"{name}-"), partitions=2)
    return Pipeline("2pc", kafka.bootstrap, name, pg.dsn, pg.dsn, name, str(tmp_path / name), PER_TRIGGER)


def _assert_exact(pipe: Pipeline, expect: list[str]) -> checker.Report:
    report = pipe.report(expect_faults=expect, min_faults=1)
    assert report.ok, f"{report.table()}\n{pipe.describe()}"
    assert report.info["source_records"] == RECORDS and report.info["sink_rows"] == RECORDS, report.info
    return report


@pytest.mark.slow
def test_postgres_container_sigkill_with_prepared_transactions(
    kafka_box: ContainerKafka, pg_box: ContainerPostgres, tmp_path: Path
) -> None:
    """The query dies after PREPARE; then the Postgres container's PID 1 (the postmaster) is
    SIGKILLed and the container started again on the same data volume: the prepared transactions
    are still there (the sink's and one of the test's own, committed by hand), and the next run
    resolves the sink's and finishes exactly once."""
    pipe = _pipeline(kafka_box, pg_box, tmp_path)
    killed = pipe.run("sink.after_prepare:batch=1:partition=0:action=kill-group:once")
    assert killed.killed, pipe.describe()
    assert pipe.fired("sink.after_prepare", batch=1), "the fault did not fire"

    probe = f"{pipe.table}_probe"
    with psycopg.connect(pg_box.dsn, autocommit=True) as conn:
        before = set(checker.prepared_gids(conn, pipe.sink_id))
        conn.execute(f"CREATE TABLE {probe} (v int)")  # type: ignore[arg-type]
    assert before, "the kill after PREPARE left no prepared transaction of the sink"
    with psycopg.connect(pg_box.dsn) as conn:  # a prepared transaction of the test's own
        conn.execute(f"INSERT INTO {probe} VALUES (42)")  # type: ignore[arg-type]
        conn.execute(f"PREPARE TRANSACTION '{probe}'")  # type: ignore[arg-type]

    pg_box.crash()
    assert pg_box.last_exit_code == 137 and pg_box.status() == "exited", (pg_box.last_exit_code, pg_box.status())
    assert "database system was interrupted" not in pg_box.logs()  # only after the restart below
    pg_box.start()
    assert "not properly shut down" in pg_box.logs() or "interrupted" in pg_box.logs(), pg_box.logs()

    with psycopg.connect(pg_box.dsn, autocommit=True) as conn:
        assert set(checker.prepared_gids(conn, pipe.sink_id)) == before, (
            "prepared transactions of the sink did not survive"
        )
        assert conn.execute(f"SELECT count(*) FROM {probe}").fetchone() == (0,)  # type: ignore[arg-type]
        conn.execute(f"COMMIT PREPARED '{probe}'")  # type: ignore[arg-type]
        assert conn.execute(f"SELECT v FROM {probe}").fetchall() == [(42,)]  # type: ignore[arg-type]

    final = pipe.run()
    assert final.returncode == 0, pipe.describe()
    _assert_exact(pipe, ["sink.after_prepare"])


@pytest.mark.slow
def test_containers_paused_longer_than_client_timeouts(
    kafka_box: ContainerKafka, pg_box: ContainerPostgres, tmp_path: Path
) -> None:
    """Freeze (cgroup freezer) each container for longer than the clients' timeouts.

    Client level: a new Postgres connection (connect_timeout=2) and a Kafka produce
    (message.timeout.ms=2000) fail with a clear timeout while frozen; an open connection's query
    just waits and completes after the resume; both servers then serve normally.
    Pipeline level: Postgres is frozen while a sink task is about to write (connect_timeout=2 for
    the sink), then Kafka while a batch is read. Each run ends either drained or failed with a
    clear error (never hung, never partial); the last run finishes; the checker finds exactly once.
    """
    # -- client level ----------------------------------------------------------------------------
    topic = f"dk_pause_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_box.bootstrap, topic, 1)
    with psycopg.connect(pg_box.dsn, autocommit=True) as open_conn:
        pg_box.pause()
        try:
            assert pg_box.status() == "paused"
            with pytest.raises(psycopg.OperationalError, match="timeout"):
                psycopg.connect(pg_box.dsn, connect_timeout=2)
            answer: list[Any] = []
            waiter = threading.Thread(target=lambda: answer.append(open_conn.execute("SELECT 7").fetchone()))
            waiter.start()
            waiter.join(3)
            assert waiter.is_alive() and not answer, "a frozen server answered"
        finally:
            pg_box.unpause()
        waiter.join(30)
        assert answer == [(7,)], "the query issued during the freeze did not complete after the resume"

    kafka_box.pause()
    try:
        assert kafka_box.status() == "paused"
        errors: list[str] = []
        producer = Producer({"bootstrap.servers": kafka_box.bootstrap, "message.timeout.ms": 2000})
        producer.produce(topic, b"during-pause", on_delivery=lambda err, msg: errors.append(str(err)))
        producer.flush(10)
        assert errors and "timed out" in errors[0].lower(), errors
    finally:
        kafka_box.unpause()
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka_box.bootstrap})
    producer.produce(topic, b"after-resume", on_delivery=lambda err, msg: delivered.append(err))
    producer.flush(30)
    assert delivered == [None], f"produce after the resume failed: {delivered}"

    # -- pipeline level --------------------------------------------------------------------------
    # One run freezes Postgres while a sink task is about to write (batch 1), then Kafka while a
    # read task starts (batch 2). A run that fails on a freeze is started again with the faults
    # still to come; a last clean run only when the previous one did not drain.
    pipe = _pipeline(kafka_box, pg_box, tmp_path)
    pending = [
        (pg_box, "sink.before_write", "sink.before_write:batch=1:partition=0:action=sleep:seconds=2:once"),
        (kafka_box, "source.read.start", "source.read.start:batch=2:partition=0:action=sleep:seconds=2:once"),
    ]
    proc = None
    frozen_while_running = []
    try:
        while pending:
            assert len(pipe.outcomes) < 4, f"the freezes never happened: {pipe.describe()}"
            if proc is None:
                proc = pipe.process(";".join(spec for _, _, spec in pending), extra=("connect_timeout=2",)).start()
            box, point, _ = pending[0]
            wait_until(
                lambda point=point, running=proc: bool(pipe.fired(point)) or not running.alive(),
                timeout=300,
                what=f"{point} to fire",
            )
            if pipe.fired(point):
                box.pause()
                try:
                    assert box.status() == "paused"
                    frozen_while_running.append(proc.alive())
                    time.sleep(8)  # longer than connect_timeout=2 and the 2 s the task sleeps first
                finally:
                    box.unpause()
                pending.pop(0)
            if not proc.alive() or not pending:
                out = proc.wait(400)
                pipe.outcomes.append(out)
                proc = None
                assert out.returncode == 0 or "RUNNER FAILED" in out.log_tail, (
                    f"neither drained nor a clear failure: {pipe.describe()}"
                )
    except BaseException:
        if proc is not None:
            proc.stop()  # never leave the query's JVM behind a failed test
        raise
    assert frozen_while_running == [True, True], "a freeze did not happen while the pipeline ran"
    if pipe.outcomes[-1].returncode != 0:
        final = pipe.run()
        assert final.returncode == 0, pipe.describe()
    _assert_exact(pipe, ["sink.before_write", "source.read.start"])
    assert len(pipe.fired("sink.before_write")) == 1 and len(pipe.fired("source.read.start")) == 1


def test_broker_container_killed_mid_batch_and_restarted(kafka_box: ContainerKafka, tmp_path: Path) -> None:
    """SIGKILL the broker container with a transaction open (records produced, not committed),
    then start it again on the same address.

    What this proves everywhere: the producer's commit fails with a clear error instead of
    pretending success, and the restarted broker serves the same bootstrap address.
    With tansu (memory storage; the local image) it also proves the loss is visible: the topic and
    its committed records are gone after the restart, so a reader sees offsets go backwards (the
    kafka-eos source reports that as data loss). It cannot prove durability of committed records,
    which tansu's memory storage does not have. With real Kafka (EOS_DOCKER_IMAGES=upstream) the
    committed records survive the kill and the killed transaction's records stay invisible under
    read_committed."""
    topic = f"dk_kill_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_box.bootstrap, topic, 1)
    committed = [f"c{i}".encode() for i in range(5)]
    prod = Producer(
        {
            "bootstrap.servers": kafka_box.bootstrap,
            "transactional.id": f"tx-{topic}",
            "transaction.timeout.ms": 10000,
            "message.timeout.ms": 5000,
            "socket.timeout.ms": 3000,
        }
    )
    prod.init_transactions(30)
    prod.begin_transaction()
    for v in committed:
        prod.produce(topic, v, partition=0)
    prod.commit_transaction(30)
    prod.begin_transaction()
    for i in range(5):
        prod.produce(topic, f"a{i}".encode(), partition=0)
    prod.flush(10)  # in the broker, not committed: the kill lands mid-batch

    code = kafka_box.kill("SIGKILL")
    assert code == 137 and kafka_box.status() == "exited"
    with pytest.raises(KafkaException):
        prod.commit_transaction(8)
    kafka_box.start()  # same container, same 127.0.0.1 port

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_box.bootstrap,
            "group.id": f"g-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        md = consumer.list_topics(timeout=10)
        if kafka_box.is_tansu:
            assert topic not in md.topics or consumer.get_watermark_offsets(TopicPartition(topic, 0), 10) == (0, 0), (
                "tansu keeps topics in memory: the restarted broker should have lost them"
            )
            return
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(committed) and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and not msg.error():
                seen.append(msg.value())
        time.sleep(2)
        msg = consumer.poll(2)
        if msg is not None and not msg.error():
            seen.append(msg.value())
        assert seen == committed, f"real Kafka: committed records must survive, aborted ones stay invisible: {seen}"
    finally:
        consumer.close()


@pytest.mark.slow
def test_pipeline_with_broker_container_killed_mid_batch(
    kafka_box: ContainerKafka, pg_box: ContainerPostgres, tmp_path: Path
) -> None:
    """kafka-eos -> postgres-2pc; the broker container is SIGKILLed while batch 1 is prepared in
    Postgres (its records already read), then started again on the same address.

    The sink needs no broker to commit: batch 1 commits exactly once, or, if its other read task
    only started after the kill, it is rolled back whole. Then:
    - tansu (local image, memory storage) comes back empty: the source's next plan sees the topic
      gone and the query stops with the data-loss error (failOnDataLoss=true), never skipping
      silently. The sink holds the committed batches exactly once, no prepared transaction is left and
      the last decision equals Spark's last commit; what was lost with the broker cannot be
      checked against a topic that no longer exists, and is not claimed.
    - real Kafka (EOS_DOCKER_IMAGES=upstream) keeps the records: the query drains and the exact
      checker compares the whole topic with the table."""
    pipe = _pipeline(kafka_box, pg_box, tmp_path)
    proc = pipe.process("sink.after_prepare:batch=1:partition=0:action=sleep:seconds=4:once").start()
    try:
        wait_until(
            lambda: bool(pipe.fired("sink.after_prepare")), timeout=300, what="batch 1 prepared", alive=proc.alive
        )
        assert kafka_box.kill("SIGKILL") == 137
        kafka_box.start()
        out = proc.wait(400)
    except BaseException:
        proc.stop()
        raise
    pipe.outcomes.append(out)
    if not kafka_box.is_tansu:
        assert out.returncode == 0, pipe.describe()
        _assert_exact(pipe, ["sink.after_prepare"])
        return

    assert out.returncode != 0 and "RUNNER FAILED" in out.log_tail, f"the loss went unnoticed: {pipe.describe()}"
    assert "lost" in out.log_tail.lower(), f"the failure does not name the data loss: {out.log_tail[-2000:]}"
    produced = {r["id"] for r in make_records(RECORDS, seed=7, prefix=f"{pipe.table}-")}
    with psycopg.connect(pg_box.dsn, autocommit=True) as conn:
        rows = checker.read_table(conn, pipe.table)
        ends = checker.check_end_state(conn, sink_id=pipe.sink_id, checkpoint=pipe.checkpoint)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicates in the sink"
    assert set(ids) <= produced, f"phantoms in the sink: {sorted(set(ids) - produced)[:5]}"
    assert all(c.ok for c in ends), [c.summary for c in ends]
    # batch 1 commits when its other read task had finished before the kill; if that task started
    # after it, it hit the empty broker and batch 1 was rolled back whole. Either way the table
    # holds exactly the records up to the end offsets of Spark's last committed batch.
    last = checker.last_commit(pipe.checkpoint)
    assert last is not None and last <= 2, f"the query went on past the loss: last commit {last}"
    ends_json = (Path(pipe.checkpoint) / "offsets" / str(last)).read_text().splitlines()[-1]
    committed = sum(json.loads(ends_json)[pipe.topic].values())  # every partition started at 0
    assert 0 < committed < RECORDS and len(ids) == committed, (len(ids), ends_json)
