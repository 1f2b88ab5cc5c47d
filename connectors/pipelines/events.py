"""Payment events of the reference pipelines: schema, parsing with validation, and a seeded generator.

An event is a JSON object ``{"id": str, "account": str, "amount": int, "ts": ISO-8601 timestamp,
"counterparty": str (optional)}``; ``amount`` is in minor units (cents), negative for a debit. The
Kafka key is the account, so every event of one account lands in one partition, in order (the
balances pipeline uses the Kafka offset as the row version).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from eos_core.kafka_config import client_settings

__all__ = [
    "EVENT_SCHEMA",
    "generate",
    "parse_events",
    "partition_of",
    "produce",
]

EVENT_SCHEMA = "id string, account string, counterparty string, amount long, ts timestamp"


def parse_events(raw: Any, malformed: str = "fail", *, keep: Sequence[str] = (), reason: str | None = None) -> Any:
    """Kafka rows -> typed events plus the source position; what a malformed event does is ``malformed``.

    ``keep`` names more of the source's columns to carry along as ``src_<name>`` (``transfers`` keeps
    ``topic``, ``key`` and ``value`` to put a malformed record into its dead-letter topic as it was);
    ``reason`` (dead-letter only) names a column to hold what is wrong alone (NULL for a good event).

    ``fail`` (stop, never drop): the task fails with an error naming the topic, partition and offset
    of the record and what is wrong with it. Fix or remove the record (or move the starting offset
    past it) and restart; the checkpoint replays from the last batch.

    ``dead-letter``: every event passes, with a ``malformed`` column: NULL for a good event, for a
    malformed one what is wrong, where it is (topic/partition/offset) and its value. The pipelines'
    tables refuse a row whose ``malformed`` is set (``CHECK (malformed IS NULL)``), so the sink's
    ``errors.tolerance=all`` puts it in the dead-letter table, in the batch's transaction: once.
    """
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    rec = F.from_json(text, EVENT_SCHEMA)
    # from_json reads '{not json' as an object of nulls: ask the JSON parser itself
    not_object = F.get_json_object(text, "$").isNull() | ~F.ltrim(text).startswith("{")
    problem = (
        F.when(F.col("value").isNull(), F.lit("null value"))
        .when(rec.isNull() | not_object, F.lit("not a JSON object"))
        .when(rec["id"].isNull() | (F.length(rec["id"]) == 0), F.lit("missing or empty 'id'"))
        .when(rec["account"].isNull() | (F.length(rec["account"]) == 0), F.lit("missing or empty 'account'"))
        .when(rec["amount"].isNull(), F.lit("'amount' missing or not a whole number"))
        .when(rec["ts"].isNull(), F.lit("'ts' missing or not a timestamp"))
    )
    position = F.concat(
        F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("/"), F.col("offset").cast("string")
    )
    columns = [
        rec["account"].alias("account"),
        F.coalesce(rec["counterparty"], F.lit("")).alias("counterparty"),
        rec["amount"].alias("amount"),
        rec["ts"].alias("ts"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
    ]
    if malformed == "dead-letter":
        # the value as text when it is printable UTF-8, else its bytes in base64 (Postgres text and
        # jsonb take no NUL, and a replacement character would lose the bytes)
        binary = text.rlike("[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f\\ufffd]")
        shown = F.when(binary, F.concat(F.lit("base64:"), F.base64(F.col("value")))).otherwise(text)
        value = F.coalesce(F.substring(shown, 1, MAX_VALUE_CHARS), F.lit("null"))
        note = F.concat(problem, F.lit(" at "), position, F.lit(": "), value)
        extra = [F.col(c).alias(f"src_{c}") for c in keep] + ([problem.alias(reason)] if reason else [])
        return raw.select(rec["id"].alias("id"), *columns, F.when(problem.isNotNull(), note).alias("malformed"), *extra)
    where = F.concat(
        F.lit("malformed payment event at topic "),
        F.col("topic"),
        F.lit(" partition "),
        F.col("partition").cast("string"),
        F.lit(" offset "),
        F.col("offset").cast("string"),
        F.lit(": "),
        problem,
        F.lit(
            ". The pipeline stops rather than dropping it: fix or remove the record, or move the "
            "starting offset past it, then restart (the checkpoint replays this batch)."
        ),
    )
    checked_id = F.when(problem.isNotNull(), F.raise_error(where)).otherwise(rec["id"])
    return raw.select(checked_id.alias("id"), *columns, *(F.col(c).alias(f"src_{c}") for c in keep))


MAX_VALUE_CHARS = 4096
"""How much of a malformed event's value its ``malformed`` note keeps."""


def generate(n: int, *, seed: int, accounts: int = 40, counterparties: int = 8, start: int = 0) -> list[dict[str, Any]]:
    """``n`` seeded events with unique ids ``e<number>``; timestamps one second apart."""
    rng = random.Random(f"payments:{seed}:{start}")
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    out = []
    for i in range(start, start + n):
        amount = rng.randint(-500, 1000)
        out.append(
            {
                "id": f"e{i:09d}",
                "account": f"acct-{rng.randrange(accounts):03d}",
                "counterparty": f"cp-{rng.randrange(counterparties):02d}",
                "amount": amount if amount != 0 else 1,
                "ts": (base + timedelta(seconds=i)).isoformat(),
            }
        )
    return out


def partition_of(account: str, partitions: int) -> int:
    return zlib.crc32(account.encode()) % partitions


def produce(
    bootstrap: str,
    topic: str,
    events: Sequence[dict[str, Any]],
    *,
    partitions: int,
    raw: Sequence[tuple[int, bytes]] = (),
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write events as JSON keyed by account; ``raw`` adds ``(partition, bytes)`` values as they are.

    On tansu (whose high watermark is the base offset of the last record batch + 1) each touched
    partition ends with a one-record batch; Apache Kafka needs none. ``progress(done)`` is called as records are delivered.
    Returns the number of records written.
    """
    from confluent_kafka import Producer

    from connectors.services.env import broker_is_tansu

    producer = Producer(
        {**client_settings(), "bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    tansu = broker_is_tansu(producer)
    by_part: dict[int, list[tuple[bytes | None, bytes]]] = {}
    for ev in events:
        p = partition_of(str(ev["account"]), partitions)
        by_part.setdefault(p, []).append((str(ev["account"]).encode(), json.dumps(ev, sort_keys=True).encode()))
    for p, value in raw:
        by_part.setdefault(p, []).append((None, value))
    done = 0
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        nonlocal done
        if err is not None:
            errors.append(str(err))
        else:
            done += 1

    tails = []
    for p, items in sorted(by_part.items()):
        for key, value in items[:-1] if tansu else items:
            producer.produce(topic, value=value, key=key, partition=p, on_delivery=delivered)
            if len(producer) > 20_000:
                producer.poll(0.05)
            if progress and done % 500 == 0:
                producer.poll(0)
                progress(done)
        if tansu:
            tails.append((p, items[-1]))
    if producer.flush(120):
        raise TimeoutError(f"could not deliver to topic {topic!r} within 120 s")
    for p, (key, value) in tails:
        producer.produce(topic, value=value, key=key, partition=p, on_delivery=delivered)
        if producer.flush(30):
            raise TimeoutError(f"could not deliver to topic {topic!r} within 30 s")
    if errors:
        raise RuntimeError(f"{len(errors)} records not delivered to {topic!r}: {errors[0]}")
    if progress:
        progress(done)
    return done
