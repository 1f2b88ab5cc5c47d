"""What a reference pipeline (``spark-eos run``) needs of Kafka's ACLs: its source's, and for ``transfers`` the
kafka-eos sink's on the output and dead-letter topics plus what ``transfers.prepare`` needs to create them.
Built from the connectors' own declarations (``sources.kafka.privileges``, ``sinks.kafka.privileges``) on the
options the pipeline gives them, so the two cannot drift."""

from __future__ import annotations

import dataclasses

from connectors.pipelines.config import KAFKA_SINKS, PipelineConfig
from eos_core.privileges import KafkaAcl, distinct

__all__ = ["pipeline_acls"]


def pipeline_acls(cfg: PipelineConfig) -> list[KafkaAcl]:
    """The ACLs of the principal ``cfg`` runs as, each once, in the order the connectors declare them."""
    from connectors.pipelines.source import source_options
    from sources.kafka.options import parse_options as parse_source
    from sources.kafka.privileges import source_acls

    acls = source_acls(parse_source(source_options(cfg), streaming=True))
    if cfg.pipeline in KAFKA_SINKS:
        acls += _transfers_acls(cfg)
    return distinct(acls)


def _transfers_acls(cfg: PipelineConfig) -> list[KafkaAcl]:
    from connectors.pipelines import transfers
    from sinks.kafka.options import parse_options as parse_sink
    from sinks.kafka.privileges import ROW_TOPICS, sink_acls

    options = {**transfers.sink_options(cfg), "checkpointLocation": cfg.checkpoint or "/checkpoint"}
    topics = [cfg.sink_topic, *([cfg.dead_letter_topic] if cfg.dead_letter_topic else [])]
    acls: list[KafkaAcl] = []
    for acl in sink_acls(parse_sink(options, streaming=True)):  # each row names its topic: both of them
        acls += [dataclasses.replace(acl, name=t) for t in topics] if acl.name == ROW_TOPICS else [acl]
    acls += [KafkaAcl("topic", t, "CREATE", why="transfers.prepare creates it when it is missing") for t in topics]
    if not cfg.topic_partitions:
        acls.append(
            KafkaAcl(
                "topic", cfg.topic, "DESCRIBE_CONFIGS", why="transfers.prepare takes the source topic's partitions"
            )
        )
    return acls
