"""What the kafka-eos sink needs of Kafka's ACLs, per option set (docs/security.md is generated from it,
``spark-eos doctor`` checks a principal against it, and an authorization failure names the ACL from it).

Every transactional id and consumer group of a sink starts with ``spark-eos:<sink id>:`` (``markers.sink_names``):
one prefixed ACL of each covers every task slot's and the publish's. The marker of a batch is an offset
committed for the sink's group against partition 0 of the marker topic inside the batch's transaction
(TxnOffsetCommit), which Kafka authorizes as a READ of that topic: a sink that only writes its output topic
still needs READ on it when it is the marker topic (the default).
"""

from __future__ import annotations

from eos_core.privileges import KafkaAcl
from sinks.kafka.markers import sink_names
from sinks.kafka.options import KafkaSinkOptions

__all__ = ["ROW_TOPICS", "sink_acls", "staging_size"]

ROW_TOPICS = "<each topic the rows name>"  # the topic of sink_acls' row ACLs when no option names it

STAGING_HEADER = 1024  # bytes a staged record may grow by (the staging header): the staging topic's headroom


def staging_size(target_max_message_bytes: int) -> int:
    """The least ``max.message.bytes`` of a staging topic for a target topic that takes records up to
    ``target_max_message_bytes``: every record the target takes must fit with the staging header."""
    return target_max_message_bytes + STAGING_HEADER


def sink_acls(opts: KafkaSinkOptions) -> list[KafkaAcl]:
    """The ACLs of the sink's principal. Without option ``topic`` the rows name their topics: WRITE and
    DESCRIBE_CONFIGS on each of them (shown here for the marker topic, which is required then)."""
    names = sink_names(opts.sink_id)
    topic = opts.topic or ROW_TOPICS
    marker = opts.marker_topic or opts.topic or "<marker.topic>"
    acls = [
        KafkaAcl("topic", topic, "WRITE", why="write the rows (WRITE implies DESCRIBE)"),
        KafkaAcl("topic", topic, "DESCRIBE_CONFIGS", why="read max.message.bytes and cleanup.policy to screen rows"),
        KafkaAcl(
            "topic",
            marker,
            "READ",
            why="commit each batch's marker against its partition 0 in the batch's transaction (TxnOffsetCommit)",
        ),
        KafkaAcl(
            "transactional_id", names, "WRITE", prefixed=True, why="the transactions of the publish and task slots"
        ),
        KafkaAcl(
            "group",
            names,
            "READ",
            prefixed=True,
            why="the marker groups: commit markers in transactions, read them back, list the sink's slots",
        ),
    ]
    # visibility=batch stages every batch; visibility=partition stages too when it replays a batch that a crash
    # left partly written (some task slots committed): the other slots stage and the driver publishes them
    # (spark._survey). Without these ACLs such a replay failed on a refused staging topic.
    staging = opts.staging_topic
    stages = (
        "tasks stage their rows"
        if opts.visibility == "batch"
        else "a replay of a batch a crash left partly written stages its other task slots' rows"
    )
    acls += [
        KafkaAcl("topic", staging, "WRITE", why=f"{stages} (staging.topic)"),
        KafkaAcl("topic", staging, "READ", why="the publish reads the staged rows"),
        KafkaAcl(
            "topic", staging, "DESCRIBE_CONFIGS", why="check the staging topic takes every record the target does"
        ),
        KafkaAcl(
            "topic",
            staging,
            "CREATE",
            why="create the staging topic when it is missing (or an admin creates it: docs/security.md)",
        ),
    ]
    if opts.errors_tolerance == "all" and opts.errors_topic:
        acls += [
            KafkaAcl("topic", opts.errors_topic, "WRITE", why="divert refused rows (errors.tolerance=all)"),
            KafkaAcl("topic", opts.errors_topic, "DESCRIBE_CONFIGS", why="refuse a compacted errors.topic at start"),
        ]
    return acls
