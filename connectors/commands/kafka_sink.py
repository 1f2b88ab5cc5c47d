"""``spark-eos kafka-sink``: the markers of a ``kafka-eos`` sink (``status``) and, knowingly, their removal
(``reset``), the way out of a refusal (K1) when rows already written may be written again
(``sinks.kafka.status`` does the work)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from connectors.commands import group, standalone
from sinks.kafka.markers import Marker, publish_name, sink_names
from sinks.kafka.status import reset_markers, sink_markers, unknown_sink

__all__ = ["add_subparser", "main"]


def _status(args: argparse.Namespace) -> int:
    found = sink_markers(args.bootstrap, args.sink_id, args.marker_topic)
    if not found:
        raise unknown_sink(args.sink_id, args.bootstrap)
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
    for name, marker in found.items():
        who = name[len(sink_names(args.sink_id)) :]
        print(f"  {who:<12} {marker.describe() if isinstance(marker, Marker) else marker}")
    return 0


def _reset(args: argparse.Namespace) -> int:
    deleted = reset_markers(args.bootstrap, args.sink_id, yes=args.yes)
    print(f"deleted {deleted} marker groups of sink {args.sink_id!r}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("EOS_KAFKA_BOOTSTRAP"),
        required="EOS_KAFKA_BOOTSTRAP" not in os.environ,
        help="Kafka bootstrap servers (default: $EOS_KAFKA_BOOTSTRAP)",
    )
    p.add_argument("--sink-id", required=True, help="the sink's sink.id")


def _add_commands(sub: Any) -> None:
    s = sub.add_parser("status", help="each marker of the sink: the last batch each of its writers wrote")
    _common(s)
    s.add_argument("--marker-topic", required=True, help="the sink's marker.topic (default of the sink: its topic)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_status)
    r = sub.add_parser("reset", help="delete the sink's markers: its next run writes every batch, even one written")
    _common(r)
    r.add_argument("--yes", action="store_true", help="you stopped every query of the sink and accept rewrites")
    r.set_defaults(func=_reset)


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``kafka-sink {status,reset}`` to a CLI; each leaf sets ``func(args) -> exit code``."""
    return group(
        subparsers, "kafka-sink", "the kafka-eos sink's markers (status, reset)", "kafka_sink_command", _add_commands
    )


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m connectors.commands.kafka_sink", __doc__, "kafka_sink_command", _add_commands, argv)


if __name__ == "__main__":
    sys.exit(main())
