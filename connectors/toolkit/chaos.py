"""Chaos runs: a pipeline killed N times at random moments and fault points while a producer writes.

    spark-eos chaos --pipeline 2pc --kills 100 --seed 7 --records 100000 [--json]
    spark-eos chaos --app myjob:build --sink-kind 2pc --kills 5 --payload key,amount
    python -m connectors.toolkit.chaos --pipeline 2pc --kills 5 --seed 1 --records 5000

``--pipeline`` runs one of our reference pipelines (from a clone); ``--app module:function`` runs
the user's own job (``connectors.toolkit.app_runner`` says what the function returns), from a wheel too.

Each kill is either a SIGKILL of the pipeline's whole process group at a random moment, or a
fault point (``eos_core.faults``) that kills the group from inside the sink or the source at a
random protocol step. The pipeline restarts from its checkpoint after each kill; when the producer
is done, a last run drains the topic (AvailableNow) and the checker compares the sink to the
topic. Everything random comes from ``--seed``: the same seed gives the same schedule of kinds,
points and delays (the exact batch a kill hits still depends on timing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.toolkit import checker, fault_kinds, oracle
from connectors.toolkit.app_runner import out_topic_of, sink_id_of
from connectors.toolkit.harness import PipelineProcess, describe_exit, password_apart, python_argv
from eos_core import faults
from eos_core.errors import ConfigError

__all__ = [
    "FAULT_POINTS",
    "KAFKA_SINK_KINDS",
    "PIPELINES",
    "SINK_KINDS",
    "ChaosConfig",
    "KillPlan",
    "add_subparser",
    "create_topic",
    "main",
    "make_records",
    "plan_kills",
    "produce_records",
    "run",
    "write_results",
]

PIPELINES = ("2pc", "upsert", "stateful")

# The fault points each pipeline passes through; a chaos kill picks one at random.
FAULT_POINTS: dict[str, tuple[str, ...]] = {
    "2pc": (
        "source.read.mid",
        "sink.before_write",
        "sink.after_write",
        "sink.after_prepare",
        "sink.commit.before_decision",
        "sink.commit.after_decision",
        "sink.commit.after_k",
        "sink.after_commit",
    ),
    "upsert": ("source.read.mid", "sink.before_write", "sink.after_write", "sink.after_commit"),
    "stateful": ("source.read.mid", "sink.before_write", "sink.after_write", "sink.after_commit"),
    # a user's foreachBatch (any writer inside): before it runs, and after it returned but before
    # Spark's commits/n (app_runner.foreach_batch_with_fault_points); a non-idempotent write is replayed
    "foreachbatch": ("source.read.mid", "pipeline.batch", "sink.after_commit"),
    "other": ("source.read.mid",),  # a user's job with a sink of its own: the source's points only
    # the kafka-eos sink, visibility=batch: tasks stage (before/after), the driver publishes (before it,
    # after the first staged records went into the open transaction, after its commit)
    "kafka": (
        "source.read.mid",
        "sink.before_write",
        "sink.after_write",
        "sink.commit.before_decision",
        "sink.publish.mid",
        "sink.after_commit",
    ),
    # visibility=partition: each task writes and commits its own transaction; the driver only checks
    # (commit.before_decision and publish.mid fire only in the replay of a partly written batch)
    "kafka-partition": (
        "source.read.mid",
        "sink.before_write",
        "sink.after_write",
        "sink.task.after_commit",
        "sink.after_commit",
    ),
}
SINK_KINDS = ("2pc", "upsert", "foreachbatch", "other", "kafka", "kafka-partition")
KAFKA_SINK_KINDS = {"kafka": "batch", "kafka-partition": "partition"}  # the kafka-eos sink's visibility by kind

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")  # what Kafka accepts as a topic name

# the names of the inputs a refusal names: the command line's, or the pytest plugin's (eos_chaos)
CLI_NAMES = {"sink_kind": "--sink-kind", "faults": "--faults", "dsn": "--dsn", "dead_letters": "--dead-letters"}
PLUGIN_NAMES = {
    "sink_kind": "sink_kind=",
    "faults": "faults=",
    "dsn": "EOS_POSTGRES_DSN",
    "dead_letters": "dead_letters=",
}


def refuse_for_sink_kind(
    sink_kind: str,
    weights: Mapping[str, int],
    *,
    dsn: str | None,
    dead_letters: str | None,
    names: Mapping[str, str] = CLI_NAMES,
) -> None:
    """Refuse (ConfigError naming the input and the fix) what cannot apply to a job writing with the
    ``kafka-eos`` sink (``sink_kind`` kafka / kafka-partition): such a run gives the job no Postgres
    unless ``dsn`` names one, so a Postgres fault has nothing to act on (``pg-restart``, ``pg-crash``,
    ``pg-stop`` never: they need a server spark-eos runs); its dead letters are a Kafka topic."""
    if sink_kind not in KAFKA_SINK_KINDS:
        return
    kind = f"{names['sink_kind']} {sink_kind}"
    for fault in (k for k in (*fault_kinds.PG_SERVER, *fault_kinds.PG_NET) if weights.get(k, 0) > 0):
        if fault in fault_kinds.PG_NET and dsn:
            continue  # a proxy in front of the Postgres the job names (job.dsn): the job may read it
        why = (
            "the run gives the job no Postgres (none is started for a job writing with the kafka-eos sink)"
            if not dsn
            else "it would stop and start a Postgres that the run does not use (the job writes to Kafka)"
        )
        fix = (
            f" (or, to cut the connections of a Postgres your job reads, name it with {names['dsn']})"
            if not dsn
            else ""
        )
        raise ConfigError(
            f"{names['faults']} {fault}: {kind}: {why}; drop {fault}{fix}; the Postgres faults are for jobs that "
            "write to Postgres (2pc, upsert, foreachbatch, other)"
        )
    if dead_letters and not _TOPIC_NAME.fullmatch(dead_letters.replace("{table}", "t")):
        raise ConfigError(
            f"{names['dead_letters']} {dead_letters!r}: with {kind} the dead letters are the sink's errors.topic, "
            "a Kafka topic the run creates: letters, digits, '.', '_' and '-' only (e.g. {table}_dlq)"
        )


# ---------------------------------------------------------------------------------------------
# workload


def make_records(n: int, *, seed: int, start: int = 0, keys: int = 50, prefix: str = "r") -> list[dict[str, Any]]:
    """``n`` records ``{"id", "key", "amount"}`` with unique ids ``<prefix><number>``; seeded."""
    rng = random.Random(f"{seed}:{start}")
    return [
        {"id": f"{prefix}{i:09d}", "key": f"k{rng.randrange(keys):03d}", "amount": rng.randint(1, 1000)}
        for i in range(start, start + n)
    ]


def create_topic(bootstrap: str, topic: str, partitions: int, *, timeout: float = 30.0) -> None:
    """Create ``topic`` and wait until its metadata shows every partition."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
    fut.result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic!r} not ready after {timeout}s")


def _partition_of(record: Mapping[str, Any], partitions: int) -> int:
    return zlib.crc32(str(record["id"]).encode()) % partitions


def produce_records(
    bootstrap: str,
    topic: str,
    records: Sequence[Mapping[str, Any]],
    *,
    partitions: int = 1,
    raw: Sequence[tuple[int, bytes]] = (),
    transactional_id: str | None = None,
    aborted: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Write ``records`` as JSON values (key = record key), spread over ``partitions`` by id.

    On tansu (whose high watermark is the base offset of the last batch + 1) each touched partition
    ends with a one-record batch; Apache Kafka needs none. ``raw`` adds ``(partition, bytes)`` values as they are (poison
    records). With ``transactional_id``, the records go in one committed transaction and
    ``aborted`` in a second, aborted one (they must never reach a read_committed reader).
    """
    from confluent_kafka import Producer

    from connectors.services.env import broker_is_tansu

    # log_level 2: librdkafka's connection notices stay quiet while a chaos run cuts its connections
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "log_level": 2}
    if transactional_id:
        conf["transactional.id"] = transactional_id
    producer = Producer(conf)
    by_part: dict[int, list[bytes | tuple[bytes, bytes]]] = {}
    for rec in records:
        value = json.dumps(dict(rec), sort_keys=True).encode()
        by_part.setdefault(_partition_of(rec, partitions), []).append((str(rec["key"]).encode(), value))
    for part, value in raw:
        by_part.setdefault(part, []).append(value)

    def send(part: int, item: bytes | tuple[bytes, bytes]) -> None:
        key, value = item if isinstance(item, tuple) else (None, item)
        producer.produce(topic, value=value, key=key, partition=part)

    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
        for part, items in by_part.items():
            for item in items:
                send(part, item)
        producer.commit_transaction(30)
        if aborted:
            producer.begin_transaction()
            for rec in aborted:
                value = json.dumps(dict(rec), sort_keys=True).encode()
                producer.produce(
                    topic, value=value, key=str(rec["key"]).encode(), partition=_partition_of(rec, partitions)
                )
            producer.flush(30)
            producer.abort_transaction(30)
        return
    tansu = broker_is_tansu(producer)
    tails = []
    for part, items in by_part.items():
        for item in items[:-1] if tansu else items:
            send(part, item)
            if len(producer) > 50_000:
                producer.poll(0.05)
        if tansu:
            tails.append((part, items[-1]))
    if producer.flush(60):
        raise TimeoutError(f"producer could not deliver to {topic!r} in 60s")
    for part, item in tails:
        send(part, item)
        if producer.flush(30):
            raise TimeoutError(f"producer could not deliver to {topic!r} in 30s")


# ---------------------------------------------------------------------------------------------
# the user's records


@dataclass(frozen=True)
class Record:
    """One record of a user's workload, as it goes to Kafka.

    ``topic`` "" is the run's main topic (``job.topic``); a name is the run's topic of that name
    (``job.topics[name]``: several topics, for joins). ``timestamp``: the Kafka timestamp, in ms since
    the epoch (the source's ``timestamp`` column: event time for windows and watermarks), or None
    (the broker's clock). ``partition`` None: by the key's CRC32 (by the record's index without a key).
    """

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None
    timestamp: int | None = None
    topic: str = ""


_RECORD_FIELDS = ("key", "value", "headers", "partition", "timestamp", "topic")


def _as_bytes(v: Any, what: str) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (dict, list, int, float, bool)):
        return json.dumps(v, sort_keys=True).encode()
    raise ConfigError(f"{what}: {type(v).__name__} is not bytes, str or JSON (dict, list, number)")


def _as_timestamp(v: Any, what: str) -> int | None:
    import datetime as dt

    if v is None:
        return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            raise ConfigError(f"{what}: a naive datetime {v.isoformat()}; give it a tzinfo (or ms since the epoch)")
        return int(v.timestamp() * 1000)
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    raise ConfigError(f"{what}: {v!r} is not a timestamp (ms since the epoch as an int >= 0, or an aware datetime)")


def to_record(item: Any, where: str) -> Record:
    """A user's record -> Record: a tuple ``(key, value[, headers[, partition[, timestamp]]])`` or a
    dict with keys among key, value, headers, partition, timestamp, topic. ``where`` names the source
    (``--generator myjob:records, record 3``) in the error a bad record gets."""
    if isinstance(item, Mapping):
        unknown = sorted(set(item) - set(_RECORD_FIELDS))
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {unknown}; a record dict has {', '.join(_RECORD_FIELDS)}")
        fields = dict(item)
    elif isinstance(item, (tuple, list)) and 2 <= len(item) <= 5:
        fields = dict(zip(_RECORD_FIELDS, item, strict=False))
    else:
        raise ConfigError(
            f"{where}: {type(item).__name__} is not a record; give (key, value[, headers[, partition[, timestamp]]]) "
            "or a dict with key, value, headers, partition, timestamp, topic"
        )
    raw_headers = fields.get("headers") or ()
    pairs = raw_headers.items() if isinstance(raw_headers, Mapping) else raw_headers
    headers = []
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ConfigError(f"{where}: headers: {pair!r} is not a (name, value) pair")
        headers.append((pair[0], _as_bytes(pair[1], f"{where}: header {pair[0]!r}") or b""))
    partition = fields.get("partition")
    if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
        raise ConfigError(f"{where}: partition {partition!r} is not an int >= 0")
    topic = fields.get("topic") or ""
    if not isinstance(topic, str) or not all(c.isalnum() or c in "_-" for c in topic):
        raise ConfigError(f"{where}: topic {topic!r}: a name of letters, digits, _ and - (the run makes it unique)")
    return Record(
        key=_as_bytes(fields.get("key"), f"{where}: key"),
        value=_as_bytes(fields.get("value"), f"{where}: value"),
        headers=tuple(headers),
        partition=partition,
        timestamp=_as_timestamp(fields.get("timestamp"), f"{where}: timestamp"),
        topic=topic,
    )


def load_generator(spec: str, *, option: str = "--generator") -> Any:
    """``module:function`` -> the user's ``records(seed, n)``; a bad spec names ``option``."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{option} {spec!r}: expected module:function, e.g. myjob:records")
    if os.getcwd() not in sys.path:  # the job's directory, as for --app (the runs get it on PYTHONPATH)
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{option} {spec!r}: cannot import {module_name!r} ({exc}); run from its directory or put it on PYTHONPATH"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{option} {spec!r}: {module_name} has no function {attr!r}")
    return fn


def generate_records(spec: Any, seed: int, n: int, *, option: str = "--generator") -> list[Record]:
    """The user's generator's records for ``seed`` and ``n``, checked (each bad one named by its index).
    ``spec``: ``module:function``, or the function itself (the pytest plugin's ``generator=``)."""
    fn = spec if callable(spec) else load_generator(spec, option=option)
    name = getattr(spec, "__qualname__", spec)
    try:
        items = iter(fn(seed, n))
    except TypeError as exc:
        raise ConfigError(f"{option} {name}: records(seed, n) must return an iterable of records ({exc})") from exc
    out = [to_record(item, f"{option} {name}, record {i}") for i, item in enumerate(items)]
    if not out:
        raise ConfigError(f"{option} {name}: records({seed}, {n}) gave no record")
    return out


def read_records_file(path: str, n: int | None = None, *, option: str = "--records-file") -> list[Record]:
    """A file of sample records: ``*.jsonl`` / ``*.json``: one JSON object a line in the dict form of
    ``to_record`` (``{"key": ..., "value": {...}, "timestamp": ms, "topic": ...}``; a value that is
    JSON is sent as its JSON text); ``*.avro``: an Avro container file, each record sent as plain
    Avro binary with the file's schema, what ``from_avro`` reads (``connectors.toolkit.avro``); any
    other name: one raw value a line (bytes, no key). The first ``n`` records (all when ``n`` is None
    or larger)."""
    if path.endswith(".avro"):
        from connectors.toolkit.avro import read_avro_records

        values, _schema = read_avro_records(path, n, option=option)
        return [Record(key=None, value=value) for value in values]
    try:
        with open(path, "rb") as fh:
            lines = [line.rstrip(b"\r\n") for line in fh]
    except OSError as exc:
        raise ConfigError(f"{option} {path!r}: cannot read it ({exc.strerror})") from exc
    lines = [line for line in lines if line.strip()]
    if n is not None:
        lines = lines[:n]
    if not lines:
        raise ConfigError(f"{option} {path!r}: no record in it")
    if not path.endswith((".jsonl", ".json")):
        return [Record(key=None, value=line) for line in lines]
    out = []
    for i, line in enumerate(lines, start=1):
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{option} {path!r}, line {i}: not JSON ({exc})") from exc
        if not isinstance(item, dict):
            raise ConfigError(f"{option} {path!r}, line {i}: a JSON object with key, value, timestamp... expected")
        if isinstance(item.get("headers"), Mapping):
            item["headers"] = list(item["headers"].items())
        out.append(to_record(item, f"{option} {path}, line {i}"))
    return out


def topics_of(records: Sequence[Record], main: str) -> dict[str, str]:
    """The run's topics: ``{"": main, name: f"{main}_{name}", ...}`` for every topic the records name."""
    return {"": main, **{r.topic: f"{main}_{r.topic}" for r in records if r.topic}}


def _user_partition(rec: Record, index: int, partitions: int) -> int:
    if rec.partition is not None:
        if rec.partition >= partitions:
            raise ConfigError(
                f"record {index}: partition {rec.partition}, but the run's topics have {partitions} "
                f"(--partitions {partitions}): raise --partitions or drop the record's partition"
            )
        return rec.partition
    return (zlib.crc32(rec.key) if rec.key is not None else index) % partitions


def produce_user_records(
    bootstrap: str, topics: Mapping[str, str], records: Sequence[Record], *, partitions: int, first: int = 0
) -> None:
    """Write the user's records (``first``: the index of ``records[0]`` in the whole workload, which
    spreads keyless records). On tansu each touched partition ends with a one-record batch (see
    ``produce_records``)."""
    from confluent_kafka import Producer

    from connectors.services.env import broker_is_tansu

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "log_level": 2})
    tansu = broker_is_tansu(producer)
    last: dict[tuple[str, int], int] = {}
    placed = []
    for i, rec in enumerate(records):
        where = (topics[rec.topic], _user_partition(rec, first + i, partitions))
        last[where] = i
        placed.append(where)

    def send(rec: Record, where: tuple[str, int]) -> None:
        kw: dict[str, Any] = {"key": rec.key, "partition": where[1]}
        if rec.headers:
            kw["headers"] = list(rec.headers)
        if rec.timestamp is not None:
            kw["timestamp"] = rec.timestamp
        producer.produce(where[0], value=rec.value, **kw)

    tails = []
    for i, (rec, where) in enumerate(zip(records, placed, strict=True)):
        if tansu and last[where] == i:
            tails.append((rec, where))
            continue
        send(rec, where)
        if len(producer) > 50_000:
            producer.poll(0.05)
    if producer.flush(60):
        raise TimeoutError(f"producer could not deliver to {sorted(set(topics.values()))} in 60s")
    for rec, where in tails:
        send(rec, where)
        if producer.flush(30):
            raise TimeoutError(f"producer could not deliver to {where[0]!r} in 30s")


# ---------------------------------------------------------------------------------------------
# the kill schedule


@dataclass(frozen=True)
class KillPlan:
    """One fault of the schedule. ``kind``: ``sigkill`` (a SIGKILL of the group after ``delay`` seconds
    from the query's start), ``fault`` (a fault ``point``), or another kind of
    ``connectors.toolkit.fault_kinds.KINDS`` (``executor-loss``, ``pg-restart``, ...).

    A fault kill fires at the point in the ``skip``-th batch after the last committed one (sink
    points carry the batch id; source points fire in the first batch that reaches them); on a fresh
    checkpoint, from batch 1 (batch 0 runs on the empty topic).
    """

    index: int
    kind: str  # "sigkill" | "fault" | another fault kind's name
    delay: float
    point: str | None = None
    early: bool = False  # a sigkill during start-up (before the query runs)
    skip: int = 0

    @property
    def fault(self) -> str:
        """The kind as ``--faults`` names it (``kill``, ``fault-point``, ``pg-restart`` ...)."""
        return fault_kinds.fault_of(self.kind)

    def spec(self, last_commit: int | None) -> str:
        if not self.point:
            return ""
        # on a fresh checkpoint batch 0 is the empty first batch (the query starts before the producer
        # writes): a kill there proves nothing, so the first target is batch 1
        batch = _next_batch(last_commit) + self.skip
        cond = f":batch={batch}" if self.point.startswith(("sink.", "pipeline.")) else ""
        return f"{self.point}{cond}:action=kill-group:once"

    def describe(self) -> str:
        return f"{self.index}: {self.kind}" + (f" {self.point}" if self.point else "")


def _next_batch(last_commit: int | None) -> int:
    return 1 if last_commit is None else last_commit + 1


def plan_kills(
    pipeline: str, kills: int, seed: int, *, max_delay: float = 4.0, faults: Mapping[str, int] | None = None
) -> list[KillPlan]:
    """The seeded schedule of ``kills`` faults, each kind drawn with the weights of ``faults``
    (``fault_kinds.parse_faults``; default ``kill:1,fault-point:1``: about half SIGKILLs at random
    moments, half random fault points, as every chaos run drew them before ``--faults``)."""
    rng = random.Random(seed)
    points = FAULT_POINTS[pipeline]
    weights = fault_kinds.parse_faults(faults)
    total = sum(weights.values())
    plans = []
    for i in range(kills):
        u, acc, chosen = rng.random(), 0.0, list(weights)[-1]
        for name, weight in weights.items():
            acc += weight / total
            if u < acc:
                chosen = name
                break
        if chosen == "kill":
            early = rng.random() < 0.15
            delay = rng.uniform(0.5, 10.0) if early else rng.uniform(0.0, max_delay)  # after the 1st new commit
            plans.append(KillPlan(i, "sigkill", round(delay, 2), early=early))
        elif chosen == "fault-point":
            plans.append(KillPlan(i, "fault", 0.0, point=rng.choice(points), skip=rng.randrange(3)))
        else:
            plans.append(KillPlan(i, fault_kinds.plan_kind(chosen), 0.0))
    return plans


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class ChaosConfig:
    pipeline: str
    kills: int
    seed: int
    records: int
    bootstrap: str
    dsn: str
    workdir: str
    partitions: int = 2
    max_offsets: int = 1000
    master: str = "local[2,2]"
    progress: bool = True
    keep: bool = False
    timeout: float = 300.0  # for one run of the pipeline
    events: list[dict[str, Any]] = field(default_factory=list)
    # a user's job instead of a reference pipeline (``pipeline`` is then "app")
    app: str | None = None  # module:function, see connectors.toolkit.app_runner
    sink_kind: str = "2pc"  # the job's sink: SINK_KINDS (2pc: decisions checked; kafka*: the topic checked)
    id_field: str = "id"  # the record field and table column that identify a record
    payload_fields: tuple[str, ...] = ()  # fields the table must hold unchanged
    dead_letters: str | None = None  # the job sink's errors.table ({table}: the run's table): rows count as delivered
    options: dict[str, str] = field(default_factory=dict)  # handed to the job (Job.options)
    # the workload: the user's generator (module:function, records(seed, n)) or file, else make_records
    generator: Any = None  # "module:function" or the function
    records_file: str | None = None
    # the oracle: "append" | "upsert" (then oracle_key), reference runs of the job without faults
    oracle: str | None = None
    oracle_key: tuple[str, ...] = ()
    tolerance: float = 0.0
    ignore_columns: tuple[str, ...] = ()
    reference_runs: int = 2
    workload: list[Record] | None = None  # the user's records, loaded by run()
    only_kills: tuple[int, ...] | None = None  # run only these kills of the seed's schedule (--only-kills)
    reference_rows: list[list[dict[str, Any]]] | None = None  # the reference runs' tables, once read
    topics: dict[str, str] = field(default_factory=dict)  # the run's topics by name ("" the main one)
    # the fault kinds drawn, with their weights (--faults; None: kill:1,fault-point:1)
    faults: Mapping[str, int] | None = None
    postgres_service: Any = None  # the PostgresService to restart/crash/stop (pg-restart, pg-crash, pg-stop)
    kafka_named: str | None = None  # where the user named their broker (--bootstrap, EOS_KAFKA_BOOTSTRAP)
    postgres_named: str | None = None  # where the user named their Postgres (--dsn, EOS_POSTGRES_DSN)

    @property
    def planned(self) -> int:
        """How many kills this run makes (``only_kills`` of the seed's ``kills``)."""
        return self.kills if self.only_kills is None else len(self.only_kills)

    @property
    def points(self) -> str:
        """Which FAULT_POINTS the kill schedule draws from."""
        return self.sink_kind if self.app else self.pipeline

    @property
    def weights(self) -> dict[str, int]:
        return fault_kinds.parse_faults(self.faults)

    @property
    def kafka_sink(self) -> bool:
        """The user's job writes with the kafka-eos sink into the run's topic (``job.out_topic``)."""
        return bool(self.app) and self.sink_kind in KAFKA_SINK_KINDS


def _repo_root() -> str:
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )  # connectors/toolkit/ -> the checkout
    if not os.path.exists(os.path.join(root, "integration", "harness", "runner.py")):
        raise SystemExit(
            "chaos pipelines run integration/harness/runner.py from a spark-eos source checkout; "
            f"none found next to {root}. Run chaos from a clone (pip install -e .)."
        )
    return root


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.started = total, enabled and sys.stderr.isatty(), time.monotonic()
        self.plain = enabled and not self.enabled
        self.last_plain = 0.0

    def show(self, done: int, text: str) -> None:
        if not (self.enabled or self.plain):
            return
        width = 30
        fill = int(width * done / max(1, self.total))
        line = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} faults  {text}  {time.monotonic() - self.started:.0f}s"
        if self.enabled:
            sys.stderr.write("\r" + line[:150].ljust(150))
            sys.stderr.flush()
        elif time.monotonic() - self.last_plain > 20 or done == self.total:
            self.last_plain = time.monotonic()
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


class _Producer(threading.Thread):
    """Writes the records spread over the whole run, so every run of the pipeline meets new data.

    The records are cut into one chunk per run (the kills plus the draining run). Each run, once its
    query has started, releases the next chunk (``release``). The producer writes it in ``pieces``
    slices, the next one only when the query has planned a new batch (a new ``offsets/n`` in the
    checkpoint), so each slice makes a batch of its own: a fault point a few batches ahead is
    reached and a SIGKILL lands while batches flow, however slowly the machine runs. Whatever an
    earlier chunk still owes is written at once when the next is released; ``release(every=True)``
    (the kills are over) writes everything left. The producer never runs ahead of the kills."""

    def __init__(self, cfg: ChaosConfig, topic: str, chunks: int, checkpoint: str, pieces: int = 4) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.cfg, self.topic, self.chunks, self.checkpoint = cfg, topic, max(1, chunks), checkpoint
        self.pieces = max(1, pieces)
        self.tick = threading.Event()
        self.released = 0  # chunks the kill loop has released
        self.rest = False  # the kills are over: write everything left at once
        self.written = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.stopped = False  # the run ended early (a refused job): write nothing more

    def stop(self) -> None:
        self.stopped = True
        self.tick.set()

    def release(self, every: bool = False) -> None:
        """Release the next chunk (a run's query started), or every chunk left (the kills are over)."""
        if every:
            self.rest = True
        self.released = self.chunks if every else min(self.chunks, self.released + 1)
        self.tick.set()

    def _write(self, n: int) -> None:
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.cfg.timeout
        while True:
            try:
                if self.cfg.workload is not None:
                    part = self.cfg.workload[self.written : self.written + n]
                    produce_user_records(
                        self.cfg.bootstrap, self.cfg.topics, part, partitions=self.cfg.partitions, first=self.written
                    )
                else:
                    recs = make_records(n, seed=self.cfg.seed, start=self.written)
                    produce_records(self.cfg.bootstrap, self.topic, recs, partitions=self.cfg.partitions)
                break
            except KafkaException:
                # the broker is down (a broker-crash or broker-restart fault): the metadata request that
                # comes before any record fails at once; try again until it is back
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        self.written += n

    def _planned(self) -> int:
        last = checker.last_offsets(self.checkpoint)
        return -1 if last is None else last

    def run(self) -> None:
        try:
            total = self.cfg.records
            size = -(-total // self.chunks)
            piece = max(1, -(-size // self.pieces))
            while self.written < total and not self.stopped:
                self.tick.clear()
                released = self.released
                # the chunks before the current one (all of them once the kills are over)
                owed = total if self.rest else min(total, max(0, released - 1) * size)
                if self.written < owed:
                    self._write(owed - self.written)
                limit = min(total, released * size)
                planned = self._planned()
                if self.written < limit:
                    self._write(min(piece, limit - self.written))
                # the next slice once the query has planned a batch since this one was written (so
                # each gets a batch of its own), or at once when another chunk is released
                while self.written < total and not self.stopped and not self.tick.wait(0.2):
                    if self.written < limit and self._planned() > planned:
                        break
        except BaseException as exc:  # surfaced by the main thread
            self.error = exc
        finally:
            self.done.set()


def _runner_argv(
    cfg: ChaosConfig,
    topic: str,
    table: str,
    checkpoint: str,
    trigger: str,
    timeout: float | None = None,
    *,
    dsn: str | None = None,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line of one run of the job: ``dsn`` the job's (a proxy's when Postgres is cut),
    ``master`` and ``conf`` what the faults need (default: ``cfg.master``, nothing)."""
    confs = [a for k, v in (conf or {}).items() for a in ("--conf", f"{k}={v}")]
    dsn_arg, master = password_apart(dsn or cfg.dsn)[0], master or cfg.master
    if cfg.app:
        options = [a for k, v in cfg.options.items() for a in ("--option", f"{k}={v}")]
        options += [a for k, v in cfg.topics.items() if k for a in ("--topics", f"{k}={v}")]
        if cfg.kafka_sink:
            options += ["--out-topic", out_topic_of(table), "--visibility", KAFKA_SINK_KINDS[cfg.sink_kind]]
        return python_argv(
            "connectors.toolkit.app_runner",
            "--app",
            cfg.app,
            "--bootstrap",
            cfg.bootstrap,
            "--topic",
            topic,
            "--dsn",
            dsn_arg,
            "--table",
            table,
            "--checkpoint",
            checkpoint,
            "--max-offsets",
            str(cfg.max_offsets),
            "--trigger",
            trigger,
            "--master",
            master,
            "--timeout",
            str(timeout or cfg.timeout),
            *options,
            *confs,
        )
    return python_argv(
        "integration.harness.runner",
        "--sink",
        cfg.pipeline,
        "--bootstrap",
        cfg.bootstrap,
        "--topic",
        topic,
        "--dsn",
        dsn_arg,
        "--table",
        table,
        "--checkpoint",
        checkpoint,
        "--sink-id",
        table,
        "--max-offsets",
        str(cfg.max_offsets),
        "--trigger",
        trigger,
        "--master",
        master,
        "--timeout",
        str(timeout or cfg.timeout),
        *confs,
    )


def _started(proc: PipelineProcess) -> bool:
    return proc.logged("RUNNER STARTED")


def _run_root(cfg: ChaosConfig) -> str:
    """Where the pipeline's runner is imported from: the user's project for --app, else the checkout."""
    if cfg.app:
        if cfg.sink_kind not in SINK_KINDS:
            raise SystemExit(f"--sink-kind {cfg.sink_kind!r}: expected one of {', '.join(SINK_KINDS)}")
        cfg.pipeline = "app"
        return os.getcwd()  # the user's module is imported from here (and from PYTHONPATH)
    if cfg.pipeline not in PIPELINES:
        raise SystemExit(f"--pipeline {cfg.pipeline!r}: expected one of {', '.join(PIPELINES)}")
    return _repo_root()


class _RunLog:
    """Every process of a chaos run, one JSON line each in ``runs.jsonl``: its role (``chaos``, ``drain``,
    ``reference``), pid, start and end (epoch seconds), exit, checkpoint and log; the report's timeline."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0

    def started(self, proc: PipelineProcess, role: str, checkpoint: str, **extra: Any) -> dict[str, Any]:
        self.count += 1
        return {
            "run": self.count,
            "role": role,
            "pid": proc.pid,
            "start": round(time.time(), 3),
            "checkpoint": checkpoint,
            "log": proc.log_path,
            **extra,
        }

    def ended(self, entry: dict[str, Any], returncode: int | None, ended_by: str) -> None:
        entry.update(end=round(time.time(), 3), exit=describe_exit(returncode), ended_by=ended_by)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")


def read_runs(workdir: str) -> list[dict[str, Any]]:
    """The ``runs.jsonl`` of a chaos run's workdir (empty when there is none)."""
    try:
        with open(os.path.join(workdir, "runs.jsonl"), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


@dataclass
class _Runs:
    """What the fault loop saw: exits by kind, kill kinds, runs that ended by SIGKILL, each fault's proof."""

    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    sigkilled: int = 0
    kill_steps: int = 0
    unreached: list[str] = field(default_factory=list)  # fault points not reached in time: killed from outside
    proofs: list[dict[str, Any]] = field(default_factory=list)  # one per fault that is not a kill
    extra_kills: int = 0  # runs ended by SIGKILL for the next fault's own run, or at the schedule's end


class _Loop:
    """The fault loop: runs of the job, each fault of the schedule injected into the live run (a run
    starts when none is live; ``kill`` and ``fault-point`` end it; ``fault-point``, ``executor-loss``
    and ``slow-task`` are armed in a run's environment, so they get a run of their own)."""

    def __init__(
        self,
        cfg: ChaosConfig,
        kit: fault_kinds.FaultKit,
        env: dict[str, str],
        topic: str,
        table: str,
        root: str,
        producer: _Producer,
        runlog: _RunLog,
    ) -> None:
        self.cfg, self.kit, self.env, self.root = cfg, kit, env, root
        self.producer, self.runlog = producer, runlog
        self.checkpoint = os.path.join(cfg.workdir, "checkpoint")
        self.fault_log = os.path.join(cfg.workdir, "faults.jsonl")
        self.log_path = os.path.join(cfg.workdir, "pipeline.log")
        # a run may carry several faults: the runner's own timeout (a safety net) covers them all
        self.argv = _runner_argv(
            cfg,
            topic,
            table,
            self.checkpoint,
            "processing:0.5",
            cfg.timeout * (cfg.planned + 2),
            dsn=kit.job_dsn,
            master=kit.master,
            conf=kit.conf,
        )
        self.live: PipelineProcess | None = None
        self.entry: dict[str, Any] = {}
        self.runs = _Runs()

    # ---- runs
    def _start(self, faults_spec: str = "", index: int | None = None) -> PipelineProcess:
        run_env = dict(self.env)
        if faults_spec:
            run_env["EOS_FAULTS"] = faults_spec
            run_env["EOS_FAULTS_STATE"] = os.path.join(self.cfg.workdir, "state", str(index))
        proc = PipelineProcess(self.argv, run_env, self.log_path, self.root)
        proc.start()
        self.live = proc
        self.entry = self.runlog.started(
            proc, "chaos", self.checkpoint, master=self.kit.master, faults=faults_spec or None
        )
        return proc

    def _ended(self, proc: PipelineProcess, ended_by: str, timeout: float = 60) -> Any:
        try:
            out = proc.wait(timeout)
        finally:
            if proc.alive():
                proc.stop()
        self.runlog.ended(self.entry, out.returncode, ended_by)
        self.live = None
        raise_refusal(out)  # the job does not fit the run (app_runner said why): stop here, say why
        return out

    def _alive(self) -> PipelineProcess | None:
        if self.live is not None and not self.live.alive():
            self._ended(self.live, "exited by itself")
        return self.live

    def end_live(self, why: str) -> None:
        """SIGKILL the live run's group (the next fault needs a run of its own, or the schedule is over)."""
        proc = self._alive()
        if proc is None:
            return
        proc.kill_group()
        self._ended(proc, why)
        self.runs.extra_kills += 1

    def _commit_after(self, proc: PipelineProcess, before: int | None) -> bool:
        _wait_commit_after(proc, self.checkpoint, before, self.cfg.timeout)
        return checker.committed_through(self.checkpoint) > (-1 if before is None else before)

    # ---- one fault
    def step(self, plan: KillPlan) -> dict[str, Any]:
        fault = plan.fault
        if fault in fault_kinds.FRESH_RUN and self._alive() is not None:
            self.end_live(f"SIGKILL: fault {plan.index} ({fault}) needs a run of its own")
        if fault in ("kill", "fault-point"):
            return self._kill(plan)
        if fault in ("executor-loss", "slow-task"):
            return self._held(plan)
        return self._disturb(plan)

    def _kill(self, plan: KillPlan) -> dict[str, Any]:
        cfg, producer = self.cfg, self.producer
        self.runs.kill_steps += 1
        fresh = self._alive() is None
        spec = plan.spec(checker.last_commit(self.checkpoint)) if plan.kind == "fault" else ""
        proc = self._start(spec, plan.index) if fresh else self.live
        assert proc is not None
        how = plan.kind
        if plan.kind == "sigkill":
            if plan.early and fresh:
                producer.release()
            else:
                # strike while batches flow: after the run's first new commit, so that every
                # restart makes progress even on a slow machine (no livelock of replays)
                before = checker.last_commit(self.checkpoint)
                _wait_started(proc, cfg.timeout)
                producer.release()
                _wait_commit_after(proc, self.checkpoint, before, cfg.timeout)
            time.sleep(plan.delay)
            proc.kill_group()
        else:
            _wait_started(proc, cfg.timeout)  # start-up on a loaded machine can take a minute
            producer.release()  # trickled from now on: the batches up to the fault's batch come
            try:
                proc.wait(90)
            except Exception:  # the point was not reached in time (e.g. no new data): kill from outside
                how = "fault->sigkill"
                proc.kill_group()
                self.runs.unreached.append(f"{plan.index}: {spec.split(':action')[0]}")
        out = self._ended(proc, f"fault {plan.index}: {how}" + (f" {plan.point}" if plan.point else ""))
        if out.killed:
            self.runs.sigkilled += 1
        fired = fault_kinds.firings(self.fault_log, spec) if spec else []
        ok = out.killed and (plan.kind == "sigkill" or bool(fired))
        return {
            "how": how,
            "out": out,
            "ok": ok,
            "spec": spec or None,
            "proof": describe_exit(out.returncode)
            + (f"; {spec.split(':action')[0]} fired (pid {fired[0]['pid']})" if fired else ""),
        }

    def _held(self, plan: KillPlan) -> dict[str, Any]:
        """executor-loss and slow-task: a run whose first task at the hold point waits; its executor
        is killed, or Spark's speculation runs a copy of it elsewhere."""
        cfg, fault = self.cfg, plan.fault
        batch = _next_batch(checker.last_commit(self.checkpoint))
        point = fault_kinds.hold_point(cfg.points)
        slow = fault == "slow-task"
        spec = fault_kinds.hold_spec(
            point, batch, fault_kinds.HOLD_SECONDS if slow else fault_kinds.EXECUTOR_HOLD, log_others=slow
        )
        held_rule = spec.split(";")[0]
        proc = self._start(spec, plan.index)
        _wait_started(proc, cfg.timeout)
        self.producer.release()
        fired = wait_for(lambda: fault_kinds.firings(self.fault_log, held_rule), cfg.timeout, proc.alive)
        proof: dict[str, Any] = {"hold_point": point, "batch": batch, "spec": spec}
        if not fired:
            proof.update(ok=False, proof=f"no task was held at {point} in batch {batch} ({self._status(proc)})")
            self._log(plan, fault, proof)
            return {"how": fault, "ok": False, "proof": proof["proof"], "detail": proof}
        held = fired[0]
        if slow:
            time.sleep(max(0.0, float(held["time"]) + fault_kinds.HOLD_SECONDS + 1 - time.time()))
            copy = fault_kinds.speculative_copy(self.fault_log, held, spec.split(";")[1])
            proof.update(
                held={k: held.get(k) for k in ("pid", "partition", "attempt", "time")},
                copy=None if copy is None else {k: copy.get(k) for k in ("pid", "partition", "attempt", "time")},
                ok=copy is not None,
            )
            proof["proof"] = (
                f"task {held.get('partition')} of batch {batch} held {fault_kinds.HOLD_SECONDS:.0f} s at {point} "
                f"(pid {held.get('pid')}); "
                + (
                    f"a copy ran meanwhile (pid {copy.get('pid')}, attempt {copy.get('attempt', '?')})"
                    if copy
                    else "Spark ran NO copy of it meanwhile (speculation did not start)"
                )
            )
        else:
            killed = fault_kinds.kill_executor(int(held["pid"]))
            proof.update(killed)
            proof["proof"] = f"task of batch {batch} held at {point} (pid {held.get('pid')}); {killed['proof']}"
        before = batch - 1
        recovered = self._commit_after(proc, before)
        proof["recovered"] = recovered or not proc.alive()
        self._log(plan, fault, proof)
        return {
            "how": fault,
            "ok": bool(proof["ok"]) and proof["recovered"],
            "proof": proof["proof"] + self._after(proc, recovered),
            "detail": proof,
        }

    def _disturb(self, plan: KillPlan) -> dict[str, Any]:
        cfg, fault = self.cfg, plan.fault
        proc = self._alive() or self._start()
        _wait_started(proc, cfg.timeout)
        before = checker.last_commit(self.checkpoint)
        self.producer.release()
        self._commit_after(proc, before)  # batches flow: the fault meets the job at work
        proof = self.kit.disturb(fault)
        self.producer.release()  # new records after the heal: the run must get past the fault
        healed_at = checker.last_commit(self.checkpoint)
        recovered = self._commit_after(proc, healed_at) if proc.alive() else False
        proof["recovered"] = recovered or not proc.alive()
        self._log(plan, fault, proof)
        ok = bool(proof["ok"]) and proof["recovered"]
        return {"how": fault, "ok": ok, "proof": proof["proof"] + self._after(proc, recovered), "detail": proof}

    def _after(self, proc: PipelineProcess, recovered: bool) -> str:
        if recovered:
            return "; the job committed a batch after it"
        if not proc.alive():
            return f"; the run then ended ({self._status(proc)}); the next run restarts from the checkpoint"
        return f"; NO batch committed within {self.cfg.timeout:.0f} s after it (the job hangs)"

    def _status(self, proc: PipelineProcess) -> str:
        return describe_exit(proc.proc.poll() if proc.proc is not None else None)

    def _log(self, plan: KillPlan, fault: str, proof: Mapping[str, Any]) -> None:
        entry = {**proof, "point": f"chaos.{fault}", "action": fault, "fault": plan.index, "pid": os.getpid()}
        faults.append_log(self.fault_log, {**entry, "time": time.time()})

    def finish(self) -> None:
        if self._alive() is not None:
            self.end_live("SIGKILL: the schedule is over; a draining run follows")


def wait_for(predicate: Any, timeout: float, alive: Any) -> Any:
    """Poll ``predicate`` until truthy (its value), ``alive()`` is false or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if not alive():
            return predicate() or None
        time.sleep(0.2)
    return None


def _chunks(plans: Sequence[KillPlan]) -> int:
    """Chunks of the records: one per fault (two for a fault from outside: before it and after its heal)
    and one for the draining run."""
    return sum(2 if p.fault in fault_kinds.DISTURBANCES else 1 for p in plans) + 1


def _verify_output(cfg: ChaosConfig, topic: str, table: str, checkpoint: str) -> checker.Report:
    """The exact checker for what the run wrote: a Kafka sink job's topic (``topic_checker.verify_topic``:
    read back read_committed, by record id against the source or, with the oracle, only its end state; no
    transaction of the sink left open; the sink's last marker = Spark's last commits/n; its markers of the
    visibility the --sink-kind names), else the table (``checker.verify``)."""
    if cfg.kafka_sink:
        from connectors.toolkit.topic_checker import verify_topic

        return verify_topic(
            bootstrap=cfg.bootstrap,
            source_topic=topic,
            sink_topic=out_topic_of(table),
            sink_id=sink_id_of(table),
            checkpoint=checkpoint,
            id_field=cfg.id_field,
            payload_fields=cfg.payload_fields,
            errors_topic=_dead_letters_of(cfg, table),
            records=not cfg.oracle,
            visibility=KAFKA_SINK_KINDS[cfg.sink_kind],
        )
    is_2pc = cfg.points == "2pc"
    return checker.verify(
        bootstrap=cfg.bootstrap,
        topic=topic,
        dsn=cfg.dsn,
        table="" if cfg.pipeline == "stateful" or cfg.oracle else table,
        id_field=cfg.id_field,
        payload_fields=cfg.payload_fields if cfg.app else ("key", "amount"),
        sink_id=sink_id_of(table) if is_2pc else None,
        checkpoint=checkpoint,
        decisions=is_2pc,
        aggregates={"table": table, "key": "key", "value": "amount"} if cfg.pipeline == "stateful" else None,
        dead_letters=_dead_letters_of(cfg, table),
    )


def _checked(
    cfg: ChaosConfig, topic: str, table: str, checkpoint: str, fault_log: str, runs: _Runs, last: Any
) -> checker.Report:
    """The checker's report on the chaos run's end state, plus its own checks (every fault happened, the drain ended)."""
    report = _verify_output(cfg, topic, table, checkpoint)
    fault_kills = sum(1 for e in faults.fired(fault_log) if e.get("action") == "kill-group")
    if cfg.workload is not None:  # the user's records (with --oracle, not JSON for the checker: not "poison")
        report.info["source_records"] = len(cfg.workload)
        if cfg.oracle:
            report.info.pop("poison_records", None)
    if runs.kill_steps:
        # a fault point that was never reached (its run killed from outside after 90 s) proves nothing
        unreached = runs.unreached
        report.add(
            checker.Check(
                "chaos.kills",
                runs.sigkilled == runs.kill_steps and runs.sigkilled > 0 and not unreached,
                f"{runs.sigkilled} of {runs.kill_steps} planned kills ended the pipeline by SIGKILL "
                f"({fault_kills} from fault points, logged)"
                + (
                    f"; {len(unreached)} fault points NOT reached (killed from outside instead): the batch they "
                    "aim at never ran"
                    if unreached
                    else ""
                ),
                {
                    "planned": runs.kill_steps,
                    "sigkilled": runs.sigkilled,
                    "fault_point_kills": fault_kills,
                    **({"unreached": len(unreached)} if unreached else {}),
                },
                {"unreached": unreached} if unreached else {},
            )
        )
    if runs.proofs:
        bad = [p for p in runs.proofs if not p["ok"]]
        kinds = Counter(p["fault"] for p in runs.proofs)
        report.add(
            checker.Check(
                "chaos.faults",
                not bad,
                f"{len(runs.proofs) - len(bad)} of {len(runs.proofs)} faults other than kills proven in the "
                f"fault log and followed by a commit or a restart ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})",
                {
                    "planned": len(runs.proofs),
                    "proven": len(runs.proofs) - len(bad),
                    **{k: n for k, n in kinds.items()},
                },
                {"unproven": [f"{p['index']}: {p['fault']}: {p['proof']}" for p in bad]},
            )
        )
    report.add(
        checker.Check(
            "chaos.final_run",
            last.returncode == 0,
            f"the draining run ended with {describe_exit(last.returncode)} after {last.seconds:.0f}s",
            {"returncode": last.returncode},
        ),
    )
    return report


def _dead_letters_of(cfg: ChaosConfig, table: str) -> str | None:
    """The job sink's dead letters for the run writing ``table``: its ``errors.table`` (a Kafka sink job:
    its ``errors.topic``), ``{table}`` replaced."""
    return cfg.dead_letters.replace("{table}", table) if cfg.dead_letters else None


def _make_out_topics(cfg: ChaosConfig, table: str) -> None:
    """A Kafka sink job's topics for the run writing ``table``: ``out_topic_of(table)`` (as many partitions
    as the source's) and its dead-letter topic (``--dead-letters``)."""
    if not cfg.kafka_sink:
        return
    create_topic(cfg.bootstrap, out_topic_of(table), cfg.partitions)
    letters = _dead_letters_of(cfg, table)
    if letters:
        create_topic(cfg.bootstrap, letters, 1)


def _written(cfg: ChaosConfig, table: str) -> str:
    """What the run writing ``table`` writes, as a report names it: the table, or a Kafka sink job's topic."""
    return f"topic {out_topic_of(table)}" if cfg.kafka_sink else table


def _output_rows(cfg: ChaosConfig, table: str) -> list[dict[str, Any]]:
    """What the run writing ``table`` left, as the oracle compares it: the table's rows, or a Kafka sink
    job's topic read read_committed (``topic_checker.topic_rows``; with ``upsert``, each key's last record)."""
    if cfg.kafka_sink:
        from connectors.toolkit.topic_checker import topic_rows

        latest = cfg.oracle_key if cfg.oracle == "upsert" else None
        return topic_rows(cfg.bootstrap, out_topic_of(table), latest_by=latest)
    import psycopg

    with psycopg.connect(cfg.dsn, autocommit=True) as conn:
        return checker.read_table(conn, table)


def _check_fault_setup(cfg: ChaosConfig) -> dict[str, int]:
    weights = cfg.weights
    if cfg.app:  # first: a Kafka sink job's own refusals say more than the general ones
        refuse_for_sink_kind(cfg.sink_kind, weights, dsn=cfg.dsn, dead_letters=cfg.dead_letters)
    fault_kinds.refuse_unsupported(
        weights, kafka_named=cfg.kafka_named, postgres_named=cfg.postgres_named, dsn=cfg.dsn, partitions=cfg.partitions
    )
    server = [k for k in fault_kinds.PG_SERVER if k in weights]
    if server and (cfg.postgres_service is None or getattr(cfg.postgres_service, "kind", "env") == "env"):
        raise ConfigError(
            f"--faults {server[0]}: needs the Postgres service spark-eos runs (ChaosConfig.postgres_service: an "
            "embedded or container one), to stop and start it"
        )
    return weights


def run(cfg: ChaosConfig) -> checker.Report:
    """Run the chaos experiment described by ``cfg`` and return the checker's report."""
    root = _run_root(cfg)
    weights = _check_fault_setup(cfg)
    tag = f"chaos_{cfg.pipeline}_{cfg.seed}_{int(time.time())}"
    topic, table = tag, tag
    os.makedirs(cfg.workdir, exist_ok=True)
    fault_log = os.path.join(cfg.workdir, "faults.jsonl")
    load_workload(cfg)
    plans = schedule(cfg)
    env = dict(os.environ, EOS_FAULTS_LOG=fault_log, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(password_apart(cfg.dsn)[1])  # the runs' --dsn carries no password (_runner_argv)
    env.pop("EOS_FAULTS", None)
    with fault_kinds.FaultKit(
        weights, bootstrap=cfg.bootstrap, dsn=cfg.dsn, postgres=cfg.postgres_service, env=env, workdir=cfg.workdir
    ) as kit:
        if kit.cluster is not None:  # our cluster's executors run on this machine: this interpreter
            env.setdefault("PYSPARK_PYTHON", sys.executable)
        named = cfg.bootstrap
        cfg.bootstrap = kit.bootstrap  # a broker of the run's own when the faults need one
        try:
            report = _run_with(cfg, kit, plans, env, topic, table, root)
        finally:
            cfg.bootstrap = named
    report.info.update(
        {
            **({"faults": fault_kinds.format_faults(weights)} if weights != fault_kinds.DEFAULT else {}),
            **({"master": kit.master} if kit.master != cfg.master else {}),
        }
    )
    return report


def _steps(cfg: ChaosConfig, loop: _Loop, plans: list[KillPlan], producer: _Producer) -> None:
    """Inject each fault of the schedule into the job's runs; what each did goes to ``cfg.events``."""
    runs, progress = loop.runs, _Progress(cfg.planned, cfg.progress)
    for plan in plans:
        step = loop.step(plan)
        how, out = step["how"], step.get("out")
        exit_text = describe_exit(out.returncode) if out is not None else "still running"
        runs.kinds[f"{how}:{plan.point}" if plan.point else how] += 1
        if out is not None:
            runs.outcomes[exit_text] += 1
        else:
            runs.proofs.append({"index": plan.index, "fault": plan.fault, "ok": step["ok"], "proof": step["proof"]})
        cfg.events.append(
            {
                "kill": plan.index,
                "kind": how,
                "point": plan.point,
                "delay": plan.delay,
                "exit": exit_text,
                "seconds": round(out.seconds, 1) if out is not None else None,
                "fault": plan.fault,
                "ok": step["ok"],
                "proof": step["proof"],
                "run": loop.runlog.count,
            }
        )
        progress.show(
            plan.index + 1,
            f"records {producer.written}/{cfg.records}  last: {how} {plan.point or ''} -> {exit_text}",
        )
        if producer.error:
            raise producer.error
    loop.finish()
    progress.end()


def _drain(
    cfg: ChaosConfig,
    kit: fault_kinds.FaultKit,
    env: dict[str, str],
    topic: str,
    table: str,
    root: str,
    runlog: _RunLog,
) -> Any:
    """The last run: availableNow from the checkpoint until the topic is drained; how it ended. It carries no
    fault, so it runs on the job's own master (``cfg.master``), not on the local-cluster or standalone cluster
    that ``executor-loss`` or ``slow-task`` ran the job's other runs on (executor JVMs of its own to start):
    a restart from the checkpoint on another master with as many task slots, as an operator may do."""
    checkpoint = os.path.join(cfg.workdir, "checkpoint")
    drain = max(cfg.timeout * 3, cfg.records / 20)  # the backlog left may be large on a slow machine
    argv = _runner_argv(cfg, topic, table, checkpoint, "available-now", drain, dsn=kit.job_dsn, master=cfg.master)
    final = PipelineProcess(argv, env, os.path.join(cfg.workdir, "pipeline.log"), root)
    final.start()
    entry = runlog.started(final, "drain", checkpoint, master=cfg.master)
    try:
        last = final.wait(drain + 60)
    except Exception:
        last = final.stop()
    runlog.ended(entry, last.returncode, "drained" if last.returncode == 0 else "failed")
    raise_refusal(last)
    return last


REFUSED_EXIT = 64  # app_runner's exit when the job does not fit the run (``RUNNER REFUSED: why``)


def raise_refusal(out: Any) -> None:
    """A run the job refused (``app_runner``: RUNNER REFUSED, exit 64; e.g. --sink-kind kafka on a job whose
    sink is not kafka-eos) as a ConfigError with the runner's reason: no later run would fare better."""
    if out is None or out.returncode != REFUSED_EXIT:
        return
    found = re.findall(r"RUNNER REFUSED: ([^\n]*)", out.log_tail or "")
    if found:
        raise ConfigError(found[-1])


def _run_with(
    cfg: ChaosConfig,
    kit: fault_kinds.FaultKit,
    plans: list[KillPlan],
    env: dict[str, str],
    topic: str,
    table: str,
    root: str,
) -> checker.Report:
    import psycopg

    checkpoint = os.path.join(cfg.workdir, "checkpoint")
    fault_log = os.path.join(cfg.workdir, "faults.jsonl")
    cfg.topics = topics_of(cfg.workload or [], topic)
    for name in cfg.topics.values():
        create_topic(cfg.bootstrap, name, cfg.partitions)
    _make_out_topics(cfg, table)
    runlog = _RunLog(os.path.join(cfg.workdir, "runs.jsonl"))
    # chunks of the records released over the run (one per fault, two around a fault from outside,
    # one for the draining run), each trickled while its run goes on
    producer = _Producer(cfg, topic, _chunks(plans), checkpoint)
    started = time.monotonic()
    producer.start()
    loop = _Loop(cfg, kit, env, topic, table, root, producer, runlog)
    runs = loop.runs
    try:
        _steps(cfg, loop, plans, producer)
    except BaseException:
        producer.stop()  # a refused job or an error: the producer writes no more
        raise
    producer.release(every=True)
    producer.done.wait()
    if producer.error:
        raise producer.error
    last = _drain(cfg, kit, env, topic, table, root, runlog)
    processes = runlog.count  # the chaos runs and the draining run
    wall = time.monotonic() - started
    if cfg.dsn:
        with psycopg.connect(cfg.dsn, autocommit=True):
            pass
    report = _checked(cfg, topic, table, checkpoint, fault_log, runs, last)
    if cfg.oracle:
        report.extend(_reference_verdict(cfg, topic, table, env, root, runlog))
    report.info.update(
        {
            "pipeline": cfg.pipeline,
            **({"app": cfg.app, "sink_kind": cfg.sink_kind} if cfg.app else {}),
            **({"out_topic": out_topic_of(table)} if cfg.kafka_sink else {}),
            "seed": cfg.seed,
            "records": cfg.records,
            "kills": cfg.planned,
            "restarts": processes - 1,
            **({"only_kills": list(cfg.only_kills)} if cfg.only_kills is not None else {}),
            "kill_kinds": dict(sorted(runs.kinds.items())),
            "exits": dict(runs.outcomes),
            **({"extra_kills": runs.extra_kills} if runs.extra_kills else {}),
            "wall_seconds": round(wall, 1),
            "records_per_second": round(cfg.records / wall, 1),
            "workdir": cfg.workdir,
            "topic": topic,
            "table": table,
        }
    )
    return report


def schedule(cfg: ChaosConfig) -> list[KillPlan]:
    """The seed's kill schedule, or the kills ``cfg.only_kills`` keeps of it (indices stay the seed's)."""
    plans = plan_kills(cfg.points, cfg.kills, cfg.seed, faults=cfg.faults)
    if cfg.only_kills is None:
        return plans
    bad = [i for i in cfg.only_kills if not 0 <= i < cfg.kills]
    if bad or not cfg.only_kills:
        raise ConfigError(
            f"--only-kills {','.join(map(str, cfg.only_kills))}: kill numbers from 0 to {cfg.kills - 1} "
            f"(--kills {cfg.kills}), at least one"
        )
    return [p for p in plans if p.index in cfg.only_kills]


def reproduce_command(cfg: ChaosConfig, kills: Sequence[int] | None) -> str:
    """The ``spark-eos chaos`` command that re-runs ``cfg`` with only ``kills`` of its schedule (None: all)."""
    import shlex

    gen = cfg.generator
    if callable(gen):
        gen = f"{gen.__module__}:{gen.__qualname__}"
    argv = ["spark-eos", "chaos", *(("--app", cfg.app) if cfg.app else ("--pipeline", cfg.pipeline))]
    if cfg.app:
        argv += ["--sink-kind", cfg.sink_kind]
    argv += [
        *(("--generator", gen) if gen else ()),
        *(("--records-file", cfg.records_file) if cfg.records_file else ()),
    ]
    argv += ["--seed", str(cfg.seed), "--kills", str(cfg.kills)]
    argv += ["--only-kills", ",".join(map(str, kills))] if kills is not None else []
    if cfg.weights != fault_kinds.DEFAULT:
        argv += ["--faults", fault_kinds.format_faults(cfg.weights)]
    argv += ["--records", str(cfg.records), "--partitions", str(cfg.partitions), "--max-offsets", str(cfg.max_offsets)]
    if cfg.oracle:
        argv += ["--oracle", cfg.oracle + (":" + ",".join(cfg.oracle_key) if cfg.oracle_key else "")]
        argv += [*(("--tolerance", repr(cfg.tolerance)) if cfg.tolerance else ())]
        argv += [*(("--ignore-columns", ",".join(cfg.ignore_columns)) if cfg.ignore_columns else ())]
    if cfg.app and cfg.id_field != "id":
        argv += ["--id-field", cfg.id_field]
    if cfg.payload_fields:
        argv += ["--payload", ",".join(cfg.payload_fields)]
    if cfg.dead_letters:
        argv += ["--dead-letters", cfg.dead_letters]
    argv += [a for k, v in cfg.options.items() for a in ("--option", f"{k}={v}")]
    return shlex.join(argv)


def minimise(cfg: ChaosConfig, report: checker.Report) -> dict[str, Any]:
    """Re-run a failing seed dropping its kills one at a time (a kill stays dropped when the run
    still fails without it); the smallest failing schedule, each kill's kind and point, and the
    command that reproduces it. Trials reuse the reference runs' tables (same records, no faults).
    Also put in ``report.info["minimised"]``."""
    keep = [p.index for p in schedule(cfg)]
    trials: list[dict[str, Any]] = []
    for index in list(keep):
        if len(keep) == 1:
            break
        trial = [k for k in keep if k != index]
        tcfg = dataclasses.replace(
            cfg,
            only_kills=tuple(trial),
            events=[],
            progress=False,
            workdir=os.path.join(cfg.workdir, f"minimise-{len(trials)}"),
        )
        tcfg.workload, tcfg.topics = None, {}
        result = run(tcfg)
        fails = not result.ok and result.info.get("verdict") != oracle.CANNOT_JUDGE
        trials.append({"kills": trial, "fails": fails, "workdir": tcfg.workdir})
        if fails:
            keep = trial
    plans = {p.index: p for p in plan_kills(cfg.points, cfg.kills, cfg.seed, faults=cfg.faults)}
    found = {
        "kills": keep,
        "schedule": [plans[i].describe() for i in keep],
        "trials": trials,
        "command": reproduce_command(cfg, keep),
    }
    report.info["minimised"] = found
    return found


def load_workload(cfg: ChaosConfig) -> None:
    """Load the user's records (``--generator`` / ``--records-file``) into ``cfg.workload``; ``cfg.records``
    becomes their number. The default workload (``make_records``) stays None: it is made as it goes."""
    if cfg.generator and cfg.records_file:
        raise ConfigError("--generator and --records-file: pick one (a function making records, or a file of them)")
    if cfg.generator:
        cfg.workload = generate_records(cfg.generator, cfg.seed, cfg.records)
    elif cfg.records_file:
        cfg.workload = read_records_file(cfg.records_file, cfg.records)
    if cfg.workload is not None:
        for i, rec in enumerate(cfg.workload):
            _user_partition(rec, i, cfg.partitions)  # a partition out of range: refused before anything runs
        cfg.records = len(cfg.workload)
    if cfg.oracle and not cfg.app:
        raise ConfigError("--oracle compares YOUR job's table with its fault-free runs: it needs --app")
    if cfg.oracle not in (None, *oracle.MODES):
        raise ConfigError(f"--oracle {cfg.oracle!r}: expected append or upsert:KEY[,KEY...]")
    if cfg.reference_runs < 1:
        raise ConfigError(
            f"--reference-runs {cfg.reference_runs}: at least 1 (2, the default, also proves the job deterministic)"
        )


def _reference_verdict(
    cfg: ChaosConfig, topic: str, table: str, env: dict[str, str], root: str, runlog: _RunLog | None = None
) -> checker.Report:
    """Run the job ``cfg.reference_runs`` times without any fault, on the same topics, each from a fresh
    checkpoint with availableNow into ``<table>_ref<i>``; the oracle's report on the chaos run's table."""
    if cfg.reference_rows is not None:  # a minimisation trial: the same records, the same references
        got = _output_rows(cfg, table)
        report = oracle.judge(
            got,
            cfg.reference_rows,
            mode=cfg.oracle or "append",
            key=cfg.oracle_key,
            tolerance=cfg.tolerance,
            ignore=cfg.ignore_columns,
            table=_written(cfg, table),
        )
        report.info["sink_rows"] = len(got)
        return report
    clean = {k: v for k, v in env.items() if k not in ("EOS_FAULTS", "EOS_FAULTS_STATE")}
    tables = []
    for i in range(1, cfg.reference_runs + 1):
        ref_table = f"{table}_ref{i}"
        _make_out_topics(cfg, ref_table)
        ref_checkpoint = os.path.join(cfg.workdir, f"reference{i}", "checkpoint")
        log = os.path.join(cfg.workdir, f"reference{i}.log")
        drain = max(cfg.timeout * 3, cfg.records / 20)
        # the whole workload in one batch (the job's result must not depend on how it is batched; the
        # chaos run batched it its own way already), which keeps a reference run short
        argv = _runner_argv(
            dataclasses.replace(cfg, max_offsets=max(cfg.max_offsets, cfg.records * len(cfg.topics or {"": ""}))),
            topic,
            ref_table,
            ref_checkpoint,
            "available-now",
            drain,
        )
        proc = PipelineProcess(argv, clean, log, root)
        if runlog is None:
            out = proc.run(drain + 60)
        else:
            proc.start()
            entry = runlog.started(proc, "reference", ref_checkpoint, table=ref_table)
            try:
                out = proc.wait(drain + 60)
            except Exception:
                out = proc.stop()
            runlog.ended(entry, out.returncode, "drained" if out.returncode == 0 else "failed")
        if out.returncode != 0:
            return checker.Report(
                checks=[
                    checker.Check(
                        "oracle.reference_run",
                        False,
                        f"{oracle.CANNOT_JUDGE}: reference run {i} (no faults) ended with "
                        f"{describe_exit(out.returncode)}; see {log}",
                    )
                ],
                info={"verdict": oracle.CANNOT_JUDGE},
            )
        tables.append(ref_table)
    got = _output_rows(cfg, table)
    refs = [_output_rows(cfg, t) for t in tables]
    cfg.reference_rows = refs
    report = oracle.judge(
        got,
        refs,
        mode=cfg.oracle or "append",
        key=cfg.oracle_key,
        tolerance=cfg.tolerance,
        ignore=cfg.ignore_columns,
        table=_written(cfg, table),
    )
    if cfg.kafka_sink:
        report.info.update({"reference_topics": [out_topic_of(t) for t in tables], "sink_rows": len(got)})
    else:
        report.info.update({"reference_tables": tables, "sink_rows": len(got)})
    return report


def write_results(report: checker.Report, cfg: ChaosConfig) -> None:
    """Leave ``report.json`` and ``events.jsonl`` (one line per kill: kind, point, exit) in the workdir."""
    report.info["events"] = len(cfg.events)
    with open(os.path.join(cfg.workdir, "report.json"), "w", encoding="utf-8") as fh:
        fh.write(report.to_json())
    with open(os.path.join(cfg.workdir, "events.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in cfg.events)


def _wait_commit_after(proc: PipelineProcess, checkpoint: str, before: int | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while checker.committed_through(checkpoint) <= (-1 if before is None else before):
        if not proc.alive() or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _wait_started(proc: PipelineProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _started(proc):
        if not proc.alive() or time.monotonic() > deadline:
            return
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# command line


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``chaos`` command to an argparse subparsers object (``spark-eos chaos``)."""
    p = subparsers.add_parser(
        "chaos",
        help="kill a pipeline N times while a producer writes, then check exactly-once",
        description=__doc__.split("\n")[0],
    )
    _arguments(p)
    p.set_defaults(func=_command)
    return p  # type: ignore[no-any-return]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pipeline", choices=PIPELINES, default=None, help="which reference pipeline to run (default 2pc)")
    p.add_argument(
        "--app", default=None, help="module:function building YOUR query instead (see connectors.toolkit.app_runner)"
    )
    p.add_argument(
        "--sink-kind",
        choices=SINK_KINDS,
        default="2pc",
        help="with --app: the job's sink, which picks the fault points and checks (default 2pc; "
        "foreachbatch: points around your foreachBatch function, before Spark's commit; kafka / "
        "kafka-partition: the kafka-eos sink with visibility=batch / partition, writing job.out_topic, "
        "which is read back read_committed)",
    )
    p.add_argument("--id-field", default="id", help="with --app: the record field / column identifying a record")
    p.add_argument("--payload", default="", help="with --app: comma-separated fields the table must hold unchanged")
    p.add_argument("--option", action="append", default=[], help="with --app: key=value handed to the job")
    p.add_argument(
        "--dead-letters",
        default=None,
        help="with --app: the job sink's errors.table ('{table}' stands for the run's table, e.g. {table}_refused), "
        "or with --sink-kind kafka* its errors.topic (the run creates it); a record there counts as delivered "
        "(each record once in the table or topic, or in the dead letters)",
    )
    p.add_argument(
        "--generator",
        default=None,
        metavar="MODULE:FUNCTION",
        help="with --app: YOUR records: records(seed, n) yields (key, value[, headers[, partition[, timestamp]]]) "
        "or dicts with key, value, headers, partition, timestamp (ms), topic (several topics: job.topics)",
    )
    p.add_argument(
        "--records-file",
        default=None,
        metavar="PATH",
        help="with --app: YOUR sample records: *.jsonl one {key, value, timestamp, topic...} object a line, "
        "*.avro an Avro container file (each record's value plain Avro binary, what from_avro reads), "
        "any other file one raw value a line (the first --records of them)",
    )
    p.add_argument(
        "--oracle",
        default=None,
        metavar="append|upsert:KEY[,KEY]",
        help="with --app: judge the table against fault-free reference runs of the job (availableNow, "
        "fresh checkpoint, table <table>_ref1..), as multisets (append) or by key (upsert)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="with --oracle: float columns may differ this much (relative and absolute; default 0: exact)",
    )
    p.add_argument("--ignore-columns", default="", help="with --oracle: comma-separated columns allowed to differ")
    p.add_argument(
        "--reference-runs",
        type=int,
        default=2,
        help="with --oracle: fault-free runs (default 2: they must agree, else the verdict is CANNOT JUDGE)",
    )
    p.add_argument(
        "--only-kills",
        default=None,
        metavar="I,J",
        help="run only these kills (numbered from 0) of the seed's schedule: what --minimise prints",
    )
    p.add_argument(
        "--minimise",
        action="store_true",
        help="when the run fails, re-run the seed dropping kills one at a time; print the smallest "
        "failing schedule and the command reproducing it",
    )
    p.add_argument(
        "--kills",
        type=int,
        default=10,
        help="how many faults the schedule has (default 10; all kills unless --faults says otherwise)",
    )
    p.add_argument(
        "--faults",
        default=None,
        metavar="KIND:WEIGHT,...",
        help="the fault kinds drawn and their weights (default kill:1,fault-point:1); kinds: "
        + ", ".join(fault_kinds.KINDS)
        + " (docs/guarantees.md, chaos-test your own job)",
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="also write report.html (timeline, findings, the oracle's first differing rows; no network) "
        "and junit.xml (one test case per check) into DIR",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the kill schedule and the records (default 1)")
    p.add_argument("--records", type=int, default=10_000, help="records the producer writes (default 10000)")
    p.add_argument("--partitions", type=int, default=2, help="topic partitions (default 2)")
    p.add_argument("--max-offsets", type=int, default=1000, help="maxOffsetsPerTrigger (default 1000)")
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("EOS_KAFKA_BOOTSTRAP"),
        help="Kafka (default: EOS_KAFKA_BOOTSTRAP, else embedded)",
    )
    p.add_argument(
        "--dsn", default=os.environ.get("EOS_POSTGRES_DSN"), help="Postgres (default: EOS_POSTGRES_DSN, else embedded)"
    )
    p.add_argument("--workdir", default=None, help="checkpoint, logs and fault log (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _oracle_args(args: argparse.Namespace) -> tuple[str | None, tuple[str, ...]]:
    """``--oracle`` parsed (mode, key), its tuning flags checked."""
    mode: str | None = None
    key: tuple[str, ...] = ()
    if args.oracle:
        try:
            mode, key = oracle.parse_mode(args.oracle)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if args.tolerance < 0 or args.tolerance != args.tolerance:
        raise ConfigError(f"--tolerance {args.tolerance}: a number >= 0 (e.g. 1e-9)")
    if args.reference_runs < 1:
        raise ConfigError(
            f"--reference-runs {args.reference_runs}: at least 1 (2, the default, also checks the job is deterministic)"
        )
    given = {
        "--tolerance": args.tolerance != 0,
        "--ignore-columns": bool(args.ignore_columns),
        "--reference-runs": args.reference_runs != 2,
    }
    for flag, used in given.items():
        if used and not args.oracle:
            raise ConfigError(f"{flag} tunes the oracle's comparison: it needs --oracle append|upsert:KEY")
    return mode, key


def _only_kills(args: argparse.Namespace) -> tuple[int, ...] | None:
    only = None
    if args.only_kills is not None:
        try:
            only = tuple(sorted({int(x) for x in args.only_kills.split(",")}))
        except ValueError:
            raise ConfigError(f"--only-kills {args.only_kills!r}: comma-separated kill numbers, e.g. 0,3") from None
        if any(not 0 <= i < args.kills for i in only):
            raise ConfigError(
                f"--only-kills {args.only_kills}: kill numbers from 0 to {args.kills - 1} (--kills {args.kills})"
            )
    if args.minimise and (len(only) if only is not None else args.kills) < 2:
        raise ConfigError("--minimise drops kills one at a time: it needs at least 2 (--kills)")
    return only


def _workload_args(args: argparse.Namespace) -> None:
    for name in ("generator", "records_file", "oracle"):
        if getattr(args, name) and not args.app:
            raise ConfigError(
                f"--{name.replace('_', '-')} needs --app (the reference pipelines make their own records)"
            )
    if args.sink_kind != "2pc" and not args.app:
        raise ConfigError(
            f"--sink-kind {args.sink_kind} needs --app (your job, whose sink it names); the reference pipelines "
            "(--pipeline) have their own sinks"
        )
    if args.generator and args.records_file:
        raise ConfigError("--generator and --records-file: pick one (a function making records, or a file of them)")
    if args.records_file and not os.path.isfile(args.records_file):
        raise ConfigError(f"--records-file {args.records_file!r}: no such file")
    if args.generator:
        load_generator(args.generator)  # a bad module or function: refused before any service starts


def _command(args: argparse.Namespace) -> int:
    for name in ("kills", "records", "partitions", "max_offsets"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.app and args.pipeline:
        raise SystemExit("--app and --pipeline: pick one (your job, or one of our reference pipelines)")
    bad = [kv for kv in args.option if "=" not in kv]
    if bad:
        raise SystemExit(f"--option {bad[0]!r}: expected key=value")
    mode, key = _oracle_args(args)
    _workload_args(args)
    only = _only_kills(args)
    weights = fault_kinds.parse_faults(args.faults)
    named_kafka = _named(args.bootstrap, "EOS_KAFKA_BOOTSTRAP", "--bootstrap")
    named_pg = _named(args.dsn, "EOS_POSTGRES_DSN", "--dsn")
    if args.app:  # before the general refusals: a Kafka sink job's say more
        refuse_for_sink_kind(args.sink_kind, weights, dsn=args.dsn, dead_letters=args.dead_letters)
    fault_kinds.refuse_unsupported(
        weights, kafka_named=named_kafka, postgres_named=named_pg, dsn=args.dsn, partitions=args.partitions
    )
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        raise ConfigError(f"--report {args.report!r}: a file is there; name a directory (it is created if missing)")
    # a broker of the run's own when the faults restart it or cut it (fault_kinds.FaultKit starts it)
    own_broker = any(k in weights for k in (*fault_kinds.BROKER, *fault_kinds.KAFKA_NET))
    # a job writing with the kafka-eos sink gets no Postgres unless --dsn (or EOS_POSTGRES_DSN) names one
    kafka_job = bool(args.app) and args.sink_kind in KAFKA_SINK_KINDS
    stack, pg_service = _services(args, kafka=not own_broker, postgres=not kafka_job)
    try:
        workdir = args.workdir or tempfile.mkdtemp(prefix="eos-chaos-")
        cfg = ChaosConfig(
            pipeline=args.pipeline or "2pc",
            kills=args.kills,
            seed=args.seed,
            records=args.records,
            bootstrap=args.bootstrap,
            dsn=args.dsn,
            workdir=workdir,
            partitions=args.partitions,
            max_offsets=args.max_offsets,
            progress=not args.quiet,
            app=args.app,
            sink_kind=args.sink_kind,
            id_field=args.id_field,
            payload_fields=tuple(f for f in args.payload.split(",") if f),
            options=dict(kv.split("=", 1) for kv in args.option),
            dead_letters=args.dead_letters,
            generator=args.generator,
            records_file=args.records_file,
            oracle=mode,
            oracle_key=key,
            tolerance=args.tolerance,
            ignore_columns=tuple(c.strip() for c in args.ignore_columns.split(",") if c.strip()),
            reference_runs=args.reference_runs,
            only_kills=only,
            faults=weights,
            postgres_service=pg_service,
            kafka_named=named_kafka,
            postgres_named=named_pg,
        )
        report = run(cfg)
        if args.minimise and not report.ok and report.info.get("verdict") != oracle.CANNOT_JUDGE:
            if not args.quiet:
                print(f"minimising: re-running seed {cfg.seed} dropping kills one at a time", file=sys.stderr)
            minimise(cfg, report)
        write_results(report, cfg)
        if args.report:
            from connectors.toolkit import report as report_files

            written = report_files.write(
                report, cfg.workdir, args.report, command=reproduce_command(cfg, cfg.only_kills)
            )
            if not args.quiet:
                print(f"report: {' '.join(written)}", file=sys.stderr)
        print(report.to_json() if args.json else report.table())
        return 0 if report.ok else 1
    finally:
        for stop in reversed(stack):
            stop()


def _named(value: str | None, env: str, flag: str) -> str | None:
    """Where the user named a service (``flag`` or ``env``), None when nothing names it."""
    if not value:
        return None
    return env if value == os.environ.get(env) else flag


def _services(args: argparse.Namespace, *, kafka: bool = True, postgres: bool = True) -> tuple[list[Any], Any]:
    """Use the named services, else start embedded ones (stopped when the run ends); the Postgres
    service object when spark-eos runs it (the server faults stop and start it). ``kafka=False``:
    no broker (the run starts one of its own, for the broker faults); ``postgres=False``: no Postgres
    unless one is named (a job that writes only to Kafka)."""
    stops: list[Any] = []
    from connectors import services

    if not args.bootstrap and kafka:
        broker = services.kafka()
        stops.append(broker.stop)
        args.bootstrap = broker.bootstrap
    pg = None
    if not args.dsn and postgres:
        pg = services.postgres()
        stops.append(pg.stop)
        args.dsn = pg.dsn
    args.bootstrap = args.bootstrap or ""
    args.dsn = args.dsn or ""
    return stops, pg


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connectors.toolkit.chaos", description=__doc__.split("\n")[0])
    _arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _command(args)
    except ConfigError as exc:
        print(f"chaos: config error: {exc}", file=sys.stderr)
        return 64


if __name__ == "__main__":
    sys.exit(main())
