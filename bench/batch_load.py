"""Benchmark: a big batch load (``df.write``) through each sink, against Spark's JDBC writer and the limit.

Run: ``.venv/bin/python -m bench.batch_load [--quick] [--rows N] [--dsn URL]``.

One run, the same data for every contender: ``--rows`` rows (default 1M) of ``id bigint, k text,
v text`` (v is 100 bytes), a DataFrame cached in Spark with 2 partitions, each contender into a
fresh LOGGED table, every table checked afterwards to hold exactly the input ids:

- ``limit: 2 processes binary COPY``: two Python processes, each COPYing its half (pgpq-encoded
  Arrow, the same bytes the sinks send) in one transaction: the physical limit on 2 cores; the same
  into a table with a primary key is the limit of ``postgres-upsert`` (whose target has one);
- ``spark jdbc``: ``df.write.jdbc(...)`` (at-least-once; needs the PostgreSQL JDBC jar:
  ``apt-get install libpostgresql-jdbc-java``; skipped with a message without it), into a heap and,
  as the peer of ``postgres-upsert`` (whose table has its key), into a table with a primary key;
- ``postgres-2pc visibility=partition``, ``postgres-2pc visibility=batch`` (``sink.id`` + ``batch.id``);
- ``postgres-upsert`` (key ``id``).

Printed: seconds, rows/s, each contender's time against JDBC's and against the limit's. Also the
peak RSS of the writer's Python worker processes (ru_maxrss of children). Postgres: ``--dsn`` or
EOS_POSTGRES_DSN, else a throwaway cluster from the system binaries.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import uuid
from typing import Any

import psycopg
import pyarrow as pa

from bench.upsert import bench_session, find_jdbc_jar, throwaway_postgres

__all__ = ["main"]


def _half(rows: int, part: int) -> pa.RecordBatch:
    lo, hi = (0, rows // 2) if part == 0 else (rows // 2, rows)
    ids = pa.array(range(lo, hi), pa.int64())
    k = pa.array([f"k{i % 1000}" for i in range(lo, hi)])
    v = pa.array([f"{i:012d}" + "x" * 88 for i in range(lo, hi)])
    return pa.RecordBatch.from_arrays([ids, k, v], names=["id", "k", "v"])


def _copy_half(dsn: str, table: str, rows: int, part: int, ready: Any, go: Any) -> None:
    import pgpq

    batch = _half(rows, part)
    chunks = [batch.slice(o, 65536) for o in range(0, batch.num_rows, 65536)]
    with psycopg.connect(dsn) as conn:
        ready.set()
        go.wait()
        enc = pgpq.ArrowToPostgresBinaryEncoder(batch.schema)
        with conn.cursor() as cur, cur.copy(f"COPY {table} (id, k, v) FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(enc.write_header())
            for c in chunks:
                cp.write(enc.write_batch(c))
            cp.write(enc.finish())
        conn.commit()


def bench_limit(dsn: str, table: str, rows: int) -> float:
    ctx = mp.get_context("fork")
    ready = [ctx.Event(), ctx.Event()]
    go = ctx.Event()
    procs = [ctx.Process(target=_copy_half, args=(dsn, table, rows, p, ready[p], go)) for p in (0, 1)]
    for p in procs:
        p.start()
    for r in ready:
        r.wait(120)
    t0 = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError("a COPY process failed")
    return time.perf_counter() - t0


def _table(conn: psycopg.Connection, name: str, *, key: bool) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {name}")  # type: ignore[arg-type]
    conn.execute(f"CREATE TABLE {name} (id bigint{' PRIMARY KEY' if key else ''}, k text, v text)")  # type: ignore[arg-type]


def _make(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _table(conn, name, key=False)
    return True


def _check(conn: psycopg.Connection, name: str, rows: int) -> str:
    n, distinct, lo, hi = conn.execute(f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {name}").fetchone()  # type: ignore[arg-type, misc]
    ok = n == distinct == rows and lo == 0 and hi == rows - 1
    return "exact" if ok else f"WRONG: {n} rows, {distinct} distinct, ids {lo}..{hi}"


def run(dsn: str, rows: int) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    jar = find_jdbc_jar()
    spark = bench_session(
        "bench-batch-load", **{"spark.driver.memory": "4g", "spark.sql.execution.arrow.maxRecordsPerBatch": "65536"}
    )
    df = (
        spark.range(0, rows, 1, 2)
        .selectExpr(
            "id", "concat('k', id % 1000) AS k", "concat(lpad(cast(id AS string), 12, '0'), repeat('x', 88)) AS v"
        )
        .cache()
    )
    assert df.count() == rows
    results: list[tuple[str, float | None, str]] = []
    suffix = uuid.uuid4().hex[:6]

    def timed(name: str, table: str, key: bool, write: Any) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _table(conn, table, key=key)
        t0 = time.perf_counter()
        write(table)
        secs = time.perf_counter() - t0
        with psycopg.connect(dsn, autocommit=True) as conn:
            results.append((name, secs, _check(conn, table, rows)))
        print(f"  {name}: {secs:.2f}s", flush=True)

    def limit(table: str) -> None:
        bench_limit(dsn, table, rows)

    def jdbc(table: str) -> None:
        url = "jdbc:postgresql://" + dsn.split("@", 1)[-1]
        user = dsn.split("//", 1)[1].split("@", 1)[0].split(":", 1)[0]
        df.write.jdbc(url, table, mode="append", properties={"user": user, "driver": "org.postgresql.Driver"})

    def twopc(visibility: str) -> Any:
        def write(table: str) -> None:
            (
                df.write.format("postgres-2pc")
                .option("dsn", dsn)
                .option("table", table)
                .option("sink.id", f"bench-{table}")
                .option("batch.id", "1")
                .option("visibility", visibility)
                .mode("append")
                .save()
            )

        return write

    def upsert(table: str) -> None:
        df.write.format("postgres-upsert").option("dsn", dsn).option("table", table).option("key", "id").mode(
            "append"
        ).save()

    timed("limit: 2 processes binary COPY", f"bl_limit_{suffix}", False, limit)
    timed("limit into a keyed table", f"bl_limitk_{suffix}", True, limit)
    if jar:
        timed("spark jdbc (df.write.jdbc)", f"bl_jdbc_{suffix}", False, jdbc)
        timed("spark jdbc into a keyed table", f"bl_jdbck_{suffix}", True, jdbc)
    else:
        results.append(("spark jdbc (df.write.jdbc)", None, "SKIPPED: apt-get install libpostgresql-jdbc-java"))
    # A first sink write warms the Python workers and the setup cache for all of them (not timed).
    twopc("batch")(f"bl_warm_{suffix}") if _make(dsn, f"bl_warm_{suffix}") else None
    timed("postgres-2pc visibility=partition", f"bl_2pcp_{suffix}", False, twopc("partition"))
    timed("postgres-2pc visibility=batch", f"bl_2pcb_{suffix}", False, twopc("batch"))
    timed("postgres-upsert (key id)", f"bl_up_{suffix}", True, upsert)
    spark.stop()

    secs = {name: s for name, s, _ in results if s is not None}
    base_limit = secs["limit: 2 processes binary COPY"]
    base_jdbc = secs.get("spark jdbc (df.write.jdbc)")
    keyed_jdbc = secs.get("spark jdbc into a keyed table")
    print(f"\nbatch load: {rows:,} rows (id bigint, k text, v text 100 B), 2 partitions, logged tables, one run")
    print("| writer | seconds | rows/s | x Spark JDBC | x JDBC, keyed table | x the limit | rows |")
    print("|---|---|---|---|---|---|---|")
    for name, s, check in results:
        if s is None:
            print(f"| {name} | | | | | | {check} |")
            continue
        vs_jdbc = f"{base_jdbc / s:.2f}x" if base_jdbc else "n/a"
        vs_keyed = f"{keyed_jdbc / s:.2f}x" if keyed_jdbc else "n/a"
        print(f"| {name} | {s:.2f} | {rows / s:,.0f} | {vs_jdbc} | {vs_keyed} | {base_limit / s:.2f}x | {check} |")
    print("(x Spark JDBC = JDBC's time / this time: above 1 is faster; x the limit = limit's time / this time;")
    print(" the keyed table is the peer of postgres-upsert, whose target needs its key's unique index)")
    return 0 if all(check in ("exact",) or check.startswith("SKIPPED") for _, _, check in results) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch_load")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="100k rows")
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    args = p.parse_args(argv)
    rows = 100_000 if args.quick else args.rows
    if args.dsn:
        return run(args.dsn, rows)
    with throwaway_postgres() as dsn:
        return run(dsn, rows)


if __name__ == "__main__":
    sys.exit(main())
