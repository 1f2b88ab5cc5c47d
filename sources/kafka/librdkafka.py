"""The Java client's consumer settings (Spark's ``kafka.*`` options) as librdkafka's.

``consumer_config(opts)``: the source's side of ``eos_core.kafka_config.client_config`` (shared with the
Kafka sink, whose producer settings it maps the same way).
"""

from __future__ import annotations

from eos_core.kafka_config import client_config
from sources.kafka.option_specs import CONTEXT, KafkaSourceOptions

__all__ = ["consumer_config"]


def consumer_config(opts: KafkaSourceOptions) -> dict[str, str]:
    """librdkafka consumer configuration from the ``kafka.*`` options, Java names mapped.

    A Java setting with a librdkafka equivalent is renamed; one that changes nothing a read relies on
    is dropped with a log line saying why; one librdkafka cannot honour (JKS stores, Java classes) is an
    error naming the librdkafka setting that replaces it. Values are never logged (they may be secrets).
    """
    return client_config(opts.kafka, role="consumer", context=CONTEXT)
