"""Benchmark: what refused rows cost each sink with ``errors.tolerance=all`` (dead-letter table).

Run: ``.venv/bin/python -m bench.dead_letters [--quick] [--rows N] [--repeat R] [--dsn URL]``.

One run, the same cached DataFrame of ``--rows`` rows (default 1M; ``--quick`` 200k) in 2 Spark
partitions, ``id bigint, v text, n double``, written by each sink (``postgres-2pc`` append with
``visibility=batch`` and ``visibility=partition``, ``postgres-upsert`` keyed by ``id``) into a
fresh table with ``CHECK (n >= 0)``:

- ``no option``: the plain write (the peer: what a user pays today);
- ``errors=all, R refused`` for R = 0 %, 0.1 %, 1 %: ``n`` is negative on every 1000th / 100th row,
  so the table refuses those rows and the sink diverts them to the dead-letter table.

Each result is checked: the table holds exactly the rows not refused, the dead-letter table exactly
the refused ones. Printed: seconds, rows/s and each contender's speed against the same sink without
the option (>1 = faster). Postgres: ``--dsn`` or EOS_POSTGRES_DSN, else a throwaway cluster.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import psycopg

from bench.upsert import bench_session, throwaway_postgres

__all__ = ["main"]

SINKS = ("postgres-2pc visibility=batch", "postgres-2pc visibility=partition", "postgres-upsert")
CASES: dict[str, int | None] = {"no option": None, "0% refused": 0, "0.1% refused": 1000, "1% refused": 100}


def run(dsn: str, rows: int, repeat: int) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    spark = bench_session("bench-dead-letters")
    conn = psycopg.connect(dsn, autocommit=True)
    base = spark.range(0, rows, numPartitions=2).select(
        F.col("id"),
        F.concat(F.lit("value-"), F.col("id").cast("string")).alias("v"),
        (F.col("id") * 0.5).alias("n"),
    )
    data = {
        every: (
            base
            if not every
            else base.withColumn("n", F.when(F.col("id") % every == every - 1, F.lit(-1.0)).otherwise(F.col("n")))
        ).cache()
        for every in {e or 0 for e in CASES.values()}
    }
    for df in data.values():
        df.count()

    def write(sink: str, every: int | None, table: str) -> float:
        conn.execute(f'DROP TABLE IF EXISTS "{table}", "{table}_dl"')  # type: ignore[arg-type]
        pk = " PRIMARY KEY" if sink == "postgres-upsert" else ""
        conn.execute(f'CREATE TABLE "{table}" (id bigint{pk}, v text, n double precision CHECK (n >= 0))')  # type: ignore[arg-type]
        fmt, _, visibility = sink.partition(" visibility=")
        w = data[every or 0].write.format(fmt).option("dsn", dsn).option("table", table)
        if fmt == "postgres-2pc":
            w = w.option("sink.id", table).option("batch.id", "1").option("visibility", visibility)
        else:
            w = w.option("key", "id")
        if every is not None:
            w = w.option("errors.tolerance", "all").option("errors.table", f"{table}_dl")
        start = time.perf_counter()
        w.mode("append").save()
        secs = time.perf_counter() - start
        refused = len(range(every - 1, rows, every)) if every else 0
        got = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()  # type: ignore[arg-type]
        letters = conn.execute(f'SELECT count(*) FROM "{table}_dl"').fetchone() if every is not None else (0,)  # type: ignore[arg-type]
        if got != (rows - refused,) or letters != (refused,):
            raise AssertionError(f"WRONG RESULT for {sink}, {every}: {got} rows, {letters} dead letters")
        conn.execute(f'DROP TABLE IF EXISTS "{table}", "{table}_dl"')  # type: ignore[arg-type]
        return secs

    write("postgres-upsert", None, "dl_warm")  # start the Python workers and the JVM paths once
    best: dict[tuple[str, str], float] = {}
    for _ in range(repeat):  # rounds interleave the contenders: other load hits them alike
        for sink in SINKS:
            for case, every in CASES.items():
                secs = write(sink, every, f"dl_{uuid.uuid4().hex[:8]}")
                best[(sink, case)] = min(secs, best.get((sink, case), secs))
    spark.stop()
    conn.close()

    print(f"\ndead-letter benchmark: {rows:,} rows, 2 Spark tasks, logged tables, best of {repeat} round(s)\n")
    print(f"{'sink':<36} {'case':<14} {'seconds':>8} {'rows/s':>11} {'vs no option':>13}")
    for sink in SINKS:
        plain = best[(sink, "no option")]
        for case in CASES:
            secs = best[(sink, case)]
            print(f"{sink:<36} {case:<14} {secs:8.2f} {rows / secs:11,.0f} {plain / secs:12.2f}x")
    print("\nrefused: rows the table's CHECK refuses, diverted to the dead-letter table (errors.tolerance=all).")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200k rows")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the best time of each contender counts")
    args = p.parse_args(argv)
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    if args.dsn:
        return run(args.dsn, rows, args.repeat)
    with throwaway_postgres() as dsn:
        return run(dsn, rows, args.repeat)


if __name__ == "__main__":
    raise SystemExit(main())
