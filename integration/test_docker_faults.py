"""Container faults: Postgres SIGKILLed with prepared transactions, containers frozen, the broker killed.

Each test gets its own Kafka and Postgres containers (host network, 127.0.0.1) so that killing or
freezing them disturbs no other test. Kafka is Apache Kafka with its log segments on a volume: on
the suite's private engine spark-eos/kafka (the embedded broker's jars and configuration), on a
user's engine upstream apache/kafka; so a SIGKILLed broker comes back with what it had written. The pipeline is the crash matrix's runner (``kafka-eos`` ->
``postgres-2pc``) and every pipeline test ends with the exact checker (``connectors.toolkit.checker``):
the table equals the topic as a multiset, no prepared transaction of the sink is left, the sink's
last decision equals Spark's last ``commits/n``, and the injected fault really fired.
"""

from __future__ import annotations

import select
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

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


# A transactional writer in a process of its own, so that it can die with its transaction open
# (librdkafka goes on committing in the background after commit_transaction() times out: a writer
# left alive in the test process could commit the open transaction once the broker is back).
WRITER = r"""
import sys
from confluent_kafka import Producer

bootstrap, topic = sys.argv[1:3]
prod = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "transaction.timeout.ms": 60000,
                 "message.timeout.ms": 5000, "socket.timeout.ms": 3000})
prod.init_transactions(30)
prod.begin_transaction()
for i in range(5):
    prod.produce(topic, f"c{i}".encode(), partition=0)
prod.commit_transaction(30)
prod.begin_transaction()
for i in range(5):
    prod.produce(topic, f"a{i}".encode(), partition=0)
assert prod.flush(10) == 0  # in the broker's log, not committed
print("OPEN", flush=True)
sys.stdin.readline()  # the broker is SIGKILLed meanwhile
try:
    prod.commit_transaction(8)
except Exception as e:
    print(f"COMMIT FAILED {type(e).__name__}: {e}", flush=True)
else:
    print("COMMITTED", flush=True)
sys.stdin.readline()  # SIGKILLed here: the writer dies with its transaction open
"""


def _line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The writer's next line of output, within ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the writer said nothing within {timeout}s"
    return proc.stdout.readline().strip()


def _read(bootstrap: str, topic: str, isolation: str, expect: int) -> list[bytes]:
    """Every value of partition 0 from offset 0 an ``isolation`` reader gets: ``expect`` of them, then
    2 s in which no further one may arrive."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    seen: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(seen) < expect and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and not msg.error():
                seen.append(msg.value() or b"")
        settle = time.monotonic() + 2
        while time.monotonic() < settle:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                seen.append(msg.value() or b"")
    finally:
        consumer.close()
    return seen


def test_broker_container_killed_mid_batch_and_restarted(kafka_box: ContainerKafka, tmp_path: Path) -> None:
    """SIGKILL the Apache Kafka container while a writer has a transaction open (5 records in the
    log, not committed), let the writer's commit fail, kill the writer too, and start the broker
    container again on the same address and volume.

    The commit fails with a clear error instead of pretending success. The restarted broker has
    lost nothing: the 5 committed records survive the SIGKILL, and so do the 5 of the open
    transaction (a read_uncommitted reader gets all 10), but a read_committed reader gets only the
    committed ones. When a new producer with the same transactional.id fences the dead writer, the
    broker aborts its transaction: a record committed after it is read, the aborted ones stay
    skipped, and they keep their offsets (high watermark 14 = 5 + commit marker + 5 + abort marker
    + 1 + commit marker)."""
    topic = f"dk_kill_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_box.bootstrap, topic, 1)
    committed = [f"c{i}".encode() for i in range(5)]
    pending = [f"a{i}".encode() for i in range(5)]
    log = tmp_path / "writer.log"  # librdkafka's own messages go to stderr
    with open(log, "w") as err:
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, kafka_box.bootstrap, topic],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert _line(writer, 90) == "OPEN", log.read_text()[-2000:]
        code = kafka_box.kill("SIGKILL")
        assert code == 137 and kafka_box.status() == "exited"
        assert writer.stdin is not None
        writer.stdin.write("commit\n")
        writer.stdin.flush()
        outcome = _line(writer, 60)
        assert outcome.startswith("COMMIT FAILED KafkaException"), f"{outcome}\n{log.read_text()[-2000:]}"
    finally:
        writer.kill()  # the writer dies with its transaction open
        writer.communicate(timeout=30)
    kafka_box.start()  # same container, same 127.0.0.1 port, same data volume

    assert _read(kafka_box.bootstrap, topic, "read_uncommitted", 10) == committed + pending, (
        "records acknowledged before the SIGKILL were lost"
    )
    assert _read(kafka_box.bootstrap, topic, "read_committed", 5) == committed, (
        "read_committed: the committed records must survive and the killed transaction stay invisible"
    )

    fencer = Producer({"bootstrap.servers": kafka_box.bootstrap, "transactional.id": f"tx-{topic}"})
    fencer.init_transactions(60)  # bumps the epoch: the broker aborts the dead writer's transaction
    fencer.begin_transaction()
    fencer.produce(topic, b"after", partition=0)
    fencer.commit_transaction(30)
    assert _read(kafka_box.bootstrap, topic, "read_committed", 6) == [*committed, b"after"]
    consumer = Consumer({"bootstrap.servers": kafka_box.bootstrap, "group.id": f"w-{topic}"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), 10) == (0, 14)
    finally:
        consumer.close()


@pytest.mark.slow
def test_pipeline_with_broker_container_killed_mid_batch(
    kafka_box: ContainerKafka, pg_box: ContainerPostgres, tmp_path: Path
) -> None:
    """kafka-eos -> postgres-2pc; the Apache Kafka container is SIGKILLed while batch 1 is prepared
    in Postgres (its records already read), then started again on the same address and volume.

    The sink needs no broker to commit: batch 1 commits exactly once. The restarted broker has kept
    every record, so the query goes on where it was, drains, and the exact checker compares the
    whole topic with the table."""
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
    assert out.returncode == 0, pipe.describe()
    _assert_exact(pipe, ["sink.after_prepare"])
