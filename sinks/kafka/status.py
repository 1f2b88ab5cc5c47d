"""The operations behind ``spark-eos kafka-sink`` (``connectors.commands.kafka_sink``): the markers of a
``kafka-eos`` sink, and, knowingly, their removal, the way out of a refusal (K1) when rows already written
may be written again."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from eos_core.errors import ConfigError, RetriableError, ServiceError
from eos_core.kafka_config import client_settings
from sinks.kafka.markers import Marker, list_groups, read_markers, sink_names

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
    return list_groups(admin, sink_names(sink_id), timeout=_TIMEOUT)


def sink_markers(bootstrap: str, sink_id: str, marker_topic: str) -> dict[str, Marker | str]:
    """Each marker group of the sink -> its last committed marker (or why it has none on ``marker_topic``,
    or why it could not be read: a coordinator still loading its offsets after a restart is retried for
    15 s, then shown, never a crash of the command)."""
    client = admin(bootstrap)
    groups = marker_groups(client, sink_id)
    conf = {**client_settings(), "bootstrap.servers": bootstrap, "log_level": 0}
    read = read_markers(conf, groups, marker_topic, timeout=_TIMEOUT, stable=False)
    out: dict[str, Marker | str] = {}
    for group in groups:
        found = read[group]
        if isinstance(found, RetriableError):
            out[group] = f"not readable now ({str(found).split(': last ', 1)[-1][:160]}); run status again"
        elif isinstance(found, Exception):  # a foreign commit, or access refused: shown, not fatal to the listing
            out[group] = str(found).split(":", 2)[-1].strip()[:160]
        elif found is None:
            out[group] = f"no marker on {marker_topic}-0 (another marker.topic?)"
        else:
            out[group] = found
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
