"""The crash matrix F1-F16: kill, cut, crash and corrupt a real pipeline, then prove exactly-once.

Each pipeline is ``integration.harness.runner`` in its own process group (Kafka ``kafka-eos`` ->
JSON parse -> sink). Every step asserts that its fault really happened (fault log entry, exit
signal, proxy counters, the executor pid killed) and every test ends with the checker: the sink
equals the topic as a multiset (no duplicate, loss, phantom or changed payload), per-key
aggregates for the stateful pipeline, no prepared transaction of the sink left, and the sink's last
decision equal to Spark's last ``commits/n``.

To stay inside the CI budget, one pipeline carries several faults: F1-F4 are four consecutive
kills of one query, and F5-F8 hit one later run of it in ``local-cluster`` mode; F9, F10 and F15
share one run behind two proxies. See /tmp/eos-readme/guarantees.md for what each F proves.
"""

from __future__ import annotations

import os
import signal
import uuid

import psycopg
import pytest

from connectors import checker
from connectors.chaos import create_topic, make_records, produce_records
from connectors.harness import (
    executor_pids,
    wait_until,
)
from integration.harness.matrix import Pipeline
from integration.harness.proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.crash]

RECORDS = 2400  # 2 partitions, 200 per trigger: 12 batches, enough for F1-F8 at distinct batches
PER_TRIGGER = 200
CLUSTER = "local-cluster[2,1,1024]"

# F1-F4 per pipeline: (id, fault spec, the point whose firing proves it, what it means)
KILLS = {
    "2pc": [
        ("F1", "sink.before_write:batch=1:partition=0:action=kill-group:once", "sink.before_write"),
        ("F2", "sink.after_prepare:batch=2:partition=1:action=kill-group:once", "sink.after_prepare"),
        ("F3", "sink.commit.after_k:batch=3:k=1:action=kill-group:once", "sink.commit.after_k"),
        ("F4", "sink.after_commit:batch=4:action=kill-group:once", "sink.after_commit"),
    ],
    # the upsert sink has no prepare/decision: F2 = rows written, task not committed; F3 = one
    # task committed, the other killed before its COMMIT (partition 1 waits for partition 0)
    "upsert": [
        ("F1", "sink.before_write:batch=1:partition=0:action=kill-group:once", "sink.before_write"),
        ("F2", "sink.after_write:batch=2:partition=1:action=kill-group:once", "sink.after_write"),
        (
            "F3",
            "sink.before_write:batch=3:partition=1:action=sleep:seconds=4:once;"
            "sink.after_write:batch=3:partition=1:action=kill-group:once",
            "sink.after_write",
        ),
        ("F4", "sink.after_commit:batch=4:action=kill-group:once", "sink.after_commit"),
    ],
}
KILLS["stateful"] = KILLS["upsert"]

# F5-F8 in one local-cluster run: the point where a task is held (sleep) so the test can strike
HOLD = {"2pc": "sink.after_prepare", "upsert": "sink.after_write", "stateful": "sink.after_write"}
COMMIT_SQL = {"2pc": b"COMMIT PREPARED", "upsert": b"COMMIT", "stateful": b"COMMIT"}


@pytest.fixture
def make_pipeline(kafka_service, postgres_service, tmp_path):
    proxies: list[TcpProxy] = []

    def make(sink: str, *, records: int = RECORDS, proxy_pg: bool = False, topic: str | None = None,
             bootstrap: str | None = None, produce: bool = True) -> Pipeline:  # fmt: skip
        name = f"cm_{sink}_{uuid.uuid4().hex[:8]}"
        bootstrap = bootstrap or kafka_service.bootstrap
        topic = topic or name
        if produce:
            create_topic(bootstrap, topic, 2)
            produce_records(bootstrap, topic, make_records(records, seed=len(name), prefix=f"{name}-"), partitions=2)
        dsn = postgres_service.dsn
        if proxy_pg:
            proxy = TcpProxy("127.0.0.1", int(postgres_service.port)).start()
            proxies.append(proxy)
            dsn = _with_port(dsn, proxy.port)
        pipe = Pipeline(sink, bootstrap, topic, dsn, postgres_service.dsn, name, str(tmp_path / name), PER_TRIGGER)
        pipe.proxy = proxies[-1] if proxy_pg else None
        return pipe

    yield make
    for proxy in proxies:
        proxy.close()


def _with_port(dsn: str, port: int) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(dsn)
    parts.update(host="127.0.0.1", port=str(port))
    return make_conninfo(**parts)


def _assert_ok(report: checker.Report, pipe: Pipeline) -> None:
    assert report.ok, f"{report.table()}\n{pipe.describe()}"


def _executor_of(pid: int) -> int:
    """The executor JVM (CoarseGrainedExecutorBackend) that is an ancestor of a Python worker."""
    from connectors.harness import _cmdline, _ppid

    p = pid
    while p > 1:
        p = _ppid(p)
        if "CoarseGrainedExecutorBackend" in _cmdline(p):
            return p
    raise AssertionError(f"python worker {pid} has no executor JVM ancestor")


def _prepared(dsn: str, sink_id: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return checker.prepared_gids(conn, sink_id)


# ---------------------------------------------------------------------------------------------
# F1-F8 for each pipeline


@pytest.mark.parametrize("sink", ["2pc", "upsert", "stateful"])
def test_f1_to_f8(sink, make_pipeline, postgres_service):
    pipe = make_pipeline(sink, proxy_pg=True)
    proxy = pipe.proxy

    # F1-F4: the driver's whole process group killed at four protocol steps, restart after each
    for fid, spec, point in KILLS[sink]:
        out = pipe.run(spec, state=fid)
        assert out.killed, f"{fid}: expected SIGKILL of the group, got {out}\n{pipe.describe()}"
        assert pipe.fired(point, action="kill-group"), f"{fid}: {point} never fired\n{pipe.describe()}"
        assert len(pipe.fired(action="kill-group")) == len(pipe.outcomes)

    # F5-F8: one run in local-cluster mode (separate executor JVMs), four faults in turn
    hold = HOLD[sink]
    spec = ";".join(
        [
            "sink.before_write:batch=5:partition=1:action=kill:once",  # F5: the Python worker dies
            f"{hold}:batch=6:partition=0:action=sleep:seconds=8:once",  # F6: its executor JVM is killed
            f"{hold}:batch=7:partition=1:action=sleep:seconds=8:once",  # F7: Postgres crashes meanwhile
        ]
    )
    proc = pipe.process(spec, state="F5-F8", master=CLUSTER).start()
    try:
        held6 = wait_until(lambda: pipe.fired(hold, batch=6), timeout=300, what="F6 hold", alive=proc.alive)
        executor = _executor_of(int(held6[0]["pid"]))
        assert executor in executor_pids(proc.pid)
        os.kill(executor, signal.SIGKILL)

        wait_until(lambda: pipe.fired(hold, batch=7), timeout=300, what="F7 hold", alive=proc.alive)
        if sink == "2pc":  # the point is logged after PREPARE: the crash hits prepared transactions
            in_doubt = _prepared(pipe.check_dsn, pipe.sink_id)
            assert any(":7:" in g for g in in_doubt), in_doubt
        postgres_service.crash()
        postgres_service.start()
        # F8: the next commit statement is executed by Postgres, but its answer never arrives
        proxy.reset_on(COMMIT_SQL[sink])
        out = proc.wait(400)
    finally:
        proc.stop()
    pipe.outcomes.append(out)
    if out.returncode != 0:  # a lost commit answer may fail the query loudly: restart, roll forward
        assert out.returncode == 2, pipe.describe()
        assert pipe.run().returncode == 0, pipe.describe()

    assert pipe.fired("sink.before_write", batch=5, action="kill"), "F5: the worker kill never fired"
    assert not os.path.exists(f"/proc/{executor}") or _state(executor) == "Z", "F6: executor survived"
    assert proxy.stats.pattern_hits >= 1 and proxy.stats.resets >= 1, f"F8: no reset ({proxy.stats})"
    report = pipe.report(min_faults=7)
    _assert_ok(report, pipe)


def _state(pid: int) -> str:
    from connectors.harness import _state as state

    return state(pid)
