"""The plan of a ``kafka-eos`` write, built once per batch on the driver and pickled to every task, the
commit message a task returns, and the rules every writer meets the sink's last marker with (K1, K2)."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from eos_core.checkpoint import display, planned_lineage, query_id
from eos_core.errors import FatalError
from sinks.kafka.markers import BATCH_JOB, Marker
from sinks.kafka.options import CONTEXT, KafkaSinkOptions
from sinks.kafka.records import check_schema

__all__ = [
    "BATCH_JOB",
    "KafkaSinkMessage",
    "KafkaSinkPlan",
    "LineageMismatch",
    "build_plan",
    "meet_marker",
    "replay_help",
]

log = logging.getLogger("sinks.kafka")


class LineageMismatch(FatalError):
    """K1: the sink's marker says another lineage (or another query, or a later batch) wrote here."""


@dataclass(frozen=True)
class KafkaSinkPlan:
    """What tasks and the committer need (picklable): built on the driver when Spark builds the writer."""

    opts: KafkaSinkOptions
    columns: tuple[str, ...]
    lineage: str | None  # digest of offsets/<batch> (None: a batch job without a checkpoint)
    lineage_text: str  # for messages
    query: str  # the query id in the checkpoint, or BATCH_JOB
    nonce: str  # one per writer the driver builds: every task of this batch attempt shares it
    batch: int | None = None  # the batch Spark builds this writer for (None: not known on the driver)
    # visibility=partition, K2: the task slots whose marker says this batch is written (slot, rows, digest);
    # () when none is, None before the driver looked. When some are, the batch is a replay of one partly
    # written, and the other slots stage their rows for the driver to publish with their markers, so a
    # refusal of any slot comes before any write.
    written: tuple[tuple[int, int, str], ...] | None = None
    # producer settings the driver's checks derived (batch.size under the smallest max.message.bytes)
    overrides: tuple[tuple[str, str], ...] = ()
    # key.format/value.format=avro|json-schema: sinks.kafka.formats.column_encoders, their schemas registered
    encoders: dict[str, Any] = field(default_factory=dict)
    # the columns the options encode: each needs its encoder before a task writes
    encoded: tuple[str, ...] = ()

    @property
    def context(self) -> str:
        return f"{CONTEXT} {self.opts.sink_id!r}"

    def producer_config(self) -> dict[str, str]:
        return {**self.opts.producer_config(), **dict(self.overrides)}


def build_plan(opts: KafkaSinkOptions, schema: StructType, *, encode: bool = True) -> KafkaSinkPlan:
    """The plan of a write of ``schema``; ``encode=False`` leaves the encoded columns' encoders (their schemas
    registered or looked up) to the caller (``sinks.kafka.spark._Roles`` makes them for the tasks only)."""
    from sinks.kafka.formats import column_encoders, encoded_columns, encoded_schema

    encoders = column_encoders(opts, schema) if encode else {}
    encoded = encoded_columns(opts, schema)
    columns = check_schema(encoded_schema(schema, encoded), topic_option=opts.topic, context=CONTEXT)
    lineage, text, query, batch = None, "a batch job", BATCH_JOB, opts.batch_id
    if opts.checkpoint is not None:
        planned = planned_lineage(opts.checkpoint, opts.batch_id, context=f"{CONTEXT} {opts.sink_id}")
        lineage, text, batch = planned.digest, str(planned), planned.batch
        query = query_id(opts.checkpoint) or display(opts.checkpoint) or BATCH_JOB
    return KafkaSinkPlan(
        opts, columns, lineage, text, query, secrets.token_hex(6), batch, encoders=encoders, encoded=tuple(encoded)
    )


def partly_written(
    plan: KafkaSinkPlan, slots: dict[int, Marker], *, batch: int | None = None
) -> tuple[tuple[int, int, str], ...]:
    """K1 on the driver, before any task runs: every slot's marker must belong to this query's lineage;
    the slots that wrote this batch (``batch``, else the plan's) already (K2: the others stage), () when none did."""
    batch = plan.batch if batch is None else batch
    assert batch is not None
    written = []
    for slot, marker in sorted(slots.items()):
        if meet_marker(plan, marker, batch, f"task slot {slot}"):
            written.append((slot, marker.rows, marker.digest))
    return tuple(written)


@dataclass(frozen=True)
class KafkaSinkMessage(WriterCommitMessage):
    """What a task returns: its slot (Spark partition), rows and their digest; staged ranges with batch visibility."""

    slot: int
    batch: int
    attempt: int
    rows: int
    digest: str
    skipped: bool = False  # the batch (or this slot's part of it) was written before
    diverted: int = 0  # rows sent to errors.topic
    tag: str | None = None  # visibility=batch: the header value that marks this attempt's staged records
    staged: tuple[tuple[int, int, int, int], ...] = ()  # (staging partition, first offset, last offset, count)


def replay_help(sink_id: str) -> str:
    """What to do about a replay that gives a partly written batch's slots other rows (K2), for its refusals."""
    return (
        "If the query is not deterministic (rand(), uuid(), shuffle(), current_timestamp() or a UDF reading the "
        "clock or anything outside the batch, a stream-static join whose static table changed), no replay gives "
        "the same rows: the batch can only be finished by `spark-eos kafka-sink reset --sink-id "
        f"{sink_id!r} --yes`, which lets rows already visible be written again; write such a query with "
        "visibility=batch, which needs no deterministic replay"
    )


def meet_marker(plan: KafkaSinkPlan, marker: Marker | None, batch: int, where: str) -> bool:
    """K1/K2: True when ``marker`` says batch ``batch`` of this lineage is written (skip it), False when the
    batch is still to be written; LineageMismatch when writing would skip or duplicate rows."""
    if marker is None:
        return False
    help_text = (
        "Nothing was written. If the query was restored from an older checkpoint or savepoint after the sink went "
        "on, restore the latest one; if this is a new query (a fresh checkpoint) or the sink id is shared by "
        "mistake, give this query its own sink.id; to let this query write anyway, knowing that rows already "
        f"written may be written again, run `spark-eos kafka-sink reset --sink-id {plan.opts.sink_id!r}`"
    )
    if marker.query != plan.query:
        raise LineageMismatch(
            f"{plan.context}: {where} last wrote {marker.describe()}, but this is "
            f"{'a batch job' if plan.query == BATCH_JOB else 'query ' + plan.query} ({plan.lineage_text}). "
            + help_text,
            batch_id=batch,
        )
    if marker.batch > batch:
        raise LineageMismatch(
            f"{plan.context}: {where} already wrote {marker.describe()}, later than batch {batch} "
            f"({plan.lineage_text}): the query went back. " + help_text,
            batch_id=batch,
        )
    if marker.batch < batch:
        return False
    if marker.lineage != plan.lineage:
        raise LineageMismatch(
            f"{plan.context}: {where} wrote {marker.describe()}, but this query planned batch {batch} differently "
            f"({plan.lineage_text}). " + help_text,
            batch_id=batch,
        )
    return True
