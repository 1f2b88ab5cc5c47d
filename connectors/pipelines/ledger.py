"""The ``ledger`` pipeline: Kafka payment events -> parse and validate -> ``postgres-2pc`` append.

Each event becomes one row of the ledger table, visible exactly once and only when the micro-batch
that wrote it is committed (two-phase commit bound to Spark's checkpoint). A malformed event goes
to the dead-letter table in the same batch commit (``malformed = "dead-letter"``, the default), or
stops the query with an error naming its topic, partition and offset (``"fail"``; see
``events.parse_events``).

    from connectors.pipelines import PipelineConfig, start
    query = start(spark, PipelineConfig(pipeline="ledger", bootstrap=..., topic="payments",
                                        dsn=..., table="ledger", checkpoint="/ckpt/ledger"))
"""

from __future__ import annotations

from typing import Any

from connectors.pipelines.config import PipelineConfig
from connectors.pipelines.events import parse_events
from connectors.pipelines.source import kafka_stream

__all__ = ["MALFORMED_COLUMN", "build", "ddl", "dead_letter_options", "poison_position"]


def ddl(table: str) -> str:
    """The ledger table: no unique key on purpose, so a duplicate would show as a second row. It
    refuses a malformed event (``malformed`` set: see ``events.parse_events``), which the sink then
    puts in the dead-letter table; a table of an earlier version gets the column."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (id text NOT NULL, account text NOT NULL, counterparty text, "
        "amount bigint NOT NULL, ts timestamptz NOT NULL, src_partition integer NOT NULL, src_offset bigint NOT NULL, "
        f"{MALFORMED_COLUMN}); ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {MALFORMED_COLUMN}"
    )


MALFORMED_COLUMN = "malformed text CHECK (malformed IS NULL)"
"""A table of a pipeline with malformed=dead-letter refuses the rows of malformed events."""


def build(spark: Any, cfg: PipelineConfig) -> Any:
    """The ledger query's DataStreamWriter (not started): events -> postgres-2pc append; malformed
    events to the dead-letter table with the batch (``malformed = "dead-letter"``, the default)."""
    from connectors import postgres_options

    events = parse_events(kafka_stream(spark, cfg), cfg.malformed)
    writer = (
        events.writeStream.format("postgres-2pc")
        .outputMode("append")
        .options(**postgres_options(cfg.dsn))  # the password in the option Spark redacts by key, not in the dsn
        .option("table", cfg.table)
        .option("sink.id", cfg.effective_sink_id)
    )
    for key, value in {**dead_letter_options(cfg), **cfg.sink_options}.items():
        writer = writer.option(key, value)
    return writer


def dead_letter_options(cfg: PipelineConfig) -> dict[str, str]:
    """The sink options that send refused rows (malformed events) to the pipeline's dead-letter table."""
    table = cfg.dead_letter_table
    return {} if table is None else {"errors.tolerance": "all", "errors.table": table}


def poison_position(row: Any) -> tuple[int, int] | None:
    """The Kafka (partition, offset) of a ledger row (a dead-letter row's ``row``), for the checker."""
    try:
        return int(row["src_partition"]), int(row["src_offset"])
    except (KeyError, TypeError, ValueError):
        return None
