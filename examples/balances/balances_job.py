"""An example user job keeping keyed state with ``transformWithStateInPandas``: account balances.

Transfers arrive in a binary format: the Kafka key is the account (UTF-8), the value 12 bytes, a
big-endian signed 64-bit amount in cents followed by a big-endian 32-bit transfer number. The job
keeps, per account, a ValueState (balance, transfers, version: the Kafka offset of the last transfer
applied; an account's transfers share a partition, keyed by the account) and a ListState of the
last three transfers, and upserts one row per touched account and batch through the upsert sink's
foreachBatch function (``connectors.upsert_batch``), version-guarded: a replayed batch rewrites the
same rows and never moves a balance back. The state lives in the RocksDB state store (what
transformWithState needs), in the checkpoint.

The verdict comes from the reference-run oracle, by key:

    spark-eos chaos --app balances_job:build --generator balances_job:records --sink-kind foreachbatch \
        --oracle upsert:account --kills 4 --records 2000 --faults kill:1,fault-point:1,executor-loss:1
    pytest test_balances_chaos.py
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from typing import Any

from connectors.toolkit.app_runner import Job

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUTPUT = "account string, balance long, transfers long, version long, recent string"


def records(seed: int, n: int) -> Iterator[tuple[str, bytes]]:
    """``n`` transfers over 12 accounts (key: the account, value: amount and number, binary)."""
    rng = random.Random(seed)
    for i in range(n):
        cents = rng.randint(-20_000, 50_000)
        yield f"acct{rng.randrange(12):02d}", struct.pack(">qI", cents, i)


def setup(job: Job) -> None:
    import psycopg

    with psycopg.connect(job.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {job.table} (account text PRIMARY KEY, balance bigint NOT NULL, "  # type: ignore[arg-type]
            "transfers bigint NOT NULL, version bigint NOT NULL, recent text NOT NULL)"
        )


def _processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Balances(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.balance = handle.getValueState("balance", "balance long, transfers long, version long")
            self.recent = handle.getListState("recent", "number long, cents long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            batch = pd.concat(list(rows), ignore_index=True).sort_values("offset", kind="stable")
            current = self.balance.get() if self.balance.exists() else None
            balance, transfers, version = (int(current[0]), int(current[1]), int(current[2])) if current else (0, 0, -1)
            recent = [tuple(r) for r in self.recent.get()] if self.recent.exists() else []
            for value, offset in zip(batch["value"], batch["offset"], strict=True):
                cents, number = struct.unpack(">qI", bytes(value))
                balance += cents
                transfers += 1
                version = max(version, int(offset))
                recent.append((number, cents))
            recent = recent[-3:]
            self.balance.update((balance, transfers, version))
            self.recent.put(recent)
            yield pd.DataFrame(
                {
                    "account": [str(key[0])],
                    "balance": [balance],
                    "transfers": [transfers],
                    "version": [version],
                    "recent": [json.dumps([{"number": int(n), "cents": int(c)} for n, c in recent])],
                }
            )

        def close(self) -> None:
            pass

    return Balances()


def build(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    import connectors

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)  # transformWithState needs it
    raw = (
        spark.readStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("subscribe", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job.max_offsets)
        .load()
    )
    transfers = raw.select(F.col("key").cast("string").alias("account"), "value", "offset")
    balances = transfers.groupBy("account").transformWithStateInPandas(
        statefulProcessor=_processor(), outputStructType=OUTPUT, outputMode="Update", timeMode="None"
    )
    upsert = connectors.upsert_batch(
        **connectors.postgres_options(job.dsn), table=job.table, key="account", version="version"
    )
    return balances.writeStream.outputMode("update").foreachBatch(upsert)
