"""A replicated Postgres under the 2PC sink (issue 46): the primary lost, the standby promoted.

Each test has its own pair (``connectors.services.postgres_standby.ReplicatedPostgres``, TLS, hardened, ~3 s
to start) and runs the crash matrix's pipeline (``kafka-eos`` -> JSON parse -> ``postgres-2pc``) as an app
role holding exactly ``owner_grants()``, through the failover DSN (both servers,
``target_session_attrs=read-write``), on the session's secured Kafka as its app principal.

- F33, synchronous: the primary SIGKILLed while the driver holds a decided batch whose prepared transactions
  are not committed yet; the standby, promoted, holds them (a PREPARE returns once the standby has its WAL):
  the committer finishes them on the new primary, exactly once.
- F34, asynchronous: the standby falls behind (stopped) while batches commit on the primary alone, then the
  primary dies and the standby is promoted: the database lost committed batches Spark's checkpoint holds.
  The restarted query is refused before it writes anything, naming the lost batches and the replay; the
  replay (``spark-eos savepoint create --batch N``, restore) writes them exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from connectors.services.pg_security import owner_grants
from connectors.services.postgres_standby import ReplicatedPostgres
from connectors.toolkit import checker
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from connectors.toolkit.harness import wait_until
from integration.harness.matrix import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.crash]

RECORDS, PER_TRIGGER = 1200, 200  # two partitions: six batches


@pytest.fixture
def make_pair() -> Iterator[Callable[[bool], ReplicatedPostgres]]:
    """``make_pair(synchronous)``: a primary and its standby, stopped after the test."""
    made: list[ReplicatedPostgres] = []

    def make(synchronous: bool) -> ReplicatedPostgres:
        made.append(ReplicatedPostgres(synchronous=synchronous))
        return made[-1]

    yield make
    for pg in made:
        pg.stop()


def _pipeline(pair: ReplicatedPostgres, kafka_service: Any, grant_topic: Any, workdir: Any) -> Pipeline:
    name = f"pf_{'sync' if pair.synchronous else 'async'}_{uuid.uuid4().hex[:8]}"
    grant_topic(name)
    create_topic(kafka_service.bootstrap, name, 2)
    produce_records(kafka_service.bootstrap, name, make_records(RECORDS, seed=33, prefix=f"{name}-"), partitions=2)
    role = pair.add_role(name, owner_grants())
    failover_dsn = (
        "target_session_attrs=read-write" in role.dsn and f"{pair.primary.port},{pair.standby.port}" in role.dsn
    )
    assert failover_dsn  # the role's DSN names both servers (not shown: it holds the password)
    return Pipeline(
        "2pc",
        kafka_service.bootstrap,
        name,
        role.dsn,
        pair.dsn,
        name,
        str(workdir / name),
        PER_TRIGGER,
        kafka_config=getattr(kafka_service, "app_config", None),
    )


def _prepared(dsn: str, sink_id: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return checker.prepared_gids(conn, sink_id)


def test_f33_primary_killed_with_a_decided_batch_prepared_and_the_promoted_standby_finishes_it(
    make_pair: Any, kafka_service: Any, grant_topic: Any, tmp_path: Any
) -> None:
    pair = make_pair(True)
    pipe = _pipeline(pair, kafka_service, grant_topic, tmp_path)
    proc = pipe.process("sink.commit.after_decision:batch=2:action=sleep:seconds=8:once", state="F33").start()
    try:
        wait_until(
            lambda: pipe.fired("sink.commit.after_decision", batch=2), timeout=300, what="F33 hold", alive=proc.alive
        )
        # decided, not committed: the batch's prepared transactions on the primary, whose standby has flushed
        # every WAL record (a hot standby lists no prepared transaction: the promoted one shows them below)
        in_doubt = [g for g in _prepared(pair.primary_dsn, pipe.sink_id) if f"{pipe.sink_id}:2:" in g]
        assert in_doubt and pair.replication_state()["sync_state"] == "sync", in_doubt
        proof = pair.failover("sigkill")
        out = proc.wait(400)
    finally:
        proc.stop()
    pipe.outcomes.append(out)
    assert proof["old_primary_gone"] and proof["dsn_reaches_new_primary"], proof
    if out.returncode != 0:  # the committer may give up on the dead primary: the restart finishes the batch
        assert out.returncode == 2 and not out.killed, pipe.describe()
        assert pipe.run().returncode == 0, pipe.describe()
    report = pipe.report(min_faults=1)
    assert report.ok, f"{report.table()}\n{pipe.describe()}"
    assert not _prepared(pair.dsn, pipe.sink_id)
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone() == (pair.standby.port, False)
        # each in-doubt transaction was committed on the promoted standby: its marker row (written inside it) is there
        markers = [r[0] for r in conn.execute("SELECT gid FROM eos.sink_parts WHERE gid = ANY(%s)", (in_doubt,))]
    assert sorted(markers) == sorted(in_doubt), (markers, in_doubt)


def test_f34_batches_lost_in_an_asynchronous_failover_are_refused_by_name_then_replayed_exactly_once(
    make_pair: Any, kafka_service: Any, grant_topic: Any, tmp_path: Any
) -> None:
    pair = make_pair(False)
    pipe = _pipeline(pair, kafka_service, grant_topic, tmp_path)
    # batches 0-1 committed and replicated
    out = pipe.run("sink.after_commit:batch=1:action=kill-group:once", state="replicated")
    assert out.killed and pipe.fired("sink.after_commit", batch=1), pipe.describe()
    pair.wait_replicating()
    # the standby stops; batches 2-4 commit on the primary alone (Spark's commits/ reach 3: the kill comes
    # after the sink's commit of 4, before Spark's)
    pair.hold_replication()
    out = pipe.run("sink.after_commit:batch=4:action=kill-group:once", state="alone")
    assert out.killed and pipe.fired("sink.after_commit", batch=4), pipe.describe()
    assert sorted(int(n) for n in os.listdir(os.path.join(pipe.checkpoint, "commits")) if n.isdigit())[-1] == 3
    proof = pair.failover("sigkill")
    assert proof["old_primary_gone"] and proof["dsn_reaches_new_primary"], proof
    with psycopg.connect(pair.dsn, autocommit=True) as conn:  # what the promoted standby had: decisions 0-1
        decided = [
            r[0]
            for r in conn.execute(
                "SELECT batch_id FROM eos.sink_batches WHERE sink_id = %s ORDER BY 1", (pipe.sink_id,)
            )
        ]
    assert decided == [0, 1], decided

    # the restarted query is refused before it writes: batches 2-3 named, the replay given
    refused = pipe.run(state="refused")
    assert refused.returncode != 0 and not refused.killed, pipe.describe()
    with open(pipe.log_path, encoding="utf-8", errors="replace") as fh:
        log = fh.read()
    assert "the database lost batches 2..3" in log and "--batch 1" in log, pipe.describe()
    assert not _prepared(pair.dsn, pipe.sink_id)
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT max(batch_id) FROM eos.sink_batches WHERE sink_id = %s", (pipe.sink_id,)
        ).fetchone() == (1,)

    # the documented replay: a savepoint as of batch 1, restored in the checkpoint's place
    lost = pipe.checkpoint + ".lost"
    os.rename(pipe.checkpoint, lost)
    cli = [sys.executable, "-m", "connectors.cli", "savepoint"]
    savepoint = str(tmp_path / "as-of-1")
    subprocess.run([*cli, "create", lost, savepoint, "--batch", "1"], check=True, capture_output=True, timeout=60)
    subprocess.run([*cli, "restore", savepoint, pipe.checkpoint], check=True, capture_output=True, timeout=60)
    assert pipe.run(state="replay").returncode == 0, pipe.describe()
    report = pipe.report(min_faults=2)
    assert report.ok, f"{report.table()}\n{pipe.describe()}"
