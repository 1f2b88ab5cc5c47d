"""The operations behind ``spark-eos kafka-sink`` (``connectors.commands.kafka_sink``): the markers of a
``kafka-eos`` sink, and, knowingly, their removal, the way out of a refusal (K1) when rows already written
may be written again."""

from __future__ import annotations

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from eos_core.errors import ConfigError, ServiceError
from eos_core.kafka_config import client_settings
from sinks.kafka.markers import Marker, sink_names

__all__ = ["admin", "marker_groups", "reset_markers", "sink_markers", "unknown_sink"]

_TIMEOUT = 15.0


def admin(bootstrap: str) -> AdminClient:
    """An admin client of the cluster at ``bootstrap``, once it answered (ServiceError when it does not)."""
    admin = AdminClient({**client_settings(), "bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=_TIMEOUT)
    except KafkaException as exc:
        raise ServiceError(
            f"kafka-sink: the Kafka cluster at {bootstrap} did not answer in {_TIMEOUT:.0f} s: {exc}"
        ) from None
    return admin


def marker_groups(admin: AdminClient, sink_id: str) -> list[str]:
    """The consumer groups that hold the sink's markers."""
    listed = admin.list_consumer_groups(request_timeout=_TIMEOUT).result(_TIMEOUT)
    return sorted(g.group_id for g in listed.valid if g.group_id.startswith(sink_names(sink_id)))


def sink_markers(admin: AdminClient, sink_id: str, marker_topic: str) -> dict[str, Marker | str]:
    """Each marker group of the sink -> its marker (or why it has none on ``marker_topic``)."""
    out: dict[str, Marker | str] = {}
    for group in marker_groups(admin, sink_id):
        futures = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(marker_topic, 0)])], request_timeout=_TIMEOUT
        )
        (tp,) = futures[group].result(_TIMEOUT).topic_partitions
        if tp.error is not None:
            out[group] = f"{tp.error.name()}"
        elif tp.offset < 0:
            out[group] = f"no marker on {marker_topic}-0 (another marker.topic?)"
        else:
            try:
                out[group] = Marker.parse(tp.offset, tp.metadata, group=group)
            except Exception as exc:  # a foreign commit: shown, not fatal to the listing
                out[group] = str(exc).split(":", 2)[-1].strip()[:120]
    return out


def unknown_sink(sink_id: str, bootstrap: str) -> ConfigError:
    return ConfigError(
        f"kafka-sink: no consumer group of sink {sink_id!r} on {bootstrap} (its groups are named "
        f"{sink_names(sink_id)}...): the sink id is misspelled, the sink never committed a batch, or it was reset",
        option="--sink-id",
    )


def reset_markers(bootstrap: str, sink_id: str, *, yes: bool) -> int:
    """Delete the sink's marker groups: its next query writes every batch it runs, also one written before.
    Refused (ConfigError naming ``--yes``) unless ``yes``; how many groups went."""
    client = admin(bootstrap)
    groups = marker_groups(client, sink_id)
    if not groups:
        raise unknown_sink(sink_id, bootstrap)
    if not yes:
        raise ConfigError(
            f"kafka-sink reset: would delete the {len(groups)} marker groups of sink {sink_id!r}; the next query "
            "writing with this sink id then writes every batch it runs, also one written before (a replay after a "
            "crash writes it twice). Stop every query of the sink first, then add --yes",
            option="--yes",
        )
    futures = client.delete_consumer_groups(groups, request_timeout=_TIMEOUT)
    failed = []
    for group, future in futures.items():
        try:
            future.result(_TIMEOUT)
        except KafkaException as exc:
            failed.append(f"{group}: {exc.args[0].name() if exc.args else exc}")
    if failed:
        raise ServiceError(f"kafka-sink reset: could not delete {failed} (a query of the sink still running?)")
    return len(groups)
