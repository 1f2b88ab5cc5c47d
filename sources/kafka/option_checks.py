"""The kafka-eos source's checks across options, as Spark's KafkaSourceProvider makes them.

``validate(opts, streaming=...)`` raises a ConfigError naming the option: which topics (exactly one
of subscribe, subscribePattern, assign), the ``kafka.*`` options Spark refuses, offsets and
timestamps (batch or streaming), trigger limits, the consumer group, the fault spec.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sources.kafka.offsets import INT64_MAX
from sources.kafka.option_specs import KafkaSourceOptions, fail

__all__ = ["INT32_MAX", "REJECTED_KAFKA_OPTIONS", "validate"]

"""The largest Kafka offset or timestamp (a signed 64-bit long on the broker and in Spark)."""
INT32_MAX = 2**31 - 1
"""The largest Kafka partition number (a signed 32-bit int)."""

# Spark refuses these Kafka options (KafkaSourceProvider); we say why in the same words.
REJECTED_KAFKA_OPTIONS: dict[str, str] = {
    "group.id": "",  # allowed, see below; listed so the loop below skips it
    "auto.offset.reset": "set the source option 'startingOffsets' instead (earliest, latest or JSON); the source "
    "manages offsets itself and an automatic reset would silently skip or repeat records",
    "key.deserializer": "keys are always read as bytes; cast or deserialize the 'key' column with DataFrame operations",
    "value.deserializer": "values are always read as bytes; cast or deserialize the 'value' column with DataFrame operations",
    "enable.auto.commit": "the source does not commit consumer offsets for correctness; offsets are kept in the "
    "Spark checkpoint (use commitOffsetsToGroup to publish progress to a group)",
    "interceptor.classes": "Kafka interceptors can break the source's read semantics (records are read more than once)",
}
del REJECTED_KAFKA_OPTIONS["group.id"]


def validate(opts: KafkaSourceOptions, *, streaming: bool) -> None:
    """Raise a ConfigError naming the option when ``opts`` cannot be read as Spark would read them."""
    _validate_strategy(opts)
    _validate_kafka(opts)
    _validate_offsets(opts, streaming=streaming)
    if (
        opts.min_offsets_per_trigger
        and opts.max_offsets_per_trigger
        and opts.min_offsets_per_trigger > opts.max_offsets_per_trigger
    ):
        raise fail(
            f"option 'minOffsetsPerTrigger' ({opts.min_offsets_per_trigger}) is greater than 'maxOffsetsPerTrigger' "
            f"({opts.max_offsets_per_trigger}); make min <= max",
            "minOffsetsPerTrigger",
        )
    if (opts.commit_offsets_to_group or opts.starting_is_group) and not opts.group_id:
        which = "commitOffsetsToGroup" if opts.commit_offsets_to_group else "startingOffsets"
        raise fail(f"option '{which}' needs the consumer group named by option 'kafka.group.id'; set it", which)
    _validate_formats(opts)
    if opts.faults:
        from eos_core.faults import parse_spec

        parse_spec(opts.faults)


def _validate_formats(opts: KafkaSourceOptions) -> None:
    """An avro key or value needs the registry, and a subject: given, or the one topic's (TopicNameStrategy)."""
    if opts.value_layout == "flat" and opts.value_format == "raw":
        raise fail(
            "option 'value.layout' is 'flat', which lays a decoded value's fields out as columns, and the value is "
            "read raw: set option 'value.format' (avro), or drop value.layout",
            "value.layout",
        )
    if not opts.decodes:
        if opts.errors_tolerance != "none":
            raise fail(
                "option 'errors.tolerance' is 'all' on a read of raw keys and values: it keeps the records "
                "value.format/key.format=avro cannot decode, and raw bytes always read; drop it",
                "errors.tolerance",
            )
        return
    from eos_core.registry_avro import is_inline_schema

    which = "value.format" if opts.value_format != "raw" else "key.format"
    if not (opts.schema_registry_url or "").strip():
        raise fail(
            f"option {which!r} is {getattr(opts, which.replace('.', '_'))!r}, which reads each record's writer schema "
            "from a Schema Registry: set option 'schema.registry.url' (e.g. http://registry:8081; Apicurio: "
            "http://registry:8080/apis/ccompat/v7)",
            "schema.registry.url",
        )
    for column in ("key", "value"):
        inline = is_inline_schema(getattr(opts, f"{column}_schema"))
        if getattr(opts, f"{column}_format") == "raw" or getattr(opts, f"{column}_subject") or inline:
            continue
        topics = opts.named_topics
        if len(topics) != 1:
            raise fail(
                f"option '{column}.format' reads the reader schema of subject <topic>-{column}, and this query "
                f"reads {'a pattern of topics' if opts.subscribe_pattern else f'{len(topics)} topics'}: name the "
                f"subject with option '{column}.subject' (or give the schema inline in '{column}.schema')",
                f"{column}.subject",
            )


def _validate_strategy(opts: KafkaSourceOptions) -> None:
    given = [
        name
        for name, value in (
            ("subscribe", opts.subscribe),
            ("subscribePattern", opts.subscribe_pattern),
            ("assign", opts.assign),
        )
        if value is not None
    ]
    if len(given) != 1:
        what = "none is given" if not given else f"{', '.join(given)} are all given"
        raise fail(
            f"exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must say which topics to read; {what}",
            given[0] if given else "subscribe",
        )
    if opts.subscribe is not None and not opts.subscribe:
        raise fail("option 'subscribe' lists no topic; give a comma-separated list of topics", "subscribe")
    if opts.subscribe_pattern is not None:
        if not opts.subscribe_pattern.strip():
            raise fail("option 'subscribePattern' is empty; give a regular expression", "subscribePattern")
        try:
            re.compile(opts.subscribe_pattern)
        except re.error as exc:
            raise fail(
                f"option 'subscribePattern' {opts.subscribe_pattern!r} is not a valid regular expression: {exc}",
                "subscribePattern",
            ) from None
    if opts.assign is not None:
        a = opts.assign
        ok = (
            isinstance(a, dict)
            and a
            and all(
                isinstance(t, str)
                and t
                and isinstance(ps, list)
                and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in ps)
                for t, ps in a.items()
            )
        )
        if not ok:
            raise fail(
                f"option 'assign' must be JSON mapping topics to lists of partition numbers, like {{\"t\":[0,1]}}; got {json.dumps(a)}",
                "assign",
            )


def _validate_kafka(opts: KafkaSourceOptions) -> None:
    if not opts.bootstrap.strip():
        raise fail("option 'kafka.bootstrap.servers' is required (host:port[,host:port...])", "kafka.bootstrap.servers")
    for key in opts.kafka:
        name = key[len("kafka.") :]
        if name in REJECTED_KAFKA_OPTIONS:
            raise fail(f"Kafka option '{name}' is not supported: {REJECTED_KAFKA_OPTIONS[name]}", key)
    level = opts.kafka.get("kafka.isolation.level")
    if level is not None and level.strip().lower() not in ("read_committed", "read_uncommitted"):
        raise fail(
            f"option 'kafka.isolation.level' is {level!r}; expected read_committed or read_uncommitted",
            "kafka.isolation.level",
        )


def _check_offset_json(value: Any, option: str, *, allowed: tuple[int, ...], what: str) -> dict[str, dict[str, int]]:
    if not isinstance(value, dict) or not value:
        raise fail(f'option \'{option}\' must be JSON like {{"topic":{{"0":{what}}}}}; got {json.dumps(value)}', option)
    for topic, parts in value.items():
        if not isinstance(parts, dict) or not parts:
            raise fail(
                f"option '{option}': topic {topic!r} must map partition numbers to {what}s, got {json.dumps(parts)}",
                option,
            )
        for p, off in parts.items():
            if not str(p).lstrip("-").isdigit() or not 0 <= int(p) <= INT32_MAX:
                raise fail(
                    f"option '{option}': {p!r} of topic {topic!r} is not a partition number (0 to {INT32_MAX})",
                    option,
                )
            if not isinstance(off, int) or isinstance(off, bool) or (off < 0 and off not in allowed) or off > INT64_MAX:
                valid = " or ".join(str(a) for a in allowed)
                raise fail(
                    f"option '{option}': {topic}-{p} is {json.dumps(off)}; expected a {what} >= 0"
                    + (f" or {valid}" if allowed else "")
                    + f" (topic {topic!r}, partition {p}; a {what} is at most {INT64_MAX}, Kafka's 64-bit limit)",
                    option,
                )
    return value


def _offsets_spec(raw: str | None, option: str, *, words: tuple[str, ...], allowed: tuple[int, ...]) -> Any:
    """'earliest' / 'latest' / 'group' (as allowed) or a validated JSON dict."""
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in words:
        return text.lower()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(
            f"option '{option}' is {raw!r}: neither {' nor '.join(words)} nor valid JSON ({exc.msg} at column {exc.colno})",
            option,
        ) from None
    return _check_offset_json(value, option, allowed=allowed, what="offset")


def _validate_offsets(opts: KafkaSourceOptions, *, streaming: bool) -> None:
    if streaming:
        for name, value in (
            ("endingOffsets", opts.ending_offsets),
            ("endingTimestamp", opts.ending_timestamp),
            ("endingOffsetsByTimestamp", opts.ending_offsets_by_timestamp),
        ):
            if value is not None:
                raise fail(
                    f"option '{name}' is for batch queries only; a streaming query reads on and never ends", name
                )
    start = _offsets_spec(
        opts.starting_offsets, "startingOffsets", words=("earliest", "latest", "group"), allowed=(-2, -1)
    )
    if not streaming:
        if start == "latest":
            raise fail(
                "option 'startingOffsets' cannot be latest for batch queries; use earliest, group or JSON offsets",
                "startingOffsets",
            )
        if isinstance(start, dict) and any(o == -1 for parts in start.values() for o in parts.values()):
            raise fail("option 'startingOffsets' cannot use -1 (latest) for batch queries", "startingOffsets")
        end = _offsets_spec(opts.ending_offsets, "endingOffsets", words=("earliest", "latest"), allowed=(-2, -1))
        if end == "earliest":
            raise fail(
                "option 'endingOffsets' cannot be earliest for batch queries; use latest or JSON offsets",
                "endingOffsets",
            )
        if isinstance(end, dict) and any(o == -2 for parts in end.values() for o in parts.values()):
            raise fail("option 'endingOffsets' cannot use -2 (earliest) for batch queries", "endingOffsets")
        if opts.ending_offsets_by_timestamp is not None:
            _check_offset_json(
                opts.ending_offsets_by_timestamp, "endingOffsetsByTimestamp", allowed=(), what="timestamp"
            )
        if (
            opts.starting_timestamp is not None
            and opts.ending_timestamp is not None
            and opts.starting_timestamp > opts.ending_timestamp
        ):
            raise fail(
                f"option 'startingTimestamp' ({opts.starting_timestamp}) is after 'endingTimestamp' ({opts.ending_timestamp})",
                "startingTimestamp",
            )
        if isinstance(start, dict) and isinstance(end, dict):
            for topic, parts in start.items():
                for p, s in parts.items():
                    e = end.get(topic, {}).get(p)
                    if e is not None and e >= 0 and s >= 0 and s > e:
                        raise fail(
                            f"startingOffsets {s} is after endingOffsets {e} for {topic}-{p}; the start must not exceed the end",
                            "startingOffsets",
                        )
    if opts.starting_offsets_by_timestamp is not None:
        _check_offset_json(
            opts.starting_offsets_by_timestamp, "startingOffsetsByTimestamp", allowed=(), what="timestamp"
        )
    if opts.assign is not None:
        assigned = {(t, int(p)) for t, ps in opts.assign.items() for p in ps}
        for name, spec in (
            ("startingOffsets", start),
            ("startingOffsetsByTimestamp", opts.starting_offsets_by_timestamp),
        ):
            if isinstance(spec, dict):
                given = {(t, int(p)) for t, ps in spec.items() for p in ps}
                missing = sorted(assigned - given)
                if missing:
                    shown = ", ".join(f"{t}-{p}" for t, p in missing)
                    raise fail(
                        f"option '{name}' does not cover the assigned partitions {shown}; give an offset for each", name
                    )
                extra = sorted(given - assigned)
                if extra:
                    shown = ", ".join(f"{t}-{p}" for t, p in extra)
                    raise fail(f"option '{name}' names partitions that 'assign' does not: {shown}", name)
