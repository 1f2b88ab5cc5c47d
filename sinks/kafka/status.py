"""``spark-eos kafka-sink``: the markers of a ``kafka-eos`` sink (``status``) and, knowingly, their removal
(``reset``), the way out of a refusal (K1) when rows already written may be written again."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from eos_core.errors import ConfigError, ServiceError
from sinks.kafka.markers import Marker, publish_name, sink_names

__all__ = ["add_subparser", "sink_markers"]

_TIMEOUT = 15.0


def _admin(bootstrap: str) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=_TIMEOUT)
    except KafkaException as exc:
        raise ServiceError(
            f"kafka-sink: the Kafka cluster at {bootstrap} did not answer in {_TIMEOUT:.0f} s: {exc}"
        ) from None
    return admin


def _groups(admin: AdminClient, sink_id: str) -> list[str]:
    listed = admin.list_consumer_groups(request_timeout=_TIMEOUT).result(_TIMEOUT)
    return sorted(g.group_id for g in listed.valid if g.group_id.startswith(sink_names(sink_id)))


def sink_markers(admin: AdminClient, sink_id: str, marker_topic: str) -> dict[str, Marker | str]:
    """Each marker group of the sink -> its marker (or why it has none on ``marker_topic``)."""
    out: dict[str, Marker | str] = {}
    for group in _groups(admin, sink_id):
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


def _unknown(sink_id: str, bootstrap: str) -> ConfigError:
    return ConfigError(
        f"kafka-sink: no consumer group of sink {sink_id!r} on {bootstrap} (its groups are named "
        f"{sink_names(sink_id)}...): the sink id is misspelled, the sink never committed a batch, or it was reset",
        option="--sink-id",
    )


def _status(args: argparse.Namespace) -> int:
    admin = _admin(args.bootstrap)
    found = sink_markers(admin, args.sink_id, args.marker_topic)
    if not found:
        raise _unknown(args.sink_id, args.bootstrap)
    if args.json:
        print(
            json.dumps({g: (m.__dict__ if isinstance(m, Marker) else {"error": m}) for g, m in found.items()}, indent=2)
        )
        return 0
    kind = (
        "visibility=batch (one publish)"
        if publish_name(args.sink_id) in found
        else "visibility=partition (per task slot)"
    )
    print(f"sink {args.sink_id!r}, {kind}, markers on {args.marker_topic}-0:")
    for group, marker in found.items():
        who = group[len(sink_names(args.sink_id)) :]
        print(f"  {who:<12} {marker.describe() if isinstance(marker, Marker) else marker}")
    return 0


def _reset(args: argparse.Namespace) -> int:
    admin = _admin(args.bootstrap)
    groups = _groups(admin, args.sink_id)
    if not groups:
        raise _unknown(args.sink_id, args.bootstrap)
    if not args.yes:
        raise ConfigError(
            f"kafka-sink reset: would delete the {len(groups)} marker groups of sink {args.sink_id!r}; the next query "
            "writing with this sink id then writes every batch it runs, also one written before (a replay after a "
            "crash writes it twice). Stop every query of the sink first, then add --yes",
            option="--yes",
        )
    futures = admin.delete_consumer_groups(groups, request_timeout=_TIMEOUT)
    failed = []
    for group, future in futures.items():
        try:
            future.result(_TIMEOUT)
        except KafkaException as exc:
            failed.append(f"{group}: {exc.args[0].name() if exc.args else exc}")
    if failed:
        raise ServiceError(f"kafka-sink reset: could not delete {failed} (a query of the sink still running?)")
    print(f"deleted {len(groups)} marker groups of sink {args.sink_id!r}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("EOS_KAFKA_BOOTSTRAP"),
        required="EOS_KAFKA_BOOTSTRAP" not in os.environ,
        help="Kafka bootstrap servers (default: $EOS_KAFKA_BOOTSTRAP)",
    )
    p.add_argument("--sink-id", required=True, help="the sink's sink.id")


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``kafka-sink {status,reset}`` to a CLI; each leaf sets ``func(args) -> exit code``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "kafka-sink", help="the kafka-eos sink's markers (status, reset)"
    )
    sub = p.add_subparsers(dest="kafka_sink_command", required=True)
    s = sub.add_parser("status", help="each marker of the sink: the last batch each of its writers wrote")
    _common(s)
    s.add_argument("--marker-topic", required=True, help="the sink's marker.topic (default of the sink: its topic)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_status)
    r = sub.add_parser("reset", help="delete the sink's markers: its next run writes every batch, even one written")
    _common(r)
    r.add_argument("--yes", action="store_true", help="you stopped every query of the sink and accept rewrites")
    r.set_defaults(func=_reset)
    return p


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="python -m sinks.kafka.status")
    add_subparser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args()
    sys.exit(int(ns.func(ns)))
