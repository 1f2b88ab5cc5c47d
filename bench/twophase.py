"""Benchmark: postgres-2pc append vs a plain Arrow+COPY foreachBatch sink vs Spark's JDBC writer.

Run: ``.venv/bin/python -m bench.twophase [--quick] [--rows N] [--batches B] [--dsn URL]``.

One streaming pipeline (Parquet files, one per micro-batch, AvailableNow trigger, repartitioned to
P writer tasks) over the same data (``--rows``, default 1M, in ``--batches`` micro-batches), each
contender into a fresh LOGGED table:

- ``postgres-2pc`` at P=2 and P=8: tasks COPY into the sink's staging table and PREPARE; the driver
  decides, COMMIT PREPAREs and publishes each batch in one transaction (exactly-once);
- ``plain Arrow+COPY`` (P=2): the same pipeline into a minimal Python streaming data source whose
  tasks binary-COPY straight into the table and commit (the same COPY code and Spark write path,
  no protocol: at-least-once). The difference to ``postgres-2pc`` is the price of exactly-once;
- ``jdbc (foreachBatch)`` (P=2): Spark's JDBC writer in foreachBatch (at-least-once); skipped with a
  message when no PostgreSQL JDBC jar is found (``apt-get install libpostgresql-jdbc-java``).

Printed: rows/s, the overhead of exactly-once as a ratio (plain time / 2pc time and jdbc / 2pc),
and the driver's commit latency per batch (median and p99 of ``commit()``) at 2 and 8 writer tasks.
Every table is checked to hold exactly the input afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from bench.upsert import bench_session, find_jdbc_jar, throwaway_postgres

__all__ = ["main"]

COLUMNS = [("id", "bigint"), ("v", "text"), ("n", "double precision")]


def write_input(root: str, rows: int, batches: int) -> str:
    path = os.path.join(root, "input")
    os.makedirs(path)
    per = rows // batches
    now = time.time() - 10_000
    for b in range(batches):
        ids = list(range(b * per, (b + 1) * per))
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "v": pa.array([f"value-{i}" for i in ids]),
                "n": pa.array([i * 0.5 for i in ids], pa.float64()),
            }
        )
        f = os.path.join(path, f"part-{b:04d}.parquet")
        pq.write_table(table, f)
        os.utime(f, (now + b, now + b))  # the file source orders by modification time
    return path


def make_table(conn: psycopg.Connection, name: str) -> None:
    conn.execute(f'DROP TABLE IF EXISTS "{name}"')  # type: ignore[arg-type]
    conn.execute(f'CREATE TABLE "{name}" (id bigint, v text, n double precision)')  # type: ignore[arg-type]


class _PlainCopyWriter:
    """Stream writer of the plain peer: COPY into the table, commit per task, nothing on the driver."""

    def __init__(self, dsn: str, table: str) -> None:
        self.dsn, self.table = dsn, table

    def write(self, iterator: Any) -> Any:
        from pyspark.sql.datasource import WriterCommitMessage

        from sinks.postgres.copy import copy_arrow

        with psycopg.connect(self.dsn) as conn, conn.cursor() as cur:
            copy_arrow(cur, f'"{self.table}"', COLUMNS, iterator)
            conn.commit()
        return WriterCommitMessage()

    def commit(self, messages: Any, batchId: int) -> None:
        pass

    def abort(self, messages: Any, batchId: int) -> None:
        pass


def plain_source() -> Any:
    """Format ``bench-plain-copy`` (built lazily: pyspark classes only when Spark is there)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter

    class Writer(_PlainCopyWriter, DataSourceStreamArrowWriter):
        pass

    class PlainCopy(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-plain-copy"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return Writer(self.options["dsn"], self.options["table"])

    return PlainCopy


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(dsn: str, rows: int, batches: int) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    root = tempfile.mkdtemp(prefix="eos-bench-2pc-")
    timings_path = os.path.join(root, "timings.jsonl")
    os.environ["EOS_2PC_TIMINGS"] = timings_path  # before the JVM starts: its Python workers inherit it
    input_path = write_input(root, rows, batches)
    jar = find_jdbc_jar()
    spark = bench_session("bench-twophase")
    spark.dataSource.register(plain_source())
    conn = psycopg.connect(dsn, autocommit=True)
    schema = "id long, v string, n double"

    def stream(parts: int) -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(input_path).repartition(parts)

    def timed(name: str, start_query: Any) -> float:
        ckpt = os.path.join(root, "ckpt-" + name)
        start = time.perf_counter()
        start_query(ckpt).awaitTermination()
        return time.perf_counter() - start

    def twopc(table: str, parts: int) -> Any:
        def go(ckpt: str) -> Any:
            return (
                stream(parts)
                .writeStream.format("postgres-2pc")
                .option("dsn", dsn)
                .option("table", table)
                .option("sink.id", f"bench-{table}")
                .option("checkpointLocation", ckpt)
                .trigger(availableNow=True)
                .start()
            )

        return go

    def plain(table: str, parts: int) -> Any:
        def go(ckpt: str) -> Any:
            return (
                stream(parts)
                .writeStream.format("bench-plain-copy")
                .option("dsn", dsn)
                .option("table", table)
                .option("checkpointLocation", ckpt)
                .trigger(availableNow=True)
                .start()
            )

        return go

    def jdbc(table: str, parts: int) -> Any:
        rest = dsn.split("://", 1)[1]
        user = rest.split("@", 1)[0] if "@" in rest else "postgres"
        url = "jdbc:postgresql://" + rest.split("@", 1)[-1]

        def write(df: Any, batch_id: int) -> None:
            (
                df.write.format("jdbc")
                .option("url", url)
                .option("dbtable", table)
                .option("user", user.split(":")[0])
                .option("password", user.split(":")[1] if ":" in user else "")
                .option("driver", "org.postgresql.Driver")
                .option("batchsize", 10000)
                .mode("append")
                .save()
            )

        def go(ckpt: str) -> Any:
            return (
                stream(parts)
                .writeStream.foreachBatch(write)
                .option("checkpointLocation", ckpt)
                .trigger(availableNow=True)
                .start()
            )

        return go

    # warm up the JVM paths and the Python workers once, outside every measurement
    make_table(conn, "bench_warm")
    timed("warm", twopc("bench_warm", 2))
    make_table(conn, "bench_warm2")
    timed("warm2", plain("bench_warm2", 2))

    results: list[tuple[str, float | None, str]] = []
    latencies: dict[int, list[float]] = {}
    make_table(conn, "bench_plain")
    results.append(
        (
            "plain Arrow+COPY P=2",
            timed("plain", plain("bench_plain", 2)),
            "same COPY and write path, task commits, at-least-once",
        )
    )
    for parts in (2, 8):
        table = f"bench_2pc_{parts}"
        make_table(conn, table)
        open(timings_path, "w").close()
        secs = timed(table, twopc(table, parts))
        with open(timings_path, encoding="utf-8") as fh:
            latencies[parts] = [json.loads(line)["total"] for line in fh if line.strip()]
        results.append((f"postgres-2pc P={parts}", secs, f"{parts} writer tasks, exactly-once"))
    if jar:
        make_table(conn, "bench_jdbc")
        results.append(
            ("jdbc (foreachBatch) P=2", timed("jdbc", jdbc("bench_jdbc", 2)), f"at-least-once; {os.path.basename(jar)}")
        )
    else:
        results.append(
            (
                "jdbc (foreachBatch) P=2",
                None,
                "SKIPPED: no PostgreSQL JDBC jar (apt-get install libpostgresql-jdbc-java)",
            )
        )
    spark.stop()

    want = (rows, rows, rows * (rows - 1) // 2)
    for name in ("bench_2pc_2", "bench_2pc_8", "bench_plain", *(["bench_jdbc"] if jar else [])):
        got = conn.execute(f'SELECT count(*), count(DISTINCT id), sum(id) FROM "{name}"').fetchone()  # type: ignore[arg-type]
        if tuple(int(x) for x in got) != want:  # type: ignore[union-attr]
            print(f"WRONG RESULT in {name}: {got} != {want}", file=sys.stderr)
            return 1

    timed_secs = {n: s for n, s, _ in results if s}
    base = timed_secs["postgres-2pc P=2"]
    print(f"\npostgres-2pc benchmark: {rows:,} rows in {batches} micro-batches, logged tables, local[2]\n")
    print(f"{'contender':<26} {'seconds':>8} {'rows/s':>11} {'time vs 2pc P=2':>16}  notes")
    for name, secs, note in results:
        if secs is None:
            print(f"{name:<26} {'-':>8} {'-':>11} {'-':>16}  {note}")
            continue
        print(f"{name:<26} {secs:8.2f} {rows / secs:11,.0f} {secs / base:15.2f}x  {note}")
    plain_s = timed_secs["plain Arrow+COPY P=2"]
    print(f"\nexactly-once overhead (2pc P=2 time / plain Arrow+COPY time): {base / plain_s:.2f}x")
    if jar:
        print(
            f"2pc P=2 vs Spark JDBC in foreachBatch (jdbc time / 2pc time): {timed_secs['jdbc (foreachBatch) P=2'] / base:.2f}x"
        )
    print("\ndriver commit() latency per batch (decision + COMMIT PREPARED + publish + cleanup):")
    for parts, values in latencies.items():
        print(
            f"  P={parts}: {len(values)} batches, median {statistics.median(values) * 1000:.1f} ms, "
            f"p99 {percentile(values, 0.99) * 1000:.1f} ms"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100k rows in 5 batches")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--batches", type=int, default=None)
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    args = p.parse_args(argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    batches = args.batches or (5 if args.quick else 10)
    if rows % batches:
        p.error("--rows must be a multiple of --batches")
    if args.dsn:
        return run(args.dsn, rows, batches)
    with throwaway_postgres() as dsn:
        return run(dsn, rows, batches)


if __name__ == "__main__":
    raise SystemExit(main())
