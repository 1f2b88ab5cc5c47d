"""The Kafka side shared by the reference pipelines: a ``kafka-eos`` stream configured from the config."""

from __future__ import annotations

from typing import Any

from connectors.pipelines.config import PipelineConfig

__all__ = ["kafka_stream"]


def kafka_stream(spark: Any, cfg: PipelineConfig) -> Any:
    """``spark.readStream.format("kafka-eos")`` on ``cfg.topic`` (read_committed, failOnDataLoss)."""
    reader = (
        spark.readStream.format("kafka-eos")
        .options(**cfg.kafka_options)
        .option("subscribe", cfg.topic)
        .option("startingOffsets", cfg.starting_offsets)
        .option("failOnDataLoss", "true")
        .option("kafka.isolation.level", "read_committed")
    )
    if cfg.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    for key, value in cfg.source_options.items():
        reader = reader.option(key, value)
    return reader.load()
