"""Options of the kafka-eos source: Spark's names, defaults and validation rules, parsed once.

``parse_options(raw, streaming=...)`` parses a raw option map into ``KafkaSourceOptions`` (declared in
``option_specs``), checks it as Spark does (``option_checks``) and logs the options that have no
meaning for this read; ``consumer_config`` turns its ``kafka.*`` options into librdkafka's consumer
configuration (``eos_core.kafka_config``, which maps the Kafka sink's producer settings the same way).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from eos_core.kafka_config import client_config
from sources.kafka.option_checks import REJECTED_KAFKA_OPTIONS, validate
from sources.kafka.option_specs import CONTEXT, OPTIONS, KafkaSourceOptions

__all__ = [
    "CONTEXT",
    "OPTIONS",
    "REJECTED_KAFKA_OPTIONS",
    "KafkaSourceOptions",
    "consumer_config",
    "parse_options",
]

log = logging.getLogger(__name__)


def parse_options(raw: Mapping[str, Any], *, streaming: bool) -> KafkaSourceOptions:
    """Parse and validate like Spark's KafkaSourceProvider; raise ConfigError naming the option."""
    opts = OPTIONS.build(raw)
    # Kafka options are case-sensitive in librdkafka; Spark lower-cases the whole key.
    opts = dataclasses.replace(opts, kafka={"kafka." + k[len("kafka.") :].lower(): v for k, v in opts.kafka.items()})
    validate(opts, streaming=streaming)
    _log_ignored(raw, opts, streaming=streaming)
    return opts


# Options with no meaning in a batch read (Spark ignores them there too).
_STREAM_ONLY = (
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxBytesPerTrigger",
    "commitOffsetsToGroup",
    "startingOffsetsLocation",
)


def _log_ignored(raw: Mapping[str, Any], opts: KafkaSourceOptions, *, streaming: bool) -> None:
    """One log line per option Spark accepts that has no meaning for this read."""
    given = {str(k).lower() for k in raw}
    if opts.topic is not None:
        log.info(
            "%s: ignoring option 'topic': it is a Kafka sink option (the topic written to); "
            "the source reads what subscribe/subscribePattern/assign name",
            CONTEXT,
        )
    if not streaming:
        for name in _STREAM_ONLY:
            if name.lower() in given:
                log.info("%s: ignoring option '%s': it has no meaning in a batch read", CONTEXT, name)


def consumer_config(opts: KafkaSourceOptions) -> dict[str, str]:
    """librdkafka consumer configuration from the ``kafka.*`` options, Java names mapped.

    A Java setting with a librdkafka equivalent is renamed; one that changes nothing a read relies on
    is dropped with a log line saying why; one librdkafka cannot honour (JKS stores, Java classes) is an
    error naming the librdkafka setting that replaces it. Values are never logged (they may be secrets).
    """
    return client_config(opts.kafka, role="consumer", context=CONTEXT)
