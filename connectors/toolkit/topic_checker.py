"""The exact checker for a Kafka -> Spark -> Kafka pipeline written by the ``kafka-eos`` sink.

``verify_topic`` reads the source topic and the sink's topic (``read_committed``, what a reader of the
sink sees) and compares them as multisets by record id (``checker.compare_records``: duplicates,
losses, phantoms, changed payloads), counting the dead-letter topic's records as delivered; then the
end state: no transaction of the sink left open on its topics (each partition's last stable offset
equals its high watermark), and the sink's last marker equals Spark's last ``commits/n``; and the
faults asked for really fired.

``topic_rows`` turns a topic's committed records into rows for the reference-run oracle
(``connectors.toolkit.oracle``), when a job's records are not 1:1 with its source's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from connectors.toolkit.checker import (
    Check,
    Report,
    ValueDecoder,
    check_faults,
    compare_records,
    decode_value,
    last_commit,
    read_topic,
)
from eos_core.kafka_config import client_settings
from sinks.kafka.markers import Marker, list_groups, publish_name, read_markers, sink_names

__all__ = ["marker_batches", "open_transactions", "read_sink_topic", "topic_rows", "verify_topic"]


def read_sink_topic(bootstrap: str, topic: str, *, decode: ValueDecoder | None = None) -> list[dict[str, Any]]:
    """The sink topic's committed records, each value's JSON object, or its record in the wire format with
    ``decode`` (with its Kafka position)."""
    return read_topic(bootstrap, topic, with_position=True, decode=decode)


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "0x" + raw.hex()


def topic_rows(
    bootstrap: str, topic: str, *, latest_by: Sequence[str] | None = None, decode: ValueDecoder | None = None
) -> list[dict[str, Any]]:
    """The topic's committed records (``read_committed``) as rows for the oracle: a value that is a JSON
    object gives its fields as columns, any other value the column ``_value`` (UTF-8 text, else ``0x`` and
    its hex; None for a tombstone); ``_key`` is the key the same way, ``_headers`` the headers as
    ``[name, value]`` pairs (only on records that have them). The Kafka position is left out: a
    reference run writes the same records at other offsets.

    ``latest_by`` (the oracle's ``upsert:KEY``): what a reader of a compacted topic ends with, the last
    record of each key in its partition's order, a tombstone removing its ``_key``. ``decode``: a value in a
    Schema Registry's wire format gives its record's fields (``checker.read_topic``)."""
    rows: list[dict[str, Any]] = []
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rec in read_topic(bootstrap, topic, parse_json=False):
        value = rec["value"]
        obj: Any = decode_value(decode, topic, value) if decode is not None and value is not None else value
        if isinstance(obj, bytes):
            try:
                obj = json.loads(obj)
            except (ValueError, UnicodeDecodeError):
                obj = None
        row: dict[str, Any] = dict(obj) if isinstance(obj, dict) else {"_value": _text(value)}
        row["_key"] = _text(rec["key"])
        if rec["headers"]:
            row["_headers"] = [[name, _text(v)] for name, v in rec["headers"]]
        if latest_by is None:
            rows.append(row)
        elif value is None:  # a tombstone: a compacted topic forgets its key
            latest = {k: r for k, r in latest.items() if r["_key"] != row["_key"]}
        else:
            k = tuple(json.dumps(row.get(c), sort_keys=True) for c in latest_by)
            latest.pop(k, None)  # insertion order: the key's latest record last
            latest[k] = row
    return rows if latest_by is None else list(latest.values())


def _undecodable(held: Sequence[dict[str, Any]]) -> Check:
    bad = [(r["_partition"], r["_offset"]) for r in held if "_raw" in r]
    return Check(
        "records.undecodable",
        not bad,
        f"{len(bad)} records of the sink's topic do not decode with their writer schemas",
        {"undecodable": len(bad)},
        {"undecodable": bad[:20]},
    )


def open_transactions(bootstrap: str, topics: Sequence[str], *, timeout: float = 30.0) -> dict[str, int]:
    """``topic-partition`` -> offsets between its last stable offset and its high watermark (an open
    transaction holds read_committed readers there); empty when every transaction ended."""
    admin = AdminClient({**client_settings(), "bootstrap.servers": bootstrap})
    meta = admin.list_topics(timeout=timeout)
    tps = [TopicPartition(t, p) for t in topics for p in sorted(meta.topics[t].partitions)]
    ends = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps}, isolation_level=level, request_timeout=timeout
        )
        ends[level] = {f"{tp.topic}-{tp.partition}": f.result().offset for tp, f in futures.items()}
    committed, all_ = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
    return {tp: all_[tp] - committed[tp] for tp in all_ if all_[tp] != committed[tp]}


def marker_batches(bootstrap: str, sink_id: str, marker_topic: str, *, timeout: float = 30.0) -> dict[str, Marker]:
    """Every marker of the sink: its publish's and each task slot's, by group (the last committed ones: read
    by consumers of the marker groups, so a coordinator still loading its offsets is waited for, never a
    crash; RetriableError when one stays unreadable for ``timeout`` seconds)."""
    admin = AdminClient({**client_settings(), "bootstrap.servers": bootstrap})
    groups = sorted(set(list_groups(admin, sink_names(sink_id), timeout=timeout)) | {publish_name(sink_id)})
    read = read_markers(
        {**client_settings(), "bootstrap.servers": bootstrap}, groups, marker_topic, timeout=timeout, stable=False
    )
    found: dict[str, Marker] = {}
    for group in groups:
        marker = read[group]
        if isinstance(marker, Exception):
            raise marker
        if marker is not None:
            found[group] = marker
    return found


def verify_topic(
    *,
    bootstrap: str,
    source_topic: str,
    sink_topic: str,
    sink_id: str,
    checkpoint: str | None = None,
    marker_topic: str | None = None,
    id_field: str = "id",
    payload_fields: Sequence[str] | None = None,
    errors_topic: str | None = None,
    fault_log: str | None = None,
    expect_faults: Sequence[str] | None = None,
    min_faults: int = 0,
    records: bool = True,
    visibility: str | None = None,
    decode: ValueDecoder | None = None,
) -> Report:
    """Every check for a topic written by the ``kafka-eos`` sink from ``source_topic``'s JSON records.
    ``records=False``: the end state only (a job whose records are not 1:1 with the source's, judged by the oracle
    instead). ``visibility``: the sink's markers must say the job wrote in that mode (``end.visibility``; a chaos run
    draws the fault points of the mode its ``--sink-kind`` names). ``decode``: ``checker.read_topic``'s."""
    report = Report()
    if records:
        source = [r for r in read_topic(bootstrap, source_topic, decode=decode) if "_raw" not in r]
        held = read_sink_topic(bootstrap, sink_topic, decode=decode)
        rows = [r for r in held if "_raw" not in r]
        report.info.update(source_records=len(source), sink_records=len(rows))
        if decode is not None:  # a record the sink wrote that its readers cannot decode is a defect, never poison
            report.add(_undecodable(held))
        letters: list[dict[str, Any]] = []
        if errors_topic:
            for rec in read_topic(bootstrap, errors_topic, parse_json=False):
                if rec["value"] is not None:  # a dead letter whose value did not fit holds none (eos.error.truncated)
                    letters.append(json.loads(rec["value"]))
            report.info["dead_letters"] = len(letters)
        report.add(*compare_records(source, rows + letters, id_field=id_field, payload_fields=payload_fields))
    topics = [sink_topic, *([errors_topic] if errors_topic else [])]
    left = open_transactions(bootstrap, topics)
    report.add(
        Check(
            "end.open_transactions",
            not left,
            f"{sum(left.values())} offsets of {len(left)} partitions behind an open transaction"
            + (f": {left}" if left else ""),
            {"open_partitions": len(left)},
        )
    )
    markers = marker_batches(bootstrap, sink_id, marker_topic or sink_topic)
    if checkpoint:
        last = max((m.batch for m in markers.values()), default=None)
        committed = last_commit(checkpoint)
        report.add(
            Check(
                "end.marker_vs_commit",
                last == committed and committed is not None,
                f"sink's last marker batch {last} ({len(markers)} markers), Spark's last commits/n {committed}",
                {"marker": -1 if last is None else last, "committed": -1 if committed is None else committed},
            )
        )
    if visibility is not None:
        modes = sorted({m.mode for m in markers.values()})
        report.add(
            Check(
                "end.visibility",
                modes == [visibility],
                f"the sink's {len(markers)} markers were written with visibility={','.join(modes) or 'none'}"
                + (
                    ""
                    if modes == [visibility] or not modes
                    else f", but the run expects visibility={visibility} (its --sink-kind): the job sets the sink's "
                    "visibility itself; give it .option('visibility', job.visibility), or the --sink-kind of its mode "
                    "(kafka: batch, kafka-partition: partition)"
                ),
                {"markers": len(markers)},
            )
        )
    if fault_log is not None and (expect_faults or min_faults):
        report.add(*check_faults(fault_log, expect=expect_faults, min_count=max(min_faults, 1)))
    return report
