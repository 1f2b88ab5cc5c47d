"""Two-phase sink under crashes: kill the query's process group at every protocol step, restart, check.

The steps after the decision that the crash matrix already kills, with the same checks of which attempt
wins, are not repeated here: half-way through the COMMIT PREPAREDs (F3, ``sink.commit.after_k``) and
after all of them, before Spark's commit log (F4, ``sink.after_commit``), in ``test_f1_to_f8[2pc]`` and
``[2pc-partition]``; so is visibility=partition after PREPARE (F2)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors.toolkit.chaos.proxy import TcpProxy
from integration import test_twophase_support as support
from integration.test_twophase_support import Scenario
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared

twophase_pg = support.twophase_pg  # the shared fixture

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

ROWS = 6  # per batch: tiny, the protocol is what is tested

# (fault point, batch it fires in, extra condition, which attempt's rows must win that batch)
KILLS = [
    ("sink.after_write", 0, "", "replay"),  # rows written, not prepared: the replay's rows
    ("sink.after_prepare", 1, ":partition=0", "replay"),  # prepared, undecided: rolled back, replayed
    ("sink.commit.before_decision", 2, "", "replay"),
    ("sink.commit.after_decision", 3, "", "killed"),  # decided: the killed run's rows, never the replay's
]


class Reader(threading.Thread):
    """Counts rows per batch in one statement, over and over, while a run writes."""

    def __init__(self, dsn: str, table: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.rows = dsn, table, rows
        self.stop = threading.Event()
        self.partial: list[tuple[int, int]] = []
        self.totals: set[int] = set()
        self.polls = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                counts = conn.execute(f"SELECT batch, count(*) FROM {self.table} GROUP BY batch").fetchall()  # type: ignore[arg-type]
                self.polls += 1
                self.partial += [(int(b), int(n)) for b, n in counts if n != self.rows]
                self.totals.add(sum(int(n) for _, n in counts))
                time.sleep(0.02)


def _kill_at(s: Scenario, point: str, batch: int, cond: str) -> str:
    run = s.run(f"{point}:batch={batch}{cond}:action=kill-group:once")
    assert run.killed, (
        f"{point}: expected the process group to be killed, got rc={run.returncode}: {run.stderr[-2000:]}"
    )
    hits = [e for e in s.fired(point) if int(e["batch"]) == batch]
    assert len(hits) == 1, f"{point} batch {batch} should have fired once: {hits}"
    return run.tag


def test_kill_at_each_step_up_to_the_decision_then_pg_crash_task_kill_and_connection_cut(
    twophase_pg: Any, tmp_path: Path
) -> None:
    """One sink, five runs: each of the first four dies at one protocol step (the whole process
    group, SIGKILL), the next resumes from the checkpoint. After the after_prepare kill Postgres
    itself crashes (-m immediate) with the prepared transactions in place. The last run also has a
    writer task killed after PREPARE (a task retry under local[2,2]), the connection cut right
    after a COMMIT PREPARED reached the server, and a concurrent reader counting rows per batch."""
    s = Scenario(twophase_pg.dsn, tmp_path, batches=len(KILLS) + 2, rows=ROWS)
    winners: dict[int, str] = {}
    for point, batch, cond, winner in KILLS:
        tag = _kill_at(s, point, batch, cond)
        if winner == "killed":
            winners[batch] = tag
        s.check(complete=False)  # after every crash: whole batches, one attempt each, no duplicate
        if point == "sink.after_prepare":
            with psycopg.connect(s.dsn, autocommit=True) as conn:
                assert list_prepared(conn, s.sink_id), "the kill after PREPARE should leave prepared transactions"
            twophase_pg.crash()  # pg_ctl stop -m immediate: prepared transactions must survive it
            twophase_pg.start()
            with psycopg.connect(s.dsn, autocommit=True) as conn:
                assert list_prepared(conn, s.sink_id), "prepared transactions did not survive the crash"

    reader = Reader(s.dsn, s.name, ROWS)
    reader.start()
    params = psycopg.conninfo.conninfo_to_dict(s.dsn)
    host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
    # on a TLS server the proxy ends the client's TLS (with the server's certificate) to see the SQL
    with TcpProxy(host, port, postgres_tls=getattr(twophase_pg, "tls_files", None)) as proxy:
        proxy.reset_on(b"COMMIT PREPARED", times=1)
        via_proxy = psycopg.conninfo.make_conninfo(s.dsn, host="127.0.0.1", port=str(proxy.port))
        last_batch = len(KILLS) + 1
        final = s.run(f"sink.after_prepare:batch={last_batch}:partition=1:action=kill:once", dsn=via_proxy)
        hits, resets = proxy.stats.pattern_hits, proxy.stats.resets
    reader.stop.set()
    reader.join(10)
    assert final.returncode == 0, final.stderr[-3000:]
    assert hits == 1 and resets >= 1, f"the connection cut during COMMIT PREPARED did not happen: {proxy.stats}"
    task_kill = s.fired("sink.after_prepare")[-1]
    assert int(task_kill["batch"]) == last_batch and task_kill["action"] == "kill"

    tags = s.check(complete=True)
    for batch, tag in winners.items():
        assert tags[batch] == tag, f"batch {batch} was decided in {tag}, but rows of {tags[batch]} are visible"
    for _point, batch, _cond, winner in KILLS:
        if winner == "replay":
            assert tags[batch] != f"run{batch + 1}", f"batch {batch}: rows of the killed attempt became visible"
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        decision = ProtocolTables().decision(conn, s.sink_id, last_batch)
        assert decision is not None
        # the retried task's gid won: partition 1 is there, from another task attempt than the killed one
        part1 = [g for g in decision.gids if g.split(":")[3] == "1"]
        assert len(part1) == 1 and int(part1[0].rsplit(":", 1)[1]) != int(task_kill["task"]), (decision.gids, task_kill)
    assert not reader.partial, f"a reader saw part of a batch: {reader.partial[:5]}"
    assert reader.polls > 10 and len(reader.totals) > 1, "the reader did not watch the table change"


def test_upsert_mode_under_faults(twophase_pg: Any, tmp_path: Path) -> None:
    """mode=upsert (the merge runs in the publish step): kills before the decision, after it and
    half-way through the COMMIT PREPAREDs, then a clean run: exactly the records, one attempt each."""
    s = Scenario(twophase_pg.dsn, tmp_path, batches=4, rows=ROWS, mode="upsert")
    killed = _kill_at(s, "sink.after_prepare", 0, ":partition=0")
    s.check(complete=False)
    decided = _kill_at(s, "sink.commit.after_decision", 1, "")
    s.check(complete=False)
    half = _kill_at(s, "sink.commit.after_k", 2, ":k=1")
    final = s.run()
    assert final.returncode == 0, final.stderr[-3000:]
    tags = s.check(complete=True)
    assert tags[0] != killed and tags[1] == decided and tags[2] == half
