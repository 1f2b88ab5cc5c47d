"""The ``transfers`` pipeline: Kafka payment events -> parse and validate -> ``kafka-eos`` sink into a topic.

Kafka -> Spark -> Kafka, exactly once: each valid event becomes one JSON record keyed by its account
in the output topic (``sink.topic``), ``{"id", "account", "counterparty", "amount", "ts" (UTC,
ISO-8601 with milliseconds), "src_partition", "src_offset"}``, visible to ``read_committed`` readers
when the micro-batch that wrote it is published (the sink's ``visibility``, ``batch`` by default).

A malformed event (``malformed = "dead-letter"``, the default) goes to the dead-letter topic
(``transfers.dead_letters``, default ``<sink.topic>-dead-letters``) in the same transaction as the
batch's good records, as it was read (its key and value bytes unchanged), with headers saying what
is wrong and where it came from: ``eos.malformed``, ``eos.source.topic``, ``eos.source.partition``,
``eos.source.offset``. Each row names its topic in a ``topic`` column, so the sink keeps its markers
on the output topic (``marker.topic``). With ``"fail"`` the query stops naming the record
(``events.parse_events``).

    from connectors.pipelines import PipelineConfig, prepare, start
    cfg = PipelineConfig(pipeline="transfers", bootstrap=..., topic="payments", sink_topic="transfers",
                         checkpoint="/ckpt/transfers")
    prepare(cfg)                   # the output and dead-letter topics, created when missing
    query = start(spark, cfg)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from connectors.pipelines.config import PipelineConfig
from connectors.pipelines.events import parse_events
from connectors.pipelines.source import kafka_stream
from eos_core.kafka_config import client_settings

__all__ = [
    "HEADERS",
    "OUTPUT_FIELDS",
    "build",
    "check_dead_letters",
    "prepare",
    "read_dead_letters",
    "sink_options",
    "verify",
]

OUTPUT_FIELDS = ("id", "account", "counterparty", "amount", "ts", "src_partition", "src_offset")
"""The fields of an output record's JSON value."""

HEADERS = ("eos.malformed", "eos.source.topic", "eos.source.partition", "eos.source.offset")
"""The headers of a dead-letter record: what is wrong with it, and its position in the source topic."""

_JSON = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX", "timeZone": "UTC"}


def sink_options(cfg: PipelineConfig) -> dict[str, str]:
    """The ``kafka-eos`` sink's options: the source's cluster, the sink id, the markers on the output topic;
    ``sink.options`` on top (it may not set ``topic``: each row names its own)."""
    return {
        **cfg.kafka_options,
        "sink.id": cfg.effective_sink_id,
        "marker.topic": cfg.sink_topic,
        **cfg.sink_options,
    }


def build(spark: Any, cfg: PipelineConfig) -> Any:
    """The transfers query's DataStreamWriter (not started): events -> kafka-eos, the output topic and
    (``malformed = "dead-letter"``) the dead-letter topic in one transaction per batch."""
    from pyspark.sql import functions as F

    dead_letters = cfg.dead_letter_topic
    events = parse_events(
        kafka_stream(spark, cfg),
        cfg.malformed,
        keep=("topic", "key", "value"),
        reason="problem" if dead_letters else None,
    )
    good = F.to_json(F.struct(*(F.col(c) for c in OUTPUT_FIELDS)), _JSON)
    columns = {
        "topic": F.lit(cfg.sink_topic),
        "key": F.col("account").cast("binary"),
        "value": good.cast("binary"),
    }
    if dead_letters is not None:
        bad = F.col("malformed").isNotNull()

        def header(name: str, value: Any) -> Any:
            return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))

        where = (F.col("problem"), F.col("src_topic"), F.col("src_partition"), F.col("src_offset"))
        columns = {
            "topic": F.when(bad, F.lit(dead_letters)).otherwise(columns["topic"]),
            "key": F.when(bad, F.col("src_key")).otherwise(columns["key"]),
            "value": F.when(bad, F.col("src_value")).otherwise(columns["value"]),
            "headers": F.when(bad, F.array(*(header(n, v) for n, v in zip(HEADERS, where, strict=True)))),
        }
    rows = events.select(*(col.alias(name) for name, col in columns.items()))
    writer = rows.writeStream.format("kafka-eos").outputMode("append")
    for key, value in sink_options(cfg).items():
        writer = writer.option(key, value)
    return writer


def prepare(cfg: PipelineConfig, *, timeout: float = 30.0) -> None:
    """Create the output topic and the dead-letter topic when missing (idempotent), with
    ``transfers.partitions`` partitions (default: as many as the source topic has), the broker's
    default replication and settings."""
    from eos_core.errors import ConfigError
    from eos_core.kafka_config import client_config
    from sinks.kafka.client import KafkaLookups

    kafka = {**cfg.kafka_options, **{k: v for k, v in cfg.sink_options.items() if k.startswith("kafka.")}}
    lookups = KafkaLookups(
        client_config(kafka, role="producer", context=cfg.pipeline), timeout=timeout, context=cfg.pipeline
    )
    try:
        partitions = cfg.topic_partitions
        if not partitions:
            source = lookups.limits([cfg.topic])[cfg.topic]
            if source is None:
                raise ConfigError(
                    f"{cfg.pipeline}: source.topic {cfg.topic!r} does not exist on {cfg.bootstrap}, so the output topics "
                    f"cannot take its partition count; create it, or set {cfg.pipeline}.partitions",
                    option="source.topic",
                )
            partitions = source.partitions
        lookups.ensure_topic(cfg.sink_topic, partitions, {}, "sink.topic")
        if cfg.dead_letter_topic is not None:
            lookups.ensure_topic(cfg.dead_letter_topic, partitions, {}, f"{cfg.pipeline}.dead_letters")
    finally:
        lookups.close()


def read_dead_letters(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every committed record of a transfers dead-letter topic (read_committed): its key, value and
    headers (``eos.malformed`` as ``reason``, the source position as ``topic``, ``partition``, ``offset``)."""
    import os
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **client_settings(),
            "bootstrap.servers": bootstrap,
            "group.id": f"spark-eos-dead-letters-{os.getpid()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise LookupError(f"dead-letter topic {topic!r} not found on {bootstrap}")
        ends = {}
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[dict[str, Any]] = []
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic!r}: partitions {sorted(set(ends) - done)} not drained in {timeout}s"
                )
            for msg in consumer.consume(1000, 1.0):
                p = int(msg.partition() or 0)
                if msg.error() is not None:  # end of what is committed (a transaction's marker may be last)
                    done.add(p)
                    continue
                offset = int(msg.offset() or 0)
                if offset >= ends[p] - 1:
                    done.add(p)
                pairs: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
                headers = {k: bytes(v or b"").decode("utf-8", "replace") for k, v in pairs}
                out.append(
                    {
                        "key": msg.key(),
                        "value": msg.value(),
                        "reason": headers.get("eos.malformed"),
                        "topic": headers.get("eos.source.topic"),
                        "partition": _number(headers.get("eos.source.partition")),
                        "offset": _number(headers.get("eos.source.offset")),
                        "_partition": p,
                        "_offset": offset,
                    }
                )
        return out
    finally:
        consumer.close()


def _number(text: str | None) -> int | None:
    """A header's whole number; None when absent or not one (a record that is no dead letter of ours)."""
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def check_dead_letters(bootstrap: str, source_topic: str, sink_topic: str, dead_letter_topic: str) -> list[Any]:
    """Two checks of where each source record went, by its Kafka position (no validator needed):

    ``poison.dead_letter_topic``: every record of ``source_topic`` that is not a JSON object is in the
    dead-letter topic exactly once, its value unchanged; ``records.positions``: every source record is
    exactly once in the output topic (its ``src_partition``/``src_offset``) or the dead-letter topic (its
    headers), and neither holds a position the source does not (read_committed, both)."""
    from connectors.toolkit.checker import Check, read_topic

    source = read_topic(bootstrap, source_topic, with_position=True)
    poison = {(int(r["_partition"]), int(r["_offset"])): r["_raw"] for r in source if "_raw" in r}
    letters = read_dead_letters(bootstrap, dead_letter_topic)
    here = [d for d in letters if d["topic"] == source_topic and d["partition"] is not None and d["offset"] is not None]
    seen = Counter((int(d["partition"]), int(d["offset"])) for d in here)
    missing = sorted(p for p in poison if p not in seen)
    extra = sum(n - 1 for p, n in seen.items() if p in poison and n > 1)
    altered = sum(
        1
        for d in here
        if (d["partition"], d["offset"]) in poison and d["value"] != poison[(d["partition"], d["offset"])]
    )
    poison_check = Check(
        "poison.dead_letter_topic",
        not missing and not extra and not altered,
        f"{len(poison)} poison records: {len(poison) - len(missing)} in {dead_letter_topic}, {len(missing)} missing, "
        f"{extra} extra copies, {altered} altered",
        {"poison": len(poison), "missing": len(missing), "extra": extra, "altered": altered},
        {"missing": [f"{p}/{o}" for p, o in missing[:20]]},
    )
    out = Counter(
        (int(r["src_partition"]), int(r["src_offset"]))
        for r in read_topic(bootstrap, sink_topic)
        if "src_partition" in r and "src_offset" in r
    )
    landed = out + seen
    wanted = {(int(r["_partition"]), int(r["_offset"])) for r in source}
    lost = sorted(p for p in wanted if p not in landed)
    twice = sum(n - 1 for p, n in landed.items() if p in wanted and n > 1)
    strays = sum(n for p, n in landed.items() if p not in wanted) + len(letters) - len(here)
    positions_check = Check(
        "records.positions",
        not lost and not twice and not strays,
        f"{len(wanted)} source records: {sum(out.values())} in {sink_topic}, {len(here)} in {dead_letter_topic}; "
        f"{len(lost)} in neither, {twice} more than once, {strays} from nowhere",
        {
            "source": len(wanted),
            "output": sum(out.values()),
            "dead_letters": len(letters),
            "lost": len(lost),
            "twice": twice,
            "strays": strays,
        },
        {"lost": [f"{p}/{o}" for p, o in lost[:20]]},
    )
    return [poison_check, positions_check]


def verify(
    cfg: PipelineConfig,
    *,
    fault_log: str | None = None,
    expect_faults: Any = None,
    payload_fields: Any = ("account", "amount", "counterparty"),
) -> Any:
    """The exact checker for a transfers run: ``topic_checker.verify_topic`` on the output topic (every
    valid event once, read_committed; no open transaction; the sink's last marker = Spark's last
    ``commits/n``; the faults fired), every poison record once in the dead-letter topic, and no
    transaction left open there either."""
    from connectors.toolkit.checker import Check
    from connectors.toolkit.topic_checker import open_transactions, verify_topic

    report = verify_topic(
        bootstrap=cfg.bootstrap,
        source_topic=cfg.topic,
        sink_topic=cfg.sink_topic,
        sink_id=cfg.effective_sink_id,
        checkpoint=cfg.checkpoint,
        marker_topic=cfg.sink_topic,
        payload_fields=payload_fields,
        fault_log=fault_log,
        expect_faults=expect_faults,
    )
    if cfg.dead_letter_topic is not None:
        report.add(*check_dead_letters(cfg.bootstrap, cfg.topic, cfg.sink_topic, cfg.dead_letter_topic))
        left = open_transactions(cfg.bootstrap, [cfg.dead_letter_topic])
        report.add(
            Check(
                "end.open_transactions.dead_letters",
                not left,
                f"{sum(left.values())} offsets of {len(left)} dead-letter partitions behind an open transaction",
                {"open_partitions": len(left)},
            )
        )
    return report
