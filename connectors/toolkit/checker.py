"""The exactly-once checker: sink vs source as multisets, aggregates, end state and non-vacuity."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from eos_core.checkpoint import numbered
from eos_core.kafka_config import client_settings

__all__ = [
    "POSITION_FIELDS",
    "SHOW_IDS",
    "Check",
    "Report",
    "check_end_state",
    "check_exit",
    "check_faults",
    "committed_through",
    "compare_aggregates",
    "compare_records",
    "decode_value",
    "expected_aggregates",
    "last_commit",
    "last_decided_batch",
    "last_offsets",
    "parse_id_columns",
    "prepared_gids",
    "read_table",
    "read_topic",
    "read_topic_settled",
    "verify",
]

SHOW_IDS = 20  # ids listed per finding; the counts are always complete

POSITION_FIELDS = {"topic": "_topic", "partition": "_partition", "offset": "_offset"}
"""``--id-column`` names that mean a record's Kafka position (the kafka-eos source's columns of those
names), not a field of its JSON value."""


@dataclass
class Check:
    """One verdict of the checker: a name, pass/fail, counts and (a sample of) the offending ids."""

    name: str
    ok: bool
    summary: str
    counts: dict[str, int] = field(default_factory=dict)
    ids: dict[str, list[Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """All checks of one run; ``ok`` only when every check passed (and there is at least one)."""

    checks: list[Check] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, *checks: Check) -> Report:
        self.checks.extend(checks)
        return self

    def extend(self, other: Report) -> Report:
        self.checks.extend(other.checks)
        self.info.update(other.info)
        return self

    def get(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; have {[c.name for c in self.checks]}")

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks], "info": self.info}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, default=str)

    def table(self) -> str:
        """A readable fixed-width table: one line per check, then the offending ids of failures."""
        rows = [("check", "result", "detail")]
        rows += [(c.name, "ok" if c.ok else "FAIL", c.summary) for c in self.checks]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}" for r in rows]
        lines.insert(1, f"{'-' * w0}  {'-' * w1}  {'-' * max(6, max(len(r[2]) for r in rows))}")
        for c in self.failures:
            for kind, ids in c.ids.items():
                if ids:
                    more = c.counts.get(kind, len(ids)) - len(ids)
                    tail = f" ... (+{more} more)" if more > 0 else ""
                    lines.append(f"  {c.name}.{kind}: {', '.join(map(str, ids))}{tail}")
        for key, value in self.info.items():
            lines.append(f"{key}: {value}")
        verdict = "EXACTLY-ONCE HELD" if self.ok else "EXACTLY-ONCE VIOLATED"
        lines.append("verdict: " + (str(self.info["verdict"]) if not self.ok and self.info.get("verdict") else verdict))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# ---------------------------------------------------------------------------------------------
# records

# decode(topic, value) -> the record a wire-format value holds (a dict)
ValueDecoder = Callable[[str, bytes], Any]


def _norm(value: Any) -> Any:
    """Compare 1, 1.0, Decimal('1.00') and '1' alike: sinks return numerics as Decimal or float."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float, Decimal)):
        try:
            return Decimal(str(value)).normalize()
        except InvalidOperation:
            return value
    if isinstance(value, str):
        try:
            return Decimal(value).normalize()
        except InvalidOperation:
            return value
    return value


def _sample(ids: Iterable[Any]) -> list[Any]:
    return sorted(ids, key=str)[:SHOW_IDS]


def compare_records(
    source: Iterable[Mapping[str, Any]],
    sink: Iterable[Mapping[str, Any]],
    *,
    id_field: str = "id",
    payload_fields: Sequence[str] | None = None,
    name: str = "records",
) -> list[Check]:
    """Compare sink rows to source records as multisets keyed by ``id_field``.

    Returns four checks: ``duplicates`` (an id more often in the sink than in the source),
    ``losses`` (in the source, missing from the sink), ``phantoms`` (in the sink, never in the
    source) and ``payload`` (same id, different values in ``payload_fields``; by default every
    field the two sides share). A source id given twice is itself a duplicate of the *input* and is
    reported under ``source_duplicates`` in the losses check's counts, since the test is then void.
    """
    src = list(source)
    out = list(sink)
    src_count = Counter(r[id_field] for r in src)
    out_count = Counter(r[id_field] for r in out)
    src_by_id = {r[id_field]: r for r in src}

    dups = {i: n - src_count.get(i, 0) for i, n in out_count.items() if i in src_count and n > src_count[i]}
    lost = {i for i in src_count if i not in out_count}
    short = {i: src_count[i] - out_count[i] for i in src_count if i in out_count and out_count[i] < src_count[i]}
    phantoms = {i: n for i, n in out_count.items() if i not in src_count}
    src_dups = [i for i, n in src_count.items() if n > 1]

    mismatched: list[Any] = []
    diffs: list[str] = []
    for row in out:
        rid = row[id_field]
        ref = src_by_id.get(rid)
        if ref is None:
            continue
        fields = payload_fields if payload_fields is not None else [k for k in row if k in ref and k != id_field]
        bad = [f for f in fields if _norm(row.get(f)) != _norm(ref.get(f))]
        if bad:
            mismatched.append(rid)
            if len(diffs) < 5:
                diffs.append(f"{rid}: " + ", ".join(f"{f} sink={row.get(f)!r} source={ref.get(f)!r}" for f in bad))

    n_dup = sum(dups.values())
    n_lost = len(lost) + sum(short.values())
    n_ph = sum(phantoms.values())
    return [
        Check(
            f"{name}.duplicates",
            n_dup == 0,
            f"{n_dup} extra rows over {len(dups)} ids (source {len(src)} records, sink {len(out)} rows)",
            {"duplicates": n_dup, "ids": len(dups), "source": len(src), "sink": len(out)},
            {"duplicates": _sample(dups)},
        ),
        Check(
            f"{name}.losses",
            n_lost == 0 and not src_dups,
            f"{n_lost} source records missing from the sink"
            + (f"; input itself repeats {len(src_dups)} ids (test void)" if src_dups else ""),
            {"losses": n_lost, "source_duplicates": len(src_dups)},
            {"losses": _sample(set(lost) | set(short)), "source_duplicates": _sample(src_dups)},
        ),
        Check(
            f"{name}.phantoms",
            n_ph == 0,
            f"{n_ph} sink rows with ids the source never had",
            {"phantoms": n_ph},
            {"phantoms": _sample(phantoms)},
        ),
        Check(
            f"{name}.payload",
            not mismatched,
            f"{len(mismatched)} rows differ from their source record" + (f" ({diffs[0]})" if diffs else ""),
            {"payload": len(mismatched)},
            {"payload": _sample(set(mismatched))},
        ),
    ]


# ---------------------------------------------------------------------------------------------
# aggregates


def expected_aggregates(
    source: Iterable[Mapping[str, Any]], *, key: str = "key", value: str = "amount"
) -> dict[Any, dict[str, Decimal]]:
    """Per key: ``count`` of records and ``sum`` of ``value``, recomputed from the source."""
    out: dict[Any, dict[str, Decimal]] = {}
    for rec in source:
        agg = out.setdefault(rec[key], {"count": Decimal(0), "sum": Decimal(0)})
        agg["count"] += 1
        agg["sum"] += Decimal(str(rec[value]))
    return out


def compare_aggregates(
    source: Iterable[Mapping[str, Any]],
    sink: Iterable[Mapping[str, Any]],
    *,
    key: str = "key",
    value: str = "amount",
    columns: Mapping[str, str] | None = None,
    name: str = "aggregates",
) -> list[Check]:
    """Compare per-key aggregates in the sink with those recomputed from the source.

    ``columns`` maps a sink column to ``"sum"`` or ``"count"`` (default ``{"total": "sum",
    "events": "count"}``). A replayed batch applied twice shows as a wrong sum or count; a lost one
    likewise; a key in the sink the source never had is a phantom.
    """
    columns = dict(columns or {"total": "sum", "events": "count"})
    expected = expected_aggregates(source, key=key, value=value)
    rows: dict[Any, Mapping[str, Any]] = {}
    dup_keys: list[Any] = []
    for row in sink:
        if row[key] in rows:
            dup_keys.append(row[key])
        rows[row[key]] = row
    missing = [k for k in expected if k not in rows]
    phantom = [k for k in rows if k not in expected]
    wrong: list[Any] = []
    first = ""
    for k, exp in expected.items():
        found = rows.get(k)
        if found is None:
            continue
        row = found
        for col, agg in columns.items():
            if _norm(row.get(col)) != _norm(exp[agg]):
                wrong.append(k)
                first = first or f"key {k}: {col}={row.get(col)} expected {exp[agg]}"
                break
    n_bad = len(wrong) + len(missing) + len(phantom) + len(dup_keys)
    return [
        Check(
            name,
            n_bad == 0,
            f"{len(expected)} keys; {len(wrong)} wrong, {len(missing)} missing, {len(phantom)} phantom, "
            f"{len(dup_keys)} repeated" + (f" ({first})" if first else ""),
            {
                "keys": len(expected),
                "wrong": len(wrong),
                "missing": len(missing),
                "phantom": len(phantom),
                "repeated": len(dup_keys),
            },
            {
                "wrong": _sample(wrong),
                "missing": _sample(missing),
                "phantom": _sample(phantom),
                "repeated": _sample(dup_keys),
            },
        )
    ]


# ---------------------------------------------------------------------------------------------
# end state: checkpoint and the sink's protocol tables


def last_commit(checkpoint: str) -> int | None:
    """Spark's last completed batch: the highest ``commits/n`` in the checkpoint (None if none)."""
    ns = numbered(os.path.join(checkpoint, "commits"))
    return ns[-1] if ns else None


def committed_through(checkpoint: str) -> int:
    """``last_commit`` with -1 for none (``last_commit(...) or -1`` would take batch 0 for none)."""
    found = last_commit(checkpoint)
    return -1 if found is None else found


def last_offsets(checkpoint: str) -> int | None:
    """The highest planned batch: ``offsets/n`` (None if none)."""
    ns = numbered(os.path.join(checkpoint, "offsets"))
    return ns[-1] if ns else None


def _ident(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


def prepared_gids(conn: Any, sink_id: str | None = None) -> list[str]:
    """Prepared transactions of ``sink_id`` in the connected database, or of every eos sink there.

    A gid names its sink escaped (``eos:<escaped sink id>:...``, see ``sinks.postgres.twophase.gid``):
    the sink's exact prefix ends with the ``:`` that an escaped id never holds, so ``orders`` never
    counts the gids of ``orders: eu`` and an id with a space, ``%`` or non-ASCII finds its own."""
    from sinks.postgres.twophase.gid import GID_PREFIX, sink_prefix

    prefix = sink_prefix(sink_id) if sink_id else f"{GID_PREFIX}:"
    with conn.cursor() as cur:
        cur.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) AND database = current_database() "
            "ORDER BY gid",
            (prefix,),
        )
        return [r[0] for r in cur.fetchall()]


def last_decided_batch(conn: Any, sink_id: str, *, eos_schema: str = "eos") -> int | None:
    """The sink's last decided batch in ``<eos_schema>.sink_batches`` (None when it has none)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{_ident(eos_schema)}.sink_batches",))
        if not cur.fetchone()[0]:
            return None
        cur.execute(f"SELECT max(batch_id) FROM {_ident(eos_schema)}.sink_batches WHERE sink_id = %s", (sink_id,))
        row = cur.fetchone()
        return None if row is None or row[0] is None else int(row[0])


def check_end_state(
    conn: Any,
    *,
    sink_id: str | None,
    checkpoint: str | None,
    eos_schema: str = "eos",
    decisions: bool = True,
) -> list[Check]:
    """No prepared transaction of the sink is left; its last decision equals Spark's last commit.

    ``decisions=False`` for sinks without a decision log (upsert): only the prepared check runs.
    """
    gids = prepared_gids(conn, sink_id)
    checks = [
        Check(
            "end.prepared",
            not gids,
            f"{len(gids)} prepared transactions of "
            + (f"sink {sink_id}" if sink_id else "any eos sink in this database (give --sink-id to count only yours)")
            + " left",
            {"prepared": len(gids)},
            {"prepared": gids[:SHOW_IDS]},
        )
    ]
    if decisions and sink_id and checkpoint:
        decided = last_decided_batch(conn, sink_id, eos_schema=eos_schema)
        committed = last_commit(checkpoint)
        checks.append(
            Check(
                "end.decision_vs_commit",
                decided == committed and committed is not None,
                f"sink's last decided batch {decided}, Spark's last commits/n {committed}",
                {"decided": -1 if decided is None else decided, "committed": -1 if committed is None else committed},
            )
        )
    return checks


# ---------------------------------------------------------------------------------------------
# non-vacuity


def check_faults(
    log_path: str | None,
    *,
    expect: Sequence[str] | None = None,
    min_count: int = 1,
    name: str = "fault.fired",
) -> list[Check]:
    """The injected fault really happened: the fault log holds ``min_count`` firings (of ``expect``)."""
    from eos_core.faults import fired

    entries = fired(log_path) if log_path else []
    relevant = [e for e in entries if expect is None or e.get("point") in expect]
    points = Counter(str(e.get("point")) for e in relevant)
    return [
        Check(
            name,
            len(relevant) >= min_count,
            f"{len(relevant)} firings (wanted >= {min_count}"
            + (f" of {', '.join(expect)}" if expect else "")
            + ")"
            + (": " + ", ".join(f"{p} x{n}" for p, n in sorted(points.items())) if points else ""),
            {"fired": len(relevant), **{p: n for p, n in points.items()}},
        )
    ]


def check_exit(
    returncode: int | None,
    *,
    expect_signal: int | None = None,
    expect_code: int | None = None,
    name: str = "fault.exit",
) -> list[Check]:
    """The killed process really died as intended: by ``expect_signal`` or with ``expect_code``."""
    if expect_signal is not None:
        ok = returncode == -expect_signal
        want = f"signal {expect_signal}"
    else:
        ok = returncode == expect_code if expect_code is not None else returncode not in (0, None)
        want = f"exit code {expect_code}" if expect_code is not None else "a non-zero exit"
    got = (
        "still running"
        if returncode is None
        else (f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}")
    )
    return [
        Check(
            name,
            ok,
            f"process ended with {got}; wanted {want}",
            {"returncode": -999 if returncode is None else returncode},
        )
    ]


# ---------------------------------------------------------------------------------------------
# reading both sides


def _as_held(msg: Any, partition: int, offset: int) -> dict[str, Any]:
    """A record as Kafka holds it (``read_topic(parse_json=False)``)."""
    return {
        "value": msg.value(),
        "key": msg.key(),
        "headers": msg.headers(),
        "_partition": partition,
        "_offset": offset,
    }


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    timeout: float = 30.0,
    parse_json: bool = True,
    with_position: bool = False,
    decode: ValueDecoder | None = None,
) -> list[dict[str, Any]]:
    """Every committed record of ``topic`` (read_committed), values parsed as JSON objects (with ``decode``, one
    in a Schema Registry's wire format decoded by it: ``decode_value``).

    ``with_position``: each parsed record also holds its Kafka position as ``_topic``, ``_partition``
    and ``_offset`` (poison records always do). ``parse_json=False``: each record is
    ``{"value", "key", "headers", "_partition", "_offset"}`` as Kafka holds it (bytes; headers a list
    of (name, value) pairs or None), in each partition's offset order.

    Reads up to each partition's high watermark. Records whose value is not a JSON object (poison
    records) are returned as ``{"_raw": value, "_offset": ...}`` so the caller decides about them.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **client_settings(),
            "bootstrap.servers": bootstrap,
            "group.id": f"eos-checker-{os.getpid()}-{id(topic)}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout)
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None:
            raise LookupError(f"topic {topic!r} not found on {bootstrap}: {tmeta.error if tmeta else 'absent'}")
        ends: dict[int, int] = {}
        assign = []
        for p in sorted(tmeta.partitions):
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if hi > lo:
                ends[p] = hi
                assign.append(TopicPartition(topic, p, lo))
        out: list[dict[str, Any]] = []
        if not assign:
            return out
        consumer.assign(assign)
        import time

        deadline = time.monotonic() + timeout
        done: set[int] = set()
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic!r}: partitions {sorted(set(ends) - done)} not drained in {timeout}s"
                )
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    continue
                p, off = int(msg.partition() or 0), int(msg.offset() or 0)
                if off >= ends[p] - 1:
                    done.add(p)
                if off >= ends[p]:
                    continue
                rec: dict[str, Any] = (
                    _parse(msg.value(), p, off, decode, topic) if parse_json else _as_held(msg, p, off)
                )
                if with_position and "_raw" not in rec:
                    rec.update(_topic=topic, _partition=p, _offset=off)
                out.append(rec)
            # a partition whose tail is a transaction marker has no record at hi-1
            for p, hi in ends.items():
                if p not in done:
                    pos = consumer.position([TopicPartition(topic, p)])[0].offset
                    if pos >= hi:
                        done.add(p)
        return out
    finally:
        consumer.close()


def read_topic_settled(
    bootstrap: str, topic: str, expected: int, *, wait: float = 10.0, **kw: Any
) -> list[dict[str, Any]]:
    """``read_topic`` once ``expected`` committed records are visible, waited for up to ``wait`` seconds: a
    transaction's markers are written after ``commit_transaction`` returns, so a read_committed reader sees its
    records a moment later. When time runs out, the last read (the caller's assertion says what is missing)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        got = read_topic(bootstrap, topic, **kw)
        if len(got) >= expected or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def decode_value(decode: ValueDecoder, topic: str, value: bytes) -> Any:
    """A wire-format value's record; a value in no wire format, or whose bytes do not decode (the deserializer's
    ``SerializationError``), as its bytes, which ``_parse`` then takes for what they are (poison). Any other
    failure (the registry unreachable, a schema it does not have) is raised: never judged as poison."""
    if len(value) < 5 or value[0] != 0:
        return value
    from confluent_kafka.serialization import SerializationError

    try:
        return decode(topic, value)
    except SerializationError:
        return value


def _parse(
    value: bytes | None, partition: int, offset: int, decode: ValueDecoder | None = None, topic: str = ""
) -> dict[str, Any]:
    decoded = decode_value(decode, topic, value) if decode is not None and value is not None else value
    if isinstance(decoded, dict):  # a record of a Schema Registry's wire format
        return decoded
    try:
        obj = json.loads(value) if value is not None else None
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        return {"_raw": value, "_partition": partition, "_offset": offset}
    return obj


def compare_poison(
    poison: Iterable[Mapping[str, Any]],
    letters: Iterable[Mapping[str, Any]],
    position: Callable[[Mapping[str, Any]], tuple[int, int] | None],
    *,
    name: str = "poison",
) -> Check:
    """Each poison record (``read_topic``'s ``_raw`` records: values that are not JSON objects) in the
    dead-letter rows exactly once, found by its Kafka position: ``position(row)`` gives a dead-letter
    row's (partition, offset), or None when the row does not say."""
    want = Counter((int(r["_partition"]), int(r["_offset"])) for r in poison)
    got = Counter(p for p in (position(r) for r in letters) if p is not None and p in want)
    missing = [p for p in want if p not in got]
    extra = {p: n - 1 for p, n in got.items() if n > 1}
    n_want, n_extra = sum(want.values()), sum(extra.values())
    return Check(
        f"{name}.dead_letters",
        not missing and not extra,
        f"{n_want} poison records: {n_want - len(missing)} in the dead-letter table, {len(missing)} missing, "
        f"{n_extra} extra copies",
        {"poison": n_want, "missing": len(missing), "extra": n_extra},
        {"missing": _sample(missing), "extra": _sample(extra)},
    )


def read_table(conn: Any, table: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every row of ``table`` as dicts (``columns`` or all)."""
    cols = ", ".join(_ident(c) for c in columns) if columns else "*"
    with conn.cursor() as cur:
        cur.execute(f"SELECT {cols} FROM {_ident(table)}")
        names = [d.name for d in cur.description]
        return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]


def read_dead_letters(conn: Any, table: str, target: str) -> list[dict[str, Any]]:
    """The dead-letter rows (``errors.tolerance=all``) a sink wrote for ``target``, with the row as a dict."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {_ident(table)} WHERE target = %s", (target,))
        names = [d.name for d in cur.description]
        return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]


_ID = "__eos_id__"


def parse_id_columns(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``["id"]``, ``["partition=src_partition,offset=src_offset"]``: FIELD[=COLUMN] items, comma-separated."""
    from eos_core.errors import ConfigError

    out: list[tuple[str, str]] = []
    for spec in specs:
        for item in spec.split(","):
            field_name, eq, column = item.strip().partition("=")
            field_name, column = field_name.strip(), (column.strip() if eq else field_name.strip())
            if not field_name or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", column):
                raise ConfigError(
                    f"verify: --id-column {spec!r}: {item.strip()!r} is not FIELD or FIELD=COLUMN (a record field, "
                    "or topic/partition/offset for the record's Kafka position, and a plain column name); e.g. "
                    "--id-column id or --id-column partition=src_partition,offset=src_offset",
                    option="--id-column",
                )
            out.append((field_name, column))
    return out


def _columns(conn: Any, table: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {_ident(table)} LIMIT 0")
        return [d.name for d in cur.description]


def _has(conn: Any, table: str, column: str) -> bool:
    return column in _columns(conn, table)


def _keyed(
    conn: Any,
    topic: str,
    table: str,
    source: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    letters: list[dict[str, Any]],
    idc: Sequence[tuple[str, str]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Source records and table rows with their identity under ``_ID``; refuses what cannot be compared."""
    from eos_core.errors import ConfigError

    columns = _columns(conn, table)
    missing = [c for _, c in idc if c not in columns]
    if missing:
        raise ConfigError(
            f"verify: table {table!r} has no column {', '.join(map(repr, missing))} (its columns: "
            f"{', '.join(columns)}); name the column(s) that identify a record with --id-column FIELD=COLUMN "
            "(e.g. --id-column partition=src_partition,offset=src_offset)",
            option="--id-column",
        )
    fields = [POSITION_FIELDS.get(f, f) for f, _ in idc]
    lacking = [r for r in source if any(f not in r for f in fields)]
    if lacking:
        seen = sorted({k for r in lacking[:50] for k in r if not k.startswith("_")})
        raise ConfigError(
            f"verify: {len(lacking)} of the {len(source)} records of topic {topic!r} have no field "
            f"{', '.join(repr(f) for f, _ in idc if POSITION_FIELDS.get(f, f) not in lacking[0])} (fields seen: "
            f"{', '.join(seen) or 'none'}); name the record's id with --id-column FIELD=COLUMN, or use its Kafka "
            "position: --id-column partition=COLUMN,offset=COLUMN",
            option="--id-column",
        )

    def key(values: Sequence[Any]) -> str:
        return "/".join(str(_norm(v)) for v in values)

    src = [{**r, _ID: key([r[f] for f in fields])} for r in source]
    out = [{**r, _ID: key([r.get(c) for _, c in idc])} for r in rows]
    out += [{**r, _ID: key([r.get(c) for _, c in idc])} for r in letters if all(c in r for _, c in idc)]
    return src, out


def verify(
    *,
    bootstrap: str,
    topic: str,
    dsn: str,
    table: str,
    id_field: str = "id",
    payload_fields: Sequence[str] | None = None,
    sink_id: str | None = None,
    checkpoint: str | None = None,
    eos_schema: str = "eos",
    decisions: bool = True,
    aggregates: Mapping[str, Any] | None = None,
    fault_log: str | None = None,
    expect_faults: Sequence[str] | None = None,
    min_faults: int = 0,
    dead_letters: str | None = None,
    poison_position: Callable[[Mapping[str, Any]], tuple[int, int] | None] | None = None,
    id_columns: Sequence[tuple[str, str]] | None = None,
    decode: ValueDecoder | None = None,
) -> Report:
    """Run every applicable check for a topic and a table and return the report (``decode``: ``read_topic``'s).
    ``id_columns``: what identifies a record, as (record field, table column) pairs (default
    ``[(id_field, id_field)]``); a field named ``topic``, ``partition`` or ``offset`` is the record's
    Kafka position (``POSITION_FIELDS``). A table without one of the columns, or records without one
    of the fields, is a ConfigError: nothing could be compared.

    ``dead_letters``: the sink's ``errors.table``; its rows for ``table`` count as delivered, so each
    source record must be in exactly one of the two (``info["dead_letters"]`` says how many went there).
    ``poison_position``: the pipeline puts poison records in the dead-letter table too; it reads a
    dead-letter row's Kafka (partition, offset), and each poison record must be there exactly once
    (``compare_poison``). The dead-letter rows of ``aggregates["table"]`` are read when ``table`` is "".

    ``aggregates``: ``{"table": ..., "key": ..., "value": ..., "columns": {...}}`` for a stateful
    pipeline's per-key table (checked instead of / in addition to ``table``'s records). Poison
    records (non-JSON values) in the topic are excluded from the expected set and counted in info.
    """
    import psycopg

    idc = list(id_columns or [(id_field, id_field)])
    raw = read_topic(bootstrap, topic, with_position=any(f in POSITION_FIELDS for f, _ in idc), decode=decode)
    source = [r for r in raw if "_raw" not in r]
    report = Report(info={"source_records": len(source), "poison_records": len(raw) - len(source)})
    with psycopg.connect(dsn, autocommit=True) as conn:
        letters: list[dict[str, Any]] = []
        target = table or (aggregates or {}).get("table")
        if dead_letters and target:
            letters = [r["row"] for r in read_dead_letters(conn, dead_letters, target)]
            report.info["dead_letters"] = len(letters)
            if poison_position is not None:
                poison = [r for r in raw if "_raw" in r]
                report.add(compare_poison(poison, letters, poison_position))
                at = {(int(r["_partition"]), int(r["_offset"])) for r in poison}
                letters = [r for r in letters if poison_position(r) not in at]
        if table:
            rows = read_table(conn, table)
            report.info["sink_rows"] = len(rows)
            if id_columns is None and all(id_field in r for r in source) and _has(conn, table, id_field):
                rows += letters
                report.add(*compare_records(source, rows, id_field=id_field, payload_fields=payload_fields))
            else:
                src, out = _keyed(conn, topic, table, source, rows, letters, idc)
                report.add(*compare_records(src, out, id_field=_ID, payload_fields=payload_fields))
        if aggregates:
            agg_rows = read_table(conn, aggregates["table"])
            report.add(
                *compare_aggregates(
                    source,
                    agg_rows,
                    key=aggregates.get("key", "key"),
                    value=aggregates.get("value", "amount"),
                    columns=aggregates.get("columns"),
                )
            )
        report.add(
            *check_end_state(conn, sink_id=sink_id, checkpoint=checkpoint, eos_schema=eos_schema, decisions=decisions)
        )
    if min_faults > 0:
        report.add(*check_faults(fault_log, expect=expect_faults, min_count=min_faults))
    return report
