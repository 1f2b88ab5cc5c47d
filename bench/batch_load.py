"""Benchmark: a big batch load (``df.write``) through each sink, against Spark's JDBC writer and the limit.

Run: ``.venv/bin/python -m bench.batch_load [--quick] [--rows N] [--repeat R] [--dsn URL] [--pg NAME=VALUE ...]``.

Settings are the defaults a user has: Spark's (``spark.sql.execution.arrow.maxRecordsPerBatch``
10,000) and a stock PostgreSQL (the throwaway cluster's ``postgresql.conf`` is initdb's, with only
``max_prepared_transactions=16``, which the two-phase sink needs; ``--pg shared_buffers=256MB``
changes the server, and the run says so in its header). Other Spark settings are extra rows,
labelled with the setting.

One run, the same data for every contender: ``--rows`` rows (default 1M) of ``id bigint, k text,
v text`` (v is 100 bytes), a DataFrame cached in Spark with 2 partitions, each contender into a
fresh table, every table checked afterwards to hold exactly the input ids (then dropped):

- ``first write``: the first writes of the fresh session, timed on their own: Spark's JDBC writer
  (cold JVM write path) and then ``postgres-2pc visibility=batch`` (cold Python workers: worker
  start and imports). Their extra cost is reported against the same writer warm.
- ``limit``: two Python processes (connected and with their data ready before the clock starts),
  each loading its half in one transaction, by each of: psycopg's C-level binary ``write_row`` of
  ready Python tuples (no Arrow), ``pgpq`` encoding the Arrow half in the timed section (what the
  sinks send), and the server reading a ready binary COPY file (``COPY ... FROM '/file'``: no client
  at all; only against a local server). Each into a LOGGED and an UNLOGGED table (labelled rows).
  **The limit is the fastest logged one**; the same method into a table with a primary key is the
  limit of ``postgres-upsert`` (whose target needs its key's unique index).
- ``spark jdbc``: ``df.write.jdbc(...)`` (at-least-once) with the PostgreSQL JDBC driver
  (``bench._jdbc``: org.postgresql:postgresql fetched from Maven Central once), into a heap and, as
  the peer of ``postgres-upsert``, into a table with a primary key;
- ``postgres-2pc visibility=partition``, ``postgres-2pc visibility=batch`` (``sink.id`` + ``batch.id``);
- ``postgres-upsert`` (key ``id``, into a keyed table);
- extra rows: the three sinks with ``arrow.maxRecordsPerBatch=65536`` (set for those writes only).

CPU seconds per component (``bench._cpu``: the Spark JVM, its Python workers, the PostgreSQL server,
the limit's loaders) are printed for each contender too: they hold on a busy machine where wall
times do not, and say where a contender's time goes.

Every warm contender runs ``--repeat`` times (default 3), interleaved round by round; the tables
show each round and the medians. Ratios: ``x JDBC`` = JDBC's time / this time (above 1 is faster),
``x limit`` = the limit's time / this time, both within the same round. The load average at the
start and end is printed: figures taken while other work runs are noisy, compare ratios only.
Postgres: ``--dsn`` or EOS_POSTGRES_DSN, else a throwaway cluster from the system binaries.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa

from bench._cpu import COMPONENTS, CpuMeter
from bench.upsert import bench_session, find_jdbc_jar, throwaway_postgres

__all__ = ["main"]

LIMIT_METHODS = ("write_row", "pgpq", "file")
LAST_CLIENT_CPU = [0.0]  # CPU seconds of the last limit's two loaders from the start signal (their data made before)
ARROW_BIG = "spark.sql.execution.arrow.maxRecordsPerBatch"


def _half(rows: int, part: int) -> pa.RecordBatch:
    lo, hi = (0, rows // 2) if part == 0 else (rows // 2, rows)
    ids = pa.array(range(lo, hi), pa.int64())
    k = pa.array([f"k{i % 1000}" for i in range(lo, hi)])
    v = pa.array([f"{i:012d}" + "x" * 88 for i in range(lo, hi)])
    return pa.RecordBatch.from_arrays([ids, k, v], names=["id", "k", "v"])


def binary_file(rows: int, part: int, directory: str) -> str:
    """The half ``part`` as a binary COPY file the server can read (written outside the clock)."""
    import pgpq

    batch = _half(rows, part)
    enc = pgpq.ArrowToPostgresBinaryEncoder(batch.schema)
    path = os.path.join(directory, f"half{part}.bin")
    with open(path, "wb") as fh:
        fh.write(enc.write_header())
        for o in range(0, batch.num_rows, 10_000):
            fh.write(enc.write_batch(batch.slice(o, 10_000)))
        fh.write(enc.finish())
    os.chmod(path, 0o644)
    return path


def _load_half(
    dsn: str, table: str, rows: int, part: int, method: str, path: str | None, ready: Any, go: Any, done: Any
) -> None:
    sql = f"COPY {table} (id, k, v) FROM STDIN (FORMAT BINARY)"
    if method == "write_row":
        lo, hi = (0, rows // 2) if part == 0 else (rows // 2, rows)
        data = [(i, f"k{i % 1000}", f"{i:012d}" + "x" * 88) for i in range(lo, hi)]
    elif method == "pgpq":
        import pgpq

        batch = _half(rows, part)
        chunks = [batch.slice(o, 10_000) for o in range(0, batch.num_rows, 10_000)]  # Spark's default batch
    with psycopg.connect(dsn) as conn:
        ready.set()
        go.wait()
        cpu = time.process_time()
        with conn.cursor() as cur:
            if method == "write_row":
                with cur.copy(sql) as cp:
                    cp.set_types(["int8", "text", "text"])
                    for row in data:
                        cp.write_row(row)
            elif method == "pgpq":
                enc = pgpq.ArrowToPostgresBinaryEncoder(batch.schema)
                with cur.copy(sql) as cp:
                    cp.write(enc.write_header())
                    for c in chunks:
                        cp.write(enc.write_batch(c))
                    cp.write(enc.finish())
            else:
                cur.execute(f"COPY {table} (id, k, v) FROM {psycopg.sql.quote(path)} (FORMAT BINARY)")  # type: ignore[arg-type]
        conn.commit()
    done.put((time.perf_counter(), time.process_time() - cpu))  # CLOCK_MONOTONIC: one clock for every process


def bench_limit(dsn: str, table: str, rows: int, method: str = "pgpq", paths: list[str] | None = None) -> float:
    """Two processes load their halves at once by ``method``; seconds from the start signal to the later commit."""
    ctx = mp.get_context("fork")
    ready = [ctx.Event(), ctx.Event()]
    go, done = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_load_half,
            args=(dsn, table, rows, p, method, paths[p] if paths else None, ready[p], go, done),
        )
        for p in (0, 1)
    ]
    for p in procs:
        p.start()
    for r in ready:
        r.wait(300)
    t0 = time.perf_counter()
    go.set()
    ends = [done.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"a {method} COPY process failed")
    LAST_CLIENT_CPU[0] = sum(cpu for _, cpu in ends)
    return max(end for end, _ in ends) - t0


def _table(conn: psycopg.Connection, name: str, *, key: bool, unlogged: bool = False) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {name}")  # type: ignore[arg-type]
    conn.execute(
        f"CREATE {'UNLOGGED ' if unlogged else ''}TABLE {name} (id bigint{' PRIMARY KEY' if key else ''}, k text, v text)"  # type: ignore[arg-type]
    )


def _check(conn: psycopg.Connection, name: str, rows: int) -> str:
    n, distinct, lo, hi = conn.execute(f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {name}").fetchone()  # type: ignore[arg-type, misc]
    ok = n == distinct == rows and lo == 0 and hi == rows - 1
    return "exact" if ok else f"WRONG: {n} rows, {distinct} distinct, ids {lo}..{hi}"


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _local(dsn: str) -> bool:
    host = dsn.split("@", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost", "[::1]", "")


def run(dsn: str, rows: int, repeat: int = 3, pg_label: str = "stock") -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    load_start = _loadavg()
    jar = find_jdbc_jar()
    spark = bench_session("bench-batch-load", **{"spark.driver.memory": "4g"})
    arrow_default = spark.conf.get(ARROW_BIG)
    df = (
        spark.range(0, rows, 1, 2)
        .selectExpr(
            "id", "concat('k', id % 1000) AS k", "concat(lpad(cast(id AS string), 12, '0'), repeat('x', 88)) AS v"
        )
        .cache()
    )
    assert df.count() == rows
    with psycopg.connect(dsn, autocommit=True) as conn:
        server = conn.execute("SELECT current_setting('server_version'), current_setting('shared_buffers')").fetchone()
    files_dir = tempfile.mkdtemp(prefix="eos-bench-copyfiles-")
    os.chmod(files_dir, 0o755)
    paths = [binary_file(rows, p, files_dir) for p in (0, 1)] if _local(dsn) else None
    methods = [m for m in LIMIT_METHODS if m != "file" or paths]
    suffix = uuid.uuid4().hex[:6]
    wrong: list[str] = []

    meter = CpuMeter(spark, dsn)
    cpu: dict[str, list[dict[str, float | None]]] = {}

    def timed(
        table: str, key: bool, write: Callable[[str], Any], *, unlogged: bool = False, name: str | None = None
    ) -> float:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _table(conn, table, key=key, unlogged=unlogged)
        before = meter.snapshot()
        t0 = time.perf_counter()
        write(table)
        secs = time.perf_counter() - t0
        used = meter.used(before, meter.snapshot())
        if name is not None and name.startswith(("limit", "2 processes")):
            used["driver"] = LAST_CLIENT_CPU[0]  # the loaders only, from the start signal
        if name is not None:
            cpu.setdefault(name, []).append(used)
        with psycopg.connect(dsn, autocommit=True) as conn:
            check = _check(conn, table, rows)
            conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]
        if check != "exact":
            wrong.append(f"{table}: {check}")
        return secs

    def limit(method: str) -> Callable[[str], Any]:
        return lambda table: bench_limit(dsn, table, rows, method, paths)

    def jdbc(table: str) -> None:
        url = "jdbc:postgresql://" + dsn.split("@", 1)[-1]
        user = dsn.split("//", 1)[1].split("@", 1)[0].split(":", 1)[0]
        df.write.jdbc(url, table, mode="append", properties={"user": user, "driver": "org.postgresql.Driver"})

    def twopc(visibility: str) -> Callable[[str], Any]:
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

    def with_arrow(write: Callable[[str], Any]) -> Callable[[str], Any]:
        def w(table: str) -> None:
            spark.conf.set(ARROW_BIG, "65536")
            try:
                write(table)
            finally:
                spark.conf.set(ARROW_BIG, arrow_default)

        return w

    print(f"load average at start: {load_start}", flush=True)
    # The first writes of the fresh session, each timed alone (no warm-up before them).
    first = {
        "spark jdbc": timed(f"bl_first_jdbc_{suffix}", False, jdbc),
        "postgres-2pc visibility=batch": timed(f"bl_first_2pcb_{suffix}", False, twopc("batch")),
    }
    print(f"  first writes: {first}", flush=True)

    contenders: list[tuple[str, bool, Callable[[str], Any], bool]] = []  # name, keyed, write, unlogged
    for m in methods:
        contenders.append((f"limit: 2 processes, {m}, logged", False, limit(m), False))
        contenders.append((f"2 processes, {m}, UNLOGGED", False, limit(m), True))
    contenders += [
        ("spark jdbc (df.write.jdbc)", False, jdbc, False),
        ("spark jdbc into a keyed table", True, jdbc, False),
        ("postgres-2pc visibility=partition", False, twopc("partition"), False),
        ("postgres-2pc visibility=batch", False, twopc("batch"), False),
        ("postgres-upsert (key id)", True, upsert, False),
        (
            "postgres-2pc visibility=partition [arrow.maxRecordsPerBatch=65536]",
            False,
            with_arrow(twopc("partition")),
            False,
        ),
        ("postgres-2pc visibility=batch [arrow.maxRecordsPerBatch=65536]", False, with_arrow(twopc("batch")), False),
        ("postgres-upsert (key id) [arrow.maxRecordsPerBatch=65536]", True, with_arrow(upsert), False),
    ]
    rounds: list[dict[str, float]] = []
    for r in range(repeat):
        secs: dict[str, float] = {}
        for i, (name, key, write, unlogged) in enumerate(contenders):
            secs[name] = timed(f"bl_{r}_{i}_{suffix}", key, write, unlogged=unlogged, name=name)
            print(f"  round {r + 1}: {name}: {secs[name]:.2f}s", flush=True)
        logged = {m: secs[f"limit: 2 processes, {m}, logged"] for m in methods}
        best = min(logged, key=logged.__getitem__)
        secs["limit into a keyed table"] = timed(
            f"bl_{r}_k_{suffix}", True, limit(best), name=f"limit into a keyed table ({best})"
        )
        secs["__limit__"] = logged[best]
        secs["__limit_method__"] = float(methods.index(best))
        rounds.append(secs)
    spark.stop()

    order = [n for n, *_ in contenders[: 2 * len(methods)]] + ["limit into a keyed table"]
    order += [n for n, *_ in contenders[2 * len(methods) :]]
    print(
        f"\nbatch load: {rows:,} rows (id bigint, k text, v text 100 B), 2 partitions, local[2], Spark defaults "
        f"({ARROW_BIG}={arrow_default}), PostgreSQL {server[0]} ({pg_label}; shared_buffers={server[1]}), "  # type: ignore[index]
        f"JDBC {os.path.basename(jar)}; load average start {load_start}, end {_loadavg()}"
    )
    limits = ", ".join(f"round {i + 1}: {methods[int(s['__limit_method__'])]}" for i, s in enumerate(rounds))
    print(f"the limit (fastest logged 2-process load) per round: {limits}\n")
    head = (
        "| writer | "
        + " | ".join(f"r{i + 1} s | x JDBC | x limit" for i in range(repeat))
        + " | median s | median x JDBC | median x limit |"
    )
    print(head)
    print("|---" * (1 + 3 * repeat + 3) + "|")
    for name in order:
        cells = []
        xj, xl, ss = [], [], []
        for s in rounds:
            t = s[name]
            j = (
                s["spark jdbc into a keyed table"]
                if "keyed" in name or "upsert" in name
                else s["spark jdbc (df.write.jdbc)"]
            )
            lim = s["limit into a keyed table"] if "upsert" in name else s["__limit__"]
            cells.append(f"{t:.2f} | {j / t:.2f}x | {lim / t:.2f}x")
            xj.append(j / t)
            xl.append(lim / t)
            ss.append(t)
        print(
            f"| {name} | {' | '.join(cells)} | {statistics.median(ss):.2f} | {statistics.median(xj):.2f}x | "
            f"{statistics.median(xl):.2f}x |"
        )
    print(
        "(x JDBC: postgres-upsert and the keyed rows against Spark's JDBC writer into a keyed table, the others "
        "against it into a heap; x limit: postgres-upsert against the limit into a keyed table)"
    )
    print("\nCPU seconds per component (median of the rounds; robust to other work on the machine, unlike the")
    print("wall times above: on 2 cores a load cannot take less wall time than its total CPU / 2):")
    print("| writer | Spark JVM | Python workers | PostgreSQL server | bench processes | total CPU |")
    print("|---|---|---|---|---|---|")
    for name, runs in cpu.items():
        med = {
            k: (
                statistics.median(v for r in runs if (v := r[k]) is not None)
                if all(r[k] is not None for r in runs)
                else None
            )
            for k in COMPONENTS
        }
        total = sum(v for v in med.values() if v is not None)
        cells = " | ".join("n/a" if med[k] is None else f"{med[k]:.2f}" for k in COMPONENTS)
        print(f"| {name} | {cells} | {total:.2f} |")
    warm = {
        "spark jdbc": statistics.median(s["spark jdbc (df.write.jdbc)"] for s in rounds),
        "postgres-2pc visibility=batch": statistics.median(s["postgres-2pc visibility=batch"] for s in rounds),
    }
    print("\nfirst write of the fresh session (cold) against the same writer warm (median):")
    print("| writer | first write s | warm s | extra cost s |")
    print("|---|---|---|---|")
    for name, cold in first.items():
        print(f"| {name} | {cold:.2f} | {warm[name]:.2f} | {cold - warm[name]:.2f} |")
    for w in wrong:
        print("WRONG RESULT", w, file=sys.stderr)
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch_load")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="100k rows, one round")
    p.add_argument("--repeat", type=int, default=3, help="rounds of the warm contenders (default 3)")
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    p.add_argument(
        "--pg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting of the throwaway cluster (e.g. shared_buffers=256MB); default: stock",
    )
    args = p.parse_args(argv)
    rows = 100_000 if args.quick else args.rows
    repeat = 1 if args.quick else args.repeat
    settings = dict(s.split("=", 1) for s in args.pg)
    label = "stock postgresql.conf + max_prepared_transactions=16" + "".join(f", {k}={v}" for k, v in settings.items())
    if args.dsn:
        return run(args.dsn, rows, repeat, "the server of --dsn")
    with throwaway_postgres(settings) as dsn:
        return run(dsn, rows, repeat, label)


if __name__ == "__main__":
    sys.exit(main())
