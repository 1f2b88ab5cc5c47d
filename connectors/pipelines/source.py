"""The Kafka side shared by the reference pipelines: a ``kafka-eos`` stream configured from the config."""

from __future__ import annotations

from typing import Any

from connectors.pipelines.config import PipelineConfig

__all__ = ["kafka_stream", "source_options"]


def source_options(cfg: PipelineConfig) -> dict[str, str]:
    """The ``kafka-eos`` source's options on ``cfg.topic`` (read_committed, failOnDataLoss), ``source.options``
    over them."""
    options = {
        **cfg.kafka_options,
        "subscribe": cfg.topic,
        "startingOffsets": cfg.starting_offsets,
        "failOnDataLoss": "true",
        "kafka.isolation.level": "read_committed",
    }
    if cfg.max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(cfg.max_offsets_per_trigger)
    return {**options, **cfg.source_options}


def kafka_stream(spark: Any, cfg: PipelineConfig) -> Any:
    """``spark.readStream.format("kafka-eos")`` with ``source_options(cfg)``."""
    return spark.readStream.format("kafka-eos").options(**source_options(cfg)).load()
