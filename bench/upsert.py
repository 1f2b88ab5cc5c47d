"""Benchmark: postgres-upsert vs Spark's JDBC writer vs one process doing the same COPY + merge.

Run: ``.venv/bin/python -m bench.upsert [--quick] [--rows N] [--keys K] [--dsn URL] [--repeat N]``.

Same data for every contender (``--rows`` rows, ``--keys`` distinct keys, 10 rows per key by
default, two Spark partitions that do not share keys), each into a fresh LOGGED table:

- ``postgres-upsert``: ``df.write.format("postgres-upsert")`` with key and version (2 tasks);
- ``postgres-upsert replay``: the same write again (every row a no-op under the version guard);
- ``errors.tolerance=all, R refused``: the same write with a dead-letter table into a table whose
  ``CHECK (n >= 0)`` refuses R of the rows (0 %, 0.1 %, 1 %; n set to -1 on the last version of
  every 100th / 10th key, rows the merge would write): the cost of finding and diverting them
  against the same load with none refused;
- ``jdbc (foreachBatch)``: Spark's JDBC writer, what a foreachBatch sink does: plain INSERTs into a
  table without a key (at-least-once; the PostgreSQL JDBC jar is fetched once, see ``bench._jdbc``);
- ``limit: 1 process COPY+merge``: this process alone, the same Arrow data, binary COPY into a
  staging table and the same INSERT ... ON CONFLICT (``merge_staged``): no Spark at all.

Postgres: ``--dsn`` or EOS_POSTGRES_DSN, else a throwaway cluster from the system binaries.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pyarrow as pa

from connectors.services._proc import free_port

__all__ = ["main"]


def find_jdbc_jar() -> str:
    """The PostgreSQL JDBC jar of the JDBC peers (``bench._jdbc``: fetched from Maven Central once)."""
    from bench._jdbc import jdbc_jar

    return jdbc_jar()


def bench_session(app: str, **conf: str) -> Any:
    """The benchmarks' SparkSession: ``local[2]`` (no task retries), quiet, every format registered,
    the PostgreSQL JDBC jar on the classpath (for the JDBC peers; fetched once, see ``bench._jdbc``)."""
    from connectors.services.spark import local_session

    conf.setdefault("spark.jars", find_jdbc_jar())
    return local_session(app, "local[2]", **conf)


@contextmanager
def throwaway_postgres(settings: dict[str, str] | None = None) -> Iterator[str]:
    """A temporary cluster (initdb/pg_ctl), run as user 'postgres' when we are root.

    Stock postgresql.conf except what the two-phase sink needs (``max_prepared_transactions=16``);
    ``settings`` adds or overrides server settings (``{"shared_buffers": "256MB"}``)."""
    root = tempfile.mkdtemp(prefix="eos-bench-pg-")
    data = os.path.join(root, "data")
    port = free_port()
    run_as: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, "initdb", "-D", data, "-A", "trust", "-U", "postgres"], check=True, capture_output=True)
    conf = {"listen_addresses": "127.0.0.1", "max_prepared_transactions": "16", **(settings or {})}
    opts = f"-p {port} -k {root} " + " ".join(f"-c {k}={v}" for k, v in conf.items())
    subprocess.run(
        [*run_as, "pg_ctl", "-D", data, "-o", opts, "-l", os.path.join(root, "log"), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def make_table(conn: psycopg.Connection, name: str, *, key: bool, check: bool = False) -> None:
    conn.execute(f'DROP TABLE IF EXISTS "{name}"')  # type: ignore[arg-type]
    pk = " PRIMARY KEY" if key else ""
    n = " CHECK (n >= 0)" if check else ""
    conn.execute(f'CREATE TABLE "{name}" (k bigint{pk}, v text, n double precision{n}, ver bigint)')  # type: ignore[arg-type]


def arrow_data(rows: int, per_key: int) -> pa.RecordBatch:
    import numpy as np

    ids = np.arange(rows, dtype=np.int64)
    return pa.record_batch(
        {
            "k": pa.array(ids // per_key),
            "v": pa.array([f"value-{i}" for i in range(rows)]),
            "n": pa.array(ids * 0.5),
            "ver": pa.array(ids),
        }
    )


def spark_data(spark, rows: int, per_key: int):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    return spark.range(0, rows, numPartitions=2).select(
        (F.col("id") / per_key).cast("long").alias("k"),
        F.concat(F.lit("value-"), F.col("id").cast("string")).alias("v"),
        (F.col("id") * 0.5).alias("n"),
        F.col("id").alias("ver"),
    )


def bench_limit(dsn: str, table: str, batch: pa.RecordBatch) -> float:
    """One Python process: Arrow -> binary COPY into staging -> the sink's own merge."""
    from sinks.postgres.copy import copy_arrow, create_staging
    from sinks.postgres.merge import ORDINAL, MergePlan, merge_staged
    from sinks.postgres.options import TableName
    from sinks.postgres.types import Column

    cols = (
        Column("k", "k", "bigint", "bigint", False, "bigint"),
        Column("v", "v", "text", "string", True, "text"),
        Column("n", "n", "double precision", "double", True, "double precision"),
        Column("ver", "ver", "bigint", "bigint", True, "bigint"),
    )
    plan = MergePlan(TableName(None, table), cols, ("k",), "ver")
    staged = pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array(range(batch.num_rows), pa.int64())], names=[*batch.schema.names, ORDINAL]
    )
    start = time.perf_counter()
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        staging = create_staging(cur, plan.target, plan.staging_columns())
        chunks = pa.Table.from_batches([staged]).to_batches(max_chunksize=10_000)  # like Spark's Arrow batches
        rows = copy_arrow(cur, staging, plan.staging_columns(), chunks)
        merge_staged(cur, staging, plan, rows)
        conn.commit()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100k rows, 10k keys")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--keys", type=int, default=None)
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the best time of each contender counts")
    args = p.parse_args(argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    keys = args.keys or (10_000 if args.quick else 100_000)
    if rows % keys:
        p.error("--rows must be a multiple of --keys")
    if args.dsn:
        return run(args.dsn, rows, keys, args.repeat)
    with throwaway_postgres() as dsn:
        return run(dsn, rows, keys, args.repeat)


UPSERT, REPLAY, JDBC, LIMIT = (
    "postgres-upsert",
    "postgres-upsert replay",
    "jdbc (foreachBatch)",
    "limit: 1 process COPY+merge",
)
REFUSED = {0: "errors=all, 0% refused", 1000: "errors=all, 0.1% refused", 100: "errors=all, 1% refused"}


def jdbc_write(df, dsn: str, table: str) -> float:  # type: ignore[no-untyped-def]
    """Spark's JDBC writer, as a foreachBatch function would call it for each micro-batch."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(dsn)
    url = f"jdbc:postgresql://{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info.get('dbname', 'postgres')}"
    start = time.perf_counter()
    (
        df.write.format("jdbc")
        .option("url", url)
        .option("dbtable", table)
        .option("user", str(info.get("user", "postgres")))
        .option("password", str(info.get("password", "")))
        .option("driver", "org.postgresql.Driver")
        .option("batchsize", 10000)
        .mode("append")
        .save()
    )
    return time.perf_counter() - start


def run(dsn: str, rows: int, keys: int, repeat: int = 1) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    per_key = rows // keys
    jar = find_jdbc_jar()
    spark = bench_session("bench-upsert")
    conn = psycopg.connect(dsn, autocommit=True)
    df = spark_data(spark, rows, per_key).cache()
    df.count()  # materialize once: every contender reads the same cached rows

    def upsert(table: str, every: int | None = None) -> float:
        """The write; with ``every``, errors.tolerance=all and n = -1 (refused) on every ``every``-th row,
        each the highest version of its key (a superseded row never reaches the table to be refused)."""
        data, extra = df, {}
        if every is not None:
            extra = {"errors.tolerance": "all", "errors.table": f"{table}_refused"}
            if every:
                data = df.withColumn("n", F.when(F.col("ver") % every == every - 1, F.lit(-1.0)).otherwise(F.col("n")))
        start = time.perf_counter()
        (
            data.write.format("postgres-upsert")
            .option("dsn", dsn)
            .option("table", table)
            .option("key", "k")
            .option("version", "ver")
            .options(**extra)
            .mode("append")
            .save()
        )
        return time.perf_counter() - start

    make_table(conn, "bench_warm", key=True)  # start Python workers and the JVM paths once
    spark_data(spark, 1000, 10).write.format("postgres-upsert").option("dsn", dsn).option("table", "bench_warm").option(
        "key", "k"
    ).mode("append").save()

    want = (keys, sum(k * per_key + per_key - 1 for k in range(keys)))
    batch = arrow_data(rows, per_key)
    best: dict[str, float] = {}
    notes: dict[str, str] = {
        UPSERT: "2 tasks, staging COPY + ON CONFLICT, version guard",
        REPLAY: "same rows again: every row a no-op",
        JDBC: f"plain INSERTs, no key, at-least-once; {os.path.basename(jar)}"
        if jar
        else "SKIPPED: no PostgreSQL JDBC jar (apt-get install libpostgresql-jdbc-java)",
        LIMIT: "no Spark; same COPY and merge SQL",
        **{name: "CHECK (n >= 0) table, dead-letter table" for name in REFUSED.values()},
    }

    def record(name: str, secs: float) -> None:
        best[name] = min(secs, best.get(name, secs))

    # Rounds interleave the contenders so that load from other processes hits them alike.
    for _ in range(repeat):
        make_table(conn, "bench_upsert", key=True)
        record(UPSERT, upsert("bench_upsert"))
        record(REPLAY, upsert("bench_upsert"))
        got = conn.execute("SELECT count(*), sum(ver) FROM bench_upsert").fetchone()
        if got != want:
            print(f"WRONG RESULT in bench_upsert: {got} != {want}", file=sys.stderr)
            return 1
        if jar:
            make_table(conn, "bench_jdbc", key=False)
            record(JDBC, jdbc_write(df, dsn, "bench_jdbc"))
        for every, name in REFUSED.items():
            make_table(conn, "bench_refused", key=True, check=True)
            conn.execute('DROP TABLE IF EXISTS "bench_refused_refused"')
            record(name, upsert("bench_refused", every))
            refused = conn.execute('SELECT count(*) FROM "bench_refused_refused"').fetchone()
            want_refused = len(range(every - 1, rows, every)) if every else 0
            if conn.execute('SELECT count(*) FROM "bench_refused"').fetchone() != (keys,) or refused != (want_refused,):
                print(f"WRONG RESULT in {name}: {refused} refused, want {want_refused}", file=sys.stderr)
                return 1
        make_table(conn, "bench_limit", key=True)
        record(LIMIT, bench_limit(dsn, "bench_limit", batch))
        if conn.execute("SELECT count(*), sum(ver) FROM bench_limit").fetchone() != want:
            print("WRONG RESULT in bench_limit", file=sys.stderr)
            return 1
    spark.stop()
    results = [(name, best.get(name), notes[name]) for name in (UPSERT, REPLAY, *REFUSED.values(), JDBC, LIMIT)]

    limit, jdbc = best.get(LIMIT), best.get(JDBC)
    print(
        f"\npostgres-upsert benchmark: {rows:,} rows, {keys:,} distinct keys, logged tables, 2 Spark tasks, "
        f"best of {repeat} interleaved round(s)\n"
    )
    print(f"{'contender':<30} {'seconds':>8} {'rows/s':>11} {'vs limit':>9} {'vs jdbc':>8}  notes")
    for name, secs, note in results:
        if secs is None:
            print(f"{name:<30} {'-':>8} {'-':>11} {'-':>9} {'-':>8}  {note}")
            continue
        vs_limit = f"{limit / secs:.2f}x" if limit else "-"
        vs_jdbc = f"{jdbc / secs:.2f}x" if jdbc else "-"
        print(f"{name:<30} {secs:8.2f} {rows / secs:11,.0f} {vs_limit:>9} {vs_jdbc:>8}  {note}")
    print("\nvs limit / vs jdbc: speed relative to that contender (>1 = faster).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
