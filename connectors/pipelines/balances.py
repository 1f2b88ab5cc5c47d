"""The ``balances`` pipeline: payment events -> keyed state per account -> ``postgres-upsert`` (update).

``transformWithStateInPandas`` keyed by account keeps, per account:

- ValueState ``balance``: (balance, events, version) where version = Kafka offset of the last
  applied event (events of one account share a partition: the Kafka key is the account);
- ListState ``recent``: the last N events (id, amount, counterparty);
- MapState ``counterparties``: total amount per counterparty;

each with a processing-time TTL, so an account idle for longer than the TTL starts again from zero
(its state is gone; the next event writes a fresh row with a higher version). The state lives in
the RocksDB state store with changelog checkpointing. Every batch upserts one row per touched
account through the upsert sink's ``foreachBatch`` adapter (update semantics, version-guarded, so a
replayed batch is a no-op and never moves a balance backwards).

A malformed event (``malformed = "dead-letter"``, the default) is keyed on its own position, never
touches an account's state, and its output row, refused by the table, lands in the dead-letter
table; with ``"fail"`` it stops the query (``events.parse_events``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from connectors.pipelines.config import PipelineConfig
from connectors.pipelines.events import parse_events
from connectors.pipelines.ledger import MALFORMED_COLUMN, dead_letter_options
from connectors.pipelines.source import kafka_stream

__all__ = ["OUTPUT_SCHEMA", "STATE_CONF", "BalanceProcessor", "build", "ddl", "poison_position", "write_batch"]

OUTPUT_SCHEMA = (
    "account string, balance long, events long, version long, last_event_id string, "
    "recent string, counterparties string"
)

# transformWithState refuses the HDFS-backed store; changelog checkpointing = Flink's incremental checkpoints
STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def ddl(table: str) -> str:
    """The balances table; like the ledger's, it refuses the row of a malformed event (``malformed`` set)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (account text PRIMARY KEY, balance bigint NOT NULL, "
        "events bigint NOT NULL, version bigint NOT NULL, last_event_id text NOT NULL, recent text, counterparties text, "
        f"{MALFORMED_COLUMN}); ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {MALFORMED_COLUMN}"
    )


MALFORMED_KEY = "malformed:"
"""With malformed=dead-letter a malformed event is keyed ``malformed:<partition>/<offset>``: its own
group, which touches no account's state and whose one output row the table refuses."""


def _processor_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class BalanceProcessor(_processor_base()):  # type: ignore[misc]
    """Per-account balance, recent events and per-counterparty totals, with TTL on idle accounts."""

    def __init__(self, ttl_ms: int, last_n: int, malformed: bool = False) -> None:
        self.ttl_ms = int(ttl_ms)
        self.last_n = int(last_n)
        self.malformed = malformed  # input and output carry the malformed column (malformed=dead-letter)

    def init(self, handle: Any) -> None:
        self.balance = handle.getValueState("balance", "balance long, events long, version long", self.ttl_ms)
        self.recent = handle.getListState("recent", "id string, amount long, counterparty string", self.ttl_ms)
        self.counterparties = handle.getMapState("counterparties", "counterparty string", "total long", self.ttl_ms)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        batch = pd.concat(list(rows), ignore_index=True).sort_values(["src_offset", "id"], kind="stable")
        if self.malformed and str(key[0]).startswith(MALFORMED_KEY):  # one malformed event: no state at all
            ev = batch.iloc[0]
            yield pd.DataFrame(
                {
                    "account": [str(key[0])],
                    "balance": [0],
                    "events": [0],
                    "version": [int(ev["src_offset"])],
                    "last_event_id": ["" if pd.isna(ev["id"]) else str(ev["id"])],
                    "recent": ["[]"],
                    "counterparties": ["{}"],
                    "malformed": [str(ev["malformed"])],
                }
            )
            return
        current = self.balance.get() if self.balance.exists() else None
        if current is None:
            # a new account, or one idle past the TTL: the TTL expires each state variable (and each map
            # entry) on its own clock, so drop whatever survived and start the whole account from zero
            self.recent.clear()
            self.counterparties.clear()
        balance, events, version = (int(current[0]), int(current[1]), int(current[2])) if current else (0, 0, -1)
        recent = [tuple(r) for r in self.recent.get()] if self.recent.exists() else []
        totals: dict[str, int] = {}
        last_id = ""
        for ev in batch.itertuples(index=False):
            amount = int(ev.amount)
            balance += amount
            events += 1
            version = max(version, int(ev.src_offset))
            last_id = str(ev.id)
            cp = str(ev.counterparty)
            recent.append((last_id, amount, cp))
            totals[cp] = totals.get(cp, 0) + amount
        all_totals = {str(k[0]): int(v[0]) for k, v in self.counterparties.iterator()}
        for cp, add in totals.items():
            all_totals[cp] = all_totals.get(cp, 0) + add
        # rewrite every entry, touched or not: a map entry's TTL restarts only when it is written, and
        # the TTL here is the account's (idle accounts expire whole, active ones keep every counterparty)
        for cp, total in all_totals.items():
            self.counterparties.updateValue((cp,), (total,))
        recent = recent[-self.last_n :]
        self.recent.put(recent)
        self.balance.update((balance, events, version))
        out = {
            "account": [str(key[0])],
            "balance": [balance],
            "events": [events],
            "version": [version],
            "last_event_id": [last_id],
            "recent": [json.dumps([{"id": i, "amount": a, "counterparty": c} for i, a, c in recent])],
            "counterparties": [json.dumps(dict(sorted(all_totals.items())))],
        }
        if self.malformed:
            out["malformed"] = [None]
        yield pd.DataFrame(out)

    def close(self) -> None:
        pass


def write_batch(cfg: PipelineConfig) -> Any:
    """The foreachBatch function: fault points around the upsert sink's adapter (version-guarded)."""
    import connectors
    from eos_core import faults

    options = {**dead_letter_options(cfg), **cfg.sink_options}
    # the password goes in the option Spark redacts by key, never inside the dsn its plans print
    connection = connectors.postgres_options(cfg.dsn)
    upsert = connectors.upsert_batch(**connection, table=cfg.table, key="account", version="version", **options)

    def write(df: Any, batch_id: int) -> None:
        upsert(df, batch_id)

    # pipeline.batch before it, sink.after_commit after it (rows upserted, Spark's commits/n not yet
    # written: a replay must be a no-op)
    return faults.around_batch(write)


def build(spark: Any, cfg: PipelineConfig) -> Any:
    """The balances query's DataStreamWriter (not started)."""
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", "")
    if "RocksDB" not in provider:
        from eos_core.errors import ConfigError

        raise ConfigError(
            "balances: transformWithStateInPandas needs the RocksDB state store; start the session with "
            f"spark.sql.streaming.stateStore.providerClass={STATE_CONF['spark.sql.streaming.stateStore.providerClass']} "
            f"(got {provider or 'the default HDFS-backed store'})",
            option="spark.sql.streaming.stateStore.providerClass",
        )
    from pyspark.sql import functions as F

    events = parse_events(kafka_stream(spark, cfg), cfg.malformed)
    malformed = cfg.malformed == "dead-letter"
    if malformed:
        own_key = F.concat(
            F.lit(MALFORMED_KEY), F.col("src_partition").cast("string"), F.lit("/"), F.col("src_offset").cast("string")
        )
        events = events.withColumn("account", F.when(F.col("malformed").isNull(), F.col("account")).otherwise(own_key))
    out = events.groupBy("account").transformWithStateInPandas(
        statefulProcessor=BalanceProcessor(int(cfg.ttl_seconds * 1000), cfg.last_n, malformed),
        outputStructType=OUTPUT_SCHEMA + (", malformed string" if malformed else ""),
        outputMode="Update",
        timeMode="ProcessingTime",  # state TTL runs on processing time
    )
    return out.writeStream.outputMode("update").foreachBatch(write_batch(cfg))


def poison_position(row: Any) -> tuple[int, int] | None:
    """The Kafka (partition, offset) of a malformed event's balances row (``malformed:<p>/<o>``), for the checker."""
    account = str(row.get("account") or "")
    if not account.startswith(MALFORMED_KEY):
        return None
    part, _, offset = account[len(MALFORMED_KEY) :].partition("/")
    try:
        return int(part), int(offset)
    except ValueError:
        return None
