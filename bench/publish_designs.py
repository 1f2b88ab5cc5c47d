"""Benchmark: what a ``postgres-2pc`` ``visibility=batch`` publish costs under each candidate design.

Run: ``.venv/bin/python -m bench.publish_designs [--rows N] [--repeat R] [--dsn URL]``.

Server side only, no Spark: one batch of ``--rows`` rows (default 1M, ``id bigint, k text, v text``
with v 100 bytes, as ``bench.batch_load``) made visible to readers all at once, by each design, in
one transaction on one connection, after a CHECKPOINT. Printed per design: the publish's wall time,
the PostgreSQL server's CPU seconds for it (``bench._cpu``), and what a reader (a role that is not a
superuser: superusers bypass row-level security even when it is FORCE'd) then pays to count the
batch (readers must never see part of a batch: invariant I3 of docs/postgres-2pc.md). Medians of
``--repeat`` rounds (default 3).

- **now**: tasks staged the rows in per-task tables; the publish copies them into the target
  (``INSERT ... SELECT``) and drops the staging tables: every row written twice.
- **now, UNLOGGED staging**: the same from unlogged staging tables (a crash empties an unlogged
  table, so a decided batch whose publish had not run could not be published: breaks I3's
  roll-forward; measured to see what it would buy).
- **ATTACH PARTITION**: the target is partitioned by a hidden text column; each task's table is
  attached as a partition (append-only targets whose owner accepts the partitioning).
- **flip**: tasks write straight into the target with a batch column (inside their prepared
  transactions); the publish inserts one row into a ``published`` table; readers read through a view
  that joins it.
- **flip with row-level security**: the same with a FORCE'd RLS policy instead of a view, so readers
  keep the table's name (the table's owner and superusers bypass RLS unless FORCE; BYPASSRLS roles
  always do).

A last part checks a design that needs no reader change and is *refused*: rows written straight into
the target in prepared transactions, and a lock barrier (``LOCK ... ACCESS EXCLUSIVE`` queued behind
them) held while they commit. A REPEATABLE READ reader whose snapshot falls between two COMMIT
PREPAREDs sees part of the batch, so a lock cannot make several commits one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

import psycopg

from bench._cpu import _subtree, _table
from bench.upsert import throwaway_postgres

__all__ = ["main"]

TICK = os.sysconf("SC_CLK_TCK")
FILL = "SELECT g, 'k' || (g % 1000), lpad(g::text, 12, '0') || repeat('x', 88) FROM generate_series({lo}, {hi}) g"
RESET = ["DROP VIEW IF EXISTS v", "DROP TABLE IF EXISTS t, s1, s2, published CASCADE"]


def _server_cpu(postmaster: int) -> float:
    t = _table()
    return sum(sum(t[p][1:]) for p in _subtree(t, postmaster)) / TICK


def _grant_reader(c: Any) -> None:
    c.execute("DO $$ BEGIN CREATE ROLE eos_bench_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    c.execute("GRANT USAGE ON SCHEMA public TO eos_bench_reader")
    c.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO eos_bench_reader")


def measure(
    dsn: str, postmaster: int, rows: int, repeat: int, label: str, setup: list[str], publish: list[str], read: str
) -> None:
    walls, cpus, reads = [], [], []
    for _ in range(repeat):
        with psycopg.connect(dsn, autocommit=True) as c:
            for sql in setup:
                c.execute(sql)  # type: ignore[arg-type]
            c.execute("CHECKPOINT")
            cpu0 = _server_cpu(postmaster)
            t0 = time.perf_counter()
            with c.transaction():
                for sql in publish:
                    c.execute(sql)  # type: ignore[arg-type]
            walls.append(time.perf_counter() - t0)
            cpus.append(_server_cpu(postmaster) - cpu0)
            c.execute("SET ROLE eos_bench_reader")  # not a superuser: superusers bypass row-level security
            t0 = time.perf_counter()
            row = c.execute(read).fetchone()  # type: ignore[arg-type]
            reads.append(time.perf_counter() - t0)
            c.execute("RESET ROLE")
            if row is None or row[0] != rows:
                raise SystemExit(f"{label}: the reader counted {row}, not {rows:,}")
    print(
        f"| {label} | {statistics.median(walls):.3f} | {statistics.median(cpus):.2f} | {statistics.median(reads):.3f} |",
        flush=True,
    )


def designs(dsn: str, rows: int, repeat: int) -> None:
    half = rows // 2
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        postmaster = _table()[row[0]][0]
        _grant_reader(c)
    staged = [
        *RESET,
        "CREATE TABLE t (id bigint, k text, v text)",
        "CREATE TABLE s1 (id bigint, k text, v text)",
        "CREATE TABLE s2 (id bigint, k text, v text)",
        "INSERT INTO s1 " + FILL.format(lo=0, hi=half - 1),
        "INSERT INTO s2 " + FILL.format(lo=half, hi=rows - 1),
    ]
    copy = ["INSERT INTO t SELECT * FROM s1 UNION ALL SELECT * FROM s2", "DROP TABLE s1", "DROP TABLE s2"]
    parted = [
        *RESET,
        "CREATE TABLE t (id bigint, k text, v text, eos_part text NOT NULL) PARTITION BY LIST (eos_part)",
        "CREATE TABLE s1 (id bigint, k text, v text, eos_part text NOT NULL CHECK (eos_part = 'b1p0'))",
        "CREATE TABLE s2 (id bigint, k text, v text, eos_part text NOT NULL CHECK (eos_part = 'b1p1'))",
        "INSERT INTO s1 SELECT *, 'b1p0' FROM (" + FILL.format(lo=0, hi=half - 1) + ") x",
        "INSERT INTO s2 SELECT *, 'b1p1' FROM (" + FILL.format(lo=half, hi=rows - 1) + ") x",
    ]
    flagged = [
        *RESET,
        "CREATE TABLE t (id bigint, k text, v text, eos_batch bigint NOT NULL)",
        "CREATE TABLE published (batch bigint PRIMARY KEY)",
        "INSERT INTO t SELECT *, 1 FROM (" + FILL.format(lo=0, hi=rows - 1) + ") x",
    ]
    view = [*flagged, "CREATE VIEW v AS SELECT id, k, v FROM t WHERE eos_batch IN (SELECT batch FROM published)"]
    rls = [
        *flagged,
        "ALTER TABLE t ENABLE ROW LEVEL SECURITY",
        "ALTER TABLE t FORCE ROW LEVEL SECURITY",
        "CREATE POLICY p ON t USING (eos_batch IN (SELECT batch FROM published))",
    ]
    flip = ["INSERT INTO published VALUES (1)"]
    print(
        f"\npublish of one batch of {rows:,} rows staged by 2 tasks, medians of {repeat}, load {os.getloadavg()[0]:.2f}\n"
    )
    print("| design | publish wall s | server CPU s | reader: count(*) of the batch, s |")
    print("|---|---|---|---|")
    count = "SELECT count(*) FROM t"
    measure(
        dsn, postmaster, rows, repeat, "now: INSERT ... SELECT of the staging tables, then DROP", staged, copy, count
    )
    unlogged = [s.replace("CREATE TABLE s", "CREATE UNLOGGED TABLE s") for s in staged]
    measure(dsn, postmaster, rows, repeat, "now, from UNLOGGED staging tables (breaks I3)", unlogged, copy, count)
    attach = [f"ALTER TABLE t ATTACH PARTITION s{i + 1} FOR VALUES IN ('b1p{i}')" for i in range(2)]
    measure(dsn, postmaster, rows, repeat, "ATTACH PARTITION of each task's table", parted, attach, count)
    measure(
        dsn,
        postmaster,
        rows,
        repeat,
        "flip: one row into `published`, readers use a view",
        view,
        flip,
        "SELECT count(*) FROM v",
    )
    measure(dsn, postmaster, rows, repeat, "flip: one row into `published`, FORCE'd RLS policy", rls, flip, count)
    with psycopg.connect(dsn, autocommit=True) as c:
        for sql in [
            *RESET,
            "CREATE TABLE t (id bigint, k text, v text)",
            "INSERT INTO t " + FILL.format(lo=0, hi=rows - 1),
        ]:
            c.execute(sql)  # type: ignore[arg-type]
        c.execute("SET ROLE eos_bench_reader")
        t0 = time.perf_counter()
        c.execute(count).fetchone()
        print(f"| (a plain table's count(*), for the reader column) | | | {time.perf_counter() - t0:.3f} |")


def lock_barrier(dsn: str) -> bool:
    """True when a REPEATABLE READ reader sees part of a batch whose prepared transactions commit behind a lock."""
    adm = psycopg.connect(dsn, autocommit=True)
    try:
        for sql in [*RESET, "DROP TABLE IF EXISTS other", "CREATE TABLE t (id bigint)", "CREATE TABLE other (x int)"]:
            adm.execute(sql)  # type: ignore[arg-type]
        for gid, lo in (("eos_bench_g1", 0), ("eos_bench_g2", 100)):
            with psycopg.connect(dsn) as c:
                c.execute(f"INSERT INTO t SELECT generate_series({lo}, {lo + 99})")  # type: ignore[arg-type]
                c.execute(f"PREPARE TRANSACTION '{gid}'")  # type: ignore[arg-type]
        barrier, committer = psycopg.connect(dsn), psycopg.connect(dsn, autocommit=True)
        locker = threading.Thread(target=lambda: barrier.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE"))
        locker.start()
        time.sleep(0.3)  # the lock request queues behind the prepared transactions' locks
        committer.execute("COMMIT PREPARED 'eos_bench_g1'")
        snap = psycopg.connect(dsn)
        snap.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snap.execute("SELECT * FROM other").fetchall()  # the snapshot: g1 committed, g2 not
        seen: dict[str, Any] = {}
        reader = threading.Thread(target=lambda: seen.update(n=snap.execute("SELECT count(*) FROM t").fetchone()))
        reader.start()
        time.sleep(0.3)
        committer.execute("COMMIT PREPARED 'eos_bench_g2'")
        locker.join()
        barrier.commit()
        reader.join()
        n = seen["n"][0]
        print(f"\nlock barrier: a REPEATABLE READ reader whose snapshot fell between the commits saw {n} of 200 rows")
        for c in (barrier, committer, snap):
            c.close()
        return bool(n != 200)
    finally:
        adm.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.publish_designs", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    args = p.parse_args(argv)
    if args.dsn:
        designs(args.dsn, args.rows, args.repeat)
        lock_barrier(args.dsn)
        return 0
    with throwaway_postgres() as dsn:
        designs(dsn, args.rows, args.repeat)
        lock_barrier(dsn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
