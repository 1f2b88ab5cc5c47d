"""Profile: one micro-batch behind kafka-eos against one behind Spark's own source, phase by phase (issue 48).

Run (the peer environment: Spark's Kafka connector exists for PySpark 4.2.0, not 4.3)::

    make peer-venv
    PYSPARK_PYTHON=.venv-peer/bin/python .venv-peer/bin/python -m bench.microbatch [--records N] [--batches B]
        [--rounds R] [--stateful]

A throwaway embedded Apache Kafka (``bench.kafka_source.kafka``; ``--bootstrap`` names one) holds ``--records``
(default 200k) records of 100 bytes in 2 partitions. Each source reads them with ``maxOffsetsPerTrigger`` =
records / ``--batches`` (default 20) and ``trigger(availableNow=True)`` into the noop Python writer
(``bench._noop``: the same writer behind both sources, so only the source differs); ``--stateful`` adds a
keyed aggregation (count and max id per id mod 1,000, update mode) and writes into Spark's own ``noop`` sink
(a Python data source writes in append mode only). The sources take turns,
``--rounds`` times (default 2), after one warm-up query each; the best round of each is reported.

Per micro-batch, from the query's progress (``durationMs``, Spark's own phases): ``latestOffset`` (the
driver asks the source for the batch's end: for a Python source a round trip to its planner process),
``queryPlanning``, ``getBatch`` (the batch's plan; for a Python source its ``partitions()``), ``addBatch``
(the tasks: read, hand-over to the JVM, the writer, its commit), ``walCommit`` and ``commitOffsets`` (the
offset and commit logs; the latter includes the source's ``commit()``), ``triggerExecution`` (the whole
trigger). Medians over the batches that read records; the whole run's wall time and the CPU seconds per
component (``bench._cpu``: the Spark JVM, its Python processes, the broker is not counted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench._cpu import CpuMeter
from bench._noop import noop_source
from bench.kafka_source import kafka, spark_connector_conf
from bench.streaming import fill_topic
from bench.upsert import bench_session

__all__ = ["main"]

PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
SOURCES = {"kafka-eos": "kafka-eos", "spark": "kafka"}
BUCKETS = 1000


def _query(spark: Any, fmt: str, bootstrap: str, topic: str, cap: int, ckpt: str, stateful: bool, **opts: str) -> Any:
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(cap))
        .options(**opts)
        .load()
        .selectExpr("CAST(CAST(key AS STRING) AS BIGINT) AS id", "CAST(value AS STRING) AS v")
    )
    sink, mode = "bench-noop", "append"
    if stateful:  # a Python data source writes in append mode only: Spark's own noop sink takes the updates
        df = df.groupBy((F.col("id") % BUCKETS).alias("bucket")).agg(F.count("*").alias("n"), F.max("id").alias("m"))
        sink, mode = "noop", "update"
    w = df.writeStream.format(sink).outputMode(mode).option("checkpointLocation", ckpt)
    return w.trigger(availableNow=True).start()


def _run(
    spark: Any, meter: CpuMeter, fmt: str, bootstrap: str, topic: str, cap: int, stateful: bool, **opts: str
) -> dict[str, Any]:
    ckpt = tempfile.mkdtemp(prefix="eos-bench-mb-")
    before = meter.snapshot()
    t = time.perf_counter()
    start_epoch = time.time()
    q = _query(spark, fmt, bootstrap, topic, cap, ckpt, stateful, **opts)
    q.awaitTermination()
    seconds = time.perf_counter() - t
    after = meter.snapshot()
    progress = q.recentProgress
    batches = [dict(p.durationMs, rows=p.numInputRows) for p in progress if p.numInputRows]
    # where the time outside the data batches goes: the query's start up to its first trigger, the triggers
    # that read nothing (kafka-eos's batch 0 pins its start), and the end after the last trigger
    first = _epoch(progress[0].timestamp) - start_epoch if progress else seconds
    empty = sum(p.durationMs.get("triggerExecution", 0) for p in progress if not p.numInputRows) / 1000
    data = sum(b.get("triggerExecution", 0) for b in batches) / 1000
    cpu = {k: (after[k] - before[k]) if after[k] is not None and before[k] is not None else None for k in after}
    return {
        "seconds": seconds,
        "batches": batches,
        "rows": sum(b["rows"] for b in batches),
        "cpu": cpu,
        "parts": {
            "start to first trigger, s": first,
            "triggers that read nothing, s": empty,
            "triggers that read, s": data,
            "the rest (between and after triggers), s": seconds - first - empty - data,
        },
        "triggers": len(progress),
    }


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.microbatch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stateful", action="store_true", help="a keyed aggregation into Spark's noop sink")
    ap.add_argument("--option", action="append", default=[], help="KEY=VALUE: an option of kafka-eos's (repeat)")
    ap.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"))
    args = ap.parse_args(argv)
    eos_opts = dict(o.split("=", 1) for o in args.option)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    spark = bench_session("bench-microbatch", **spark_connector_conf())
    spark.dataSource.register(noop_source())
    meter = CpuMeter(spark, dsn=None)
    cap = args.records // args.batches
    best: dict[str, dict[str, Any]] = {}
    try:
        with kafka(args.bootstrap) as bootstrap:
            topic = fill_topic(bootstrap, args.records)
            warm = fill_topic(bootstrap, 2000)
            for fmt in SOURCES.values():
                _run(spark, meter, fmt, bootstrap, warm, 500, args.stateful, **(eos_opts if fmt == "kafka-eos" else {}))
            for rnd in range(args.rounds):
                for name, fmt in SOURCES.items():
                    opts = eos_opts if fmt == "kafka-eos" else {}
                    r = _run(spark, meter, fmt, bootstrap, topic, cap, args.stateful, **opts)
                    print(f"round {rnd + 1} {name}: {r['seconds']:.2f}s, {len(r['batches'])} batches, {r['rows']} rows")
                    if r["rows"] != args.records:
                        print(f"WRONG: {name} read {r['rows']} of {args.records} records")
                        return 1
                    if name not in best or r["seconds"] < best[name]["seconds"]:
                        best[name] = r
    finally:
        spark.stop()
    report(best, args)
    return 0


def report(best: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    what = "keyed aggregation -> Spark's noop sink" if args.stateful else "noop Python writer"
    print(
        f"\nmicro-batch profile: {args.records:,} records in {args.batches} micro-batches (2 partitions, 100 B values), "
        f"{what}, local[2], best of {args.rounds} rounds\n"
    )
    names = list(best)
    print(f"| per micro-batch, median ms | {' | '.join(names)} | kafka-eos - spark |")
    print("|---|" + "---:|" * (len(names) + 1))
    for ph in PHASES:
        meds = [statistics.median(b.get(ph, 0) for b in best[n]["batches"]) for n in names]
        print(f"| {ph} | {' | '.join(f'{m:.0f}' for m in meds)} | {meds[0] - meds[-1]:+.0f} |")
    secs = [best[n]["seconds"] for n in names]
    for part in best[names[0]]["parts"]:
        vals = [best[n]["parts"][part] for n in names]
        print(f"| {part} | {' | '.join(f'{v:.2f}' for v in vals)} | {vals[0] - vals[-1]:+.2f} |")
    trig = [best[n]["triggers"] for n in names]
    print(f"| triggers | {' | '.join(str(v) for v in trig)} | {trig[0] - trig[-1]:+d} |")
    print(f"| whole run, s | {' | '.join(f'{s:.2f}' for s in secs)} | {secs[0] - secs[-1]:+.2f} |")
    for comp in best[names[0]]["cpu"]:
        vals = [best[n]["cpu"].get(comp) for n in names]
        if all(v is not None for v in vals):
            print(f"| CPU s, {comp} | {' | '.join(f'{v:.1f}' for v in vals)} | {vals[0] - vals[-1]:+.1f} |")
    print(f"\nspark / kafka-eos, whole run: {secs[-1] / secs[0]:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
