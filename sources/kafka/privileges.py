"""What the kafka-eos source needs of Kafka's ACLs, per option set (docs/security.md is generated from it,
``spark-eos doctor`` checks a principal against it).

READ on each topic it reads (which implies DESCRIBE), and nothing of a consumer group unless a group is used: the
consumers name a group (librdkafka wants one) but read by offset and commit nothing, and a refused look-up
of its coordinator is ignored, so no group ACL is needed to read (Spark's own source needs READ on its
generated ``spark-kafka-source-...`` group). ``startingOffsets=group`` reads the group's offsets (DESCRIBE
on it) and ``commitOffsetsToGroup`` commits to it (READ, which implies DESCRIBE).
"""

from __future__ import annotations

from eos_core.privileges import KafkaAcl
from sources.kafka.option_specs import KafkaSourceOptions

__all__ = ["source_acls"]


def _topics(opts: KafkaSourceOptions) -> list[str]:
    if opts.subscribe:
        return list(opts.subscribe)
    if opts.assign:
        return list(opts.assign)
    return []


def source_acls(opts: KafkaSourceOptions) -> list[KafkaAcl]:
    """The ACLs of the source's principal; with ``subscribePattern``, those of every topic it matches (an ACL
    names a topic or a prefix, not a pattern: one named by the pattern here stands for them)."""
    topics = _topics(opts) or ([opts.subscribe_pattern] if opts.subscribe_pattern else [])
    matched = " (every topic subscribePattern matches)" if opts.subscribe_pattern else ""
    acls = [
        KafkaAcl("topic", t, "READ", why=f"look up its partitions and offsets, read its records{matched}")
        for t in topics
    ]  # READ implies DESCRIBE
    group = opts.group_id
    if group and opts.starting_is_group:
        acls.append(KafkaAcl("group", group, "DESCRIBE", why="start from the group's committed offsets"))
    if group and opts.commit_offsets_to_group:
        acls.append(KafkaAcl("group", group, "READ", why="commit each batch's end offsets (commitOffsetsToGroup)"))
    return acls
