"""The ``ledger`` pipeline: Kafka payment events -> parse and validate -> ``postgres-2pc`` append.

Each event becomes one row of the ledger table, visible exactly once and only when the micro-batch
that wrote it is committed (two-phase commit bound to Spark's checkpoint). A malformed event stops
the query with an error naming its topic, partition and offset (see ``events.parse_events``).

    from connectors.pipelines import PipelineConfig, start
    query = start(spark, PipelineConfig(pipeline="ledger", bootstrap=..., topic="payments",
                                        dsn=..., table="ledger", checkpoint="/ckpt/ledger"))
"""

from __future__ import annotations

from typing import Any

from connectors.pipelines.config import PipelineConfig
from connectors.pipelines.events import parse_events
from connectors.pipelines.source import kafka_stream

__all__ = ["build", "ddl"]


def ddl(table: str) -> str:
    """The ledger table: no unique key on purpose, so a duplicate would show as a second row."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (id text NOT NULL, account text NOT NULL, counterparty text, "
        "amount bigint NOT NULL, ts timestamptz NOT NULL, src_partition integer NOT NULL, src_offset bigint NOT NULL)"
    )


def build(spark: Any, cfg: PipelineConfig) -> Any:
    """The ledger query's DataStreamWriter (not started): events -> postgres-2pc append."""
    events = parse_events(kafka_stream(spark, cfg))
    writer = (
        events.writeStream.format("postgres-2pc")
        .outputMode("append")
        .option("dsn", cfg.dsn)
        .option("table", cfg.table)
        .option("sink.id", cfg.effective_sink_id)
    )
    for key, value in cfg.sink_options.items():
        writer = writer.option(key, value)
    return writer
