"""Benchmark: peak memory of one sink writer task at a 50 MB and a 500 MB partition.

Run: ``.venv/bin/python -m bench.writer_memory [--quick] [--big-mb M] [--small-mb M] [--dsn URL]``.

For ``postgres-2pc visibility=partition``, ``postgres-2pc visibility=batch`` and ``postgres-upsert``
(key ``id``): a fresh Python process builds the sink's batch writer (the same class Spark builds,
``TwoPhaseBatchWriter`` / ``UpsertBatchWriter``) and calls its task-side ``write()`` on a generated
iterator of Arrow record batches of 10,000 rows (``id bigint, k text, v text`` with v of 1,000
bytes; each batch is made when the writer asks for it, so the input costs no memory of its own),
exactly as a Spark Python worker feeds it, then ``commit()`` on the driver side. Measured: the
process's peak RSS during ``write()`` (VmHWM, reset just before through /proc/self/clear_refs)
above its RSS just before, for a ``--small-mb`` (50) and a ``--big-mb`` (500; ``--quick``: 150)
partition in the same run, and the growth between them as a share of the extra payload: a writer
whose memory is flat in the partition's size grows by about the same on both (the share is about
0 %), one that buffered the partition would grow by all of it (100 %). The limit, like the read
task's in bench.kafka_source: growth(big) < growth(small) + 25 % of the extra payload. Each table
is checked to hold exactly the generated ids afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import psycopg

from bench.upsert import throwaway_postgres

__all__ = ["main"]

ROW_BYTES = 1_000  # the v column
BATCH_ROWS = 10_000

_CHILD = """
import json, sys, time
kind, dsn, table, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0

schema = StructType([StructField("id", LongType()), StructField("k", StringType()), StructField("v", StringType())])
if kind.startswith("postgres-2pc"):
    from sinks.postgres.twophase import TwoPhaseBatchWriter
    opts = {"dsn": dsn, "table": table, "sink.id": "mem-" + table, "batch.id": "1",
            "visibility": kind.split("=", 1)[1]}
    writer = TwoPhaseBatchWriter(opts, schema)
else:
    from sinks.postgres.upsert import UpsertBatchWriter
    writer = UpsertBatchWriter({"dsn": dsn, "table": table, "key": "id"}, schema)

PAD = "v" * %(row_bytes)d
payload = 0

def batches():
    global payload
    for lo in range(0, rows, %(batch_rows)d):
        n = min(%(batch_rows)d, rows - lo)
        b = pa.RecordBatch.from_arrays(
            [pa.array(range(lo, lo + n), pa.int64()), pa.array([f"k{i %% 1000}" for i in range(lo, lo + n)]),
             pa.array([PAD] * n)],
            names=["id", "k", "v"],
        )
        payload += b.nbytes
        yield b

try:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    reset = True
except OSError:
    reset = False
import threading
anon_before = status("RssAnon:")
anon_peak = anon_before
stop = threading.Event()

def sample():
    global anon_peak
    while not stop.is_set():
        anon_peak = max(anon_peak, status("RssAnon:"))
        stop.wait(0.002)

sampler = threading.Thread(target=sample, daemon=True)
before = status("VmRSS:")
sampler.start()
start = time.perf_counter()
msg = writer.write(batches())
secs = time.perf_counter() - start
peak = status("VmHWM:")
stop.set()
sampler.join()
writer.commit([msg])
print(json.dumps({"rows": rows, "payload": payload, "before": before, "peak": peak, "reset": reset,
                  "anon_before": anon_before, "anon_peak": max(anon_peak, status("RssAnon:")),
                  "seconds": secs}))
"""

KINDS = ("postgres-2pc visibility=partition", "postgres-2pc visibility=batch", "postgres-upsert")


def measure(kind: str, dsn: str, table: str, rows: int) -> dict[str, Any]:
    """Write ``rows`` rows through one writer task of ``kind`` in a fresh process; its memory figures."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        key = " PRIMARY KEY" if kind == "postgres-upsert" else ""
        conn.execute(f"CREATE TABLE {table} (id bigint{key}, k text, v text)")  # type: ignore[arg-type]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    code = _CHILD % {"row_bytes": ROW_BYTES, "batch_rows": BATCH_ROWS}
    out = subprocess.run(
        [sys.executable, "-c", code, kind, dsn, table, str(rows)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if out.returncode:
        raise RuntimeError(f"{kind}: the writer process failed:\n{out.stderr[-3000:]}")
    fig = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {table}").fetchone()  # type: ignore[arg-type]
        conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]
    assert row is not None
    n, distinct, lo, hi = row
    fig["check"] = "exact" if n == distinct == rows and lo == 0 and hi == rows - 1 else f"WRONG: {row}"
    return fig


def run(dsn: str, small_mb: int, big_mb: int) -> int:
    per_row = ROW_BYTES + 8 + 4 + 8  # v, id, k ("k0".."k999", ~4 bytes) and the two string offsets
    small_rows, big_rows = small_mb * 1_000_000 // per_row, big_mb * 1_000_000 // per_row
    results = []
    for k, kind in enumerate(KINDS):
        small = measure(kind, dsn, f"wm_small_{k}", small_rows)
        big = measure(kind, dsn, f"wm_big_{k}", big_rows)
        results.append((kind, small, big))
        print(f"  {kind}: {small['check']}, {big['check']}", flush=True)

    print(
        f"\nwriter task memory during write(), partitions of {small_mb} and {big_mb} MB (Arrow batches of "
        f"{BATCH_ROWS:,} rows, v {ROW_BYTES:,} B), one run. RSS = peak RSS (VmHWM) above RSS before write(); "
        "anon = peak anonymous RSS (RssAnon, sampled every 2 ms) above before; extra = (big - small) growth / "
        "(big - small) payload\n"
    )
    print(
        f"| writer | RSS {small_mb} MB | RSS {big_mb} MB | RSS extra | anon {small_mb} MB | anon {big_mb} MB | "
        f"anon extra | write s ({small_mb} / {big_mb} MB) | flat? (RSS / anon) | rows |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for kind, small, big in results:
        extra = big["payload"] - small["payload"]

        def growth(fig: dict[str, Any], key: str) -> int:
            return int(fig[key] - fig[{"peak": "before", "anon_peak": "anon_before"}[key]])

        cells = []
        verdict = []
        for key in ("peak", "anon_peak"):
            g_small, g_big = growth(small, key), growth(big, key)
            flat = g_big < g_small + extra // 4
            verdict.append("yes" if flat else "NO")
            if key == "anon_peak":
                ok = ok and flat
            cells += [f"{g_small / 1e6:,.0f} MB", f"{g_big / 1e6:,.0f} MB", f"{(g_big - g_small) / extra:.1%}"]
        ok = ok and small["check"] == big["check"] == "exact"
        print(
            f"| {kind} | {' | '.join(cells)} | {small['seconds']:.1f} / {big['seconds']:.1f} | "
            f"{' / '.join(verdict)} | {small['check']}, {big['check']} |"
        )
    if not all(s["reset"] and b["reset"] for _, s, b in results):
        print("(VmHWM could not be reset: the RSS figures include the setup's peak)")
    print(
        f"(payload: {results[0][1]['payload'] / 1e6:,.0f} MB and {results[0][2]['payload'] / 1e6:,.0f} MB of Arrow "
        "buffers; flat = growth at the big partition < growth at the small one + 25 % of the extra payload. RSS "
        "counts file pages mapped into the process too (a memory-mapped spill file), anon does not: those pages are "
        "the kernel's page cache, dropped under memory pressure)"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.writer_memory", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a 150 MB big partition")
    p.add_argument("--small-mb", type=int, default=50)
    p.add_argument("--big-mb", type=int, default=None)
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    args = p.parse_args(argv)
    big_mb = args.big_mb or (150 if args.quick else 500)
    if args.dsn:
        return run(args.dsn, args.small_mb, big_mb)
    with throwaway_postgres() as dsn:
        return run(dsn, args.small_mb, big_mb)


if __name__ == "__main__":
    sys.exit(main())
