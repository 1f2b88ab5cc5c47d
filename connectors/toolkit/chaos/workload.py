"""The records a chaos run writes: the default workload, the user's generator or file, and the producer thread
that releases them run by run."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.toolkit import checker
from connectors.toolkit.app_runner import out_topic_of
from connectors.toolkit.chaos.config import ChaosConfig
from eos_core.errors import ConfigError

__all__ = [
    "Producer",
    "Record",
    "create_topic",
    "generate_records",
    "load",
    "load_generator",
    "make_out_topics",
    "make_records",
    "partition_of",
    "produce_records",
    "produce_user_records",
    "read_records_file",
    "to_record",
    "topics_of",
    "user_partition",
]


def make_records(n: int, *, seed: int, start: int = 0, keys: int = 50, prefix: str = "r") -> list[dict[str, Any]]:
    """``n`` records ``{"id", "key", "amount"}`` with unique ids ``<prefix><number>``; seeded."""
    rng = random.Random(f"{seed}:{start}")
    return [
        {"id": f"{prefix}{i:09d}", "key": f"k{rng.randrange(keys):03d}", "amount": rng.randint(1, 1000)}
        for i in range(start, start + n)
    ]


def create_topic(
    bootstrap: str, topic: str, partitions: int, *, timeout: float = 30.0, settings: Mapping[str, Any] | None = None
) -> None:
    """Create ``topic`` and wait until its metadata shows every partition. ``settings``: the client's security
    settings (default: those of ``EOS_KAFKA_CONFIG``)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({**_settings(settings), "bootstrap.servers": bootstrap})
    # the cluster's own replication factor (default.replication.factor): three on a replicated cluster
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic]
    fut.result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic!r} not ready after {timeout}s")


def partition_of(record: Mapping[str, Any], partitions: int) -> int:
    return zlib.crc32(str(record["id"]).encode()) % partitions


def _settings(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The security settings of the toolkit's own clients: ``given``, else ``EOS_KAFKA_CONFIG``'s."""
    from eos_core.kafka_config import client_settings

    return dict(given) if given is not None else client_settings()


def produce_records(
    bootstrap: str,
    topic: str,
    records: Sequence[Mapping[str, Any]],
    *,
    partitions: int = 1,
    raw: Sequence[tuple[int, bytes]] = (),
    transactional_id: str | None = None,
    aborted: Sequence[Mapping[str, Any]] = (),
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Write ``records`` as JSON values (key = record key), spread over ``partitions`` by id (``settings``: the
    client's security settings, default those of ``EOS_KAFKA_CONFIG``).

    On tansu (whose high watermark is the base offset of the last batch + 1) each touched partition
    ends with a one-record batch; Apache Kafka needs none. ``raw`` adds ``(partition, bytes)`` values as they are (poison
    records). With ``transactional_id``, the records go in one committed transaction and
    ``aborted`` in a second, aborted one (they must never reach a read_committed reader).
    """
    from confluent_kafka import Producer

    from connectors.services.env import broker_is_tansu

    # log_level 2: librdkafka's connection notices stay quiet while a chaos run cuts its connections
    conf: dict[str, Any] = {
        **_settings(settings),
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "enable.idempotence": True,
        "log_level": 2,
    }
    if transactional_id:
        conf["transactional.id"] = transactional_id
    producer = Producer(conf)
    by_part: dict[int, list[bytes | tuple[bytes, bytes]]] = {}
    for rec in records:
        value = json.dumps(dict(rec), sort_keys=True).encode()
        by_part.setdefault(partition_of(rec, partitions), []).append((str(rec["key"]).encode(), value))
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
                    topic, value=value, key=str(rec["key"]).encode(), partition=partition_of(rec, partitions)
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
    Avro binary with the file's schema, what ``from_avro`` reads (``connectors.toolkit.chaos.avro``); any
    other name: one raw value a line (bytes, no key). The first ``n`` records (all when ``n`` is None
    or larger)."""
    if path.endswith(".avro"):
        from connectors.toolkit.chaos.avro import read_avro_records

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


def user_partition(rec: Record, index: int, partitions: int) -> int:
    if rec.partition is not None:
        if rec.partition >= partitions:
            raise ConfigError(
                f"record {index}: partition {rec.partition}, but the run's topics have {partitions} "
                f"(--partitions {partitions}): raise --partitions or drop the record's partition"
            )
        return rec.partition
    return (zlib.crc32(rec.key) if rec.key is not None else index) % partitions


def produce_user_records(
    bootstrap: str,
    topics: Mapping[str, str],
    records: Sequence[Record],
    *,
    partitions: int,
    first: int = 0,
    settings: Mapping[str, Any] | None = None,
    codec: Any = None,
) -> None:
    """Write the user's records (``first``: the index of ``records[0]`` in the whole workload, which
    spreads keyless records). On tansu each touched partition ends with a one-record batch (see
    ``produce_records``). ``codec`` (``chaos.avro.RegistryCodec``): each value written in the registry's wire
    format under its topic's subject."""
    from confluent_kafka import Producer

    from connectors.services.env import broker_is_tansu

    producer = Producer(
        {
            **_settings(settings),
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "log_level": 2,
        }
    )
    tansu = broker_is_tansu(producer)
    last: dict[tuple[str, int], int] = {}
    placed = []
    for i, rec in enumerate(records):
        where = (topics[rec.topic], user_partition(rec, first + i, partitions))
        last[where] = i
        placed.append(where)

    values = [
        rec.value if codec is None else codec.encode(where[0], rec.value, f"record {first + i}")
        for i, (rec, where) in enumerate(zip(records, placed, strict=True))
    ]

    def send(rec: Record, where: tuple[str, int], value: bytes | None) -> None:
        kw: dict[str, Any] = {"key": rec.key, "partition": where[1]}
        if rec.headers:
            kw["headers"] = list(rec.headers)
        if rec.timestamp is not None:
            kw["timestamp"] = rec.timestamp
        producer.produce(where[0], value=value, **kw)

    tails = []
    for i, (rec, where) in enumerate(zip(records, placed, strict=True)):
        if tansu and last[where] == i:
            tails.append((rec, where, values[i]))
            continue
        send(rec, where, values[i])
        if len(producer) > 50_000:
            producer.poll(0.05)
    if producer.flush(60):
        raise TimeoutError(f"producer could not deliver to {sorted(set(topics.values()))} in 60s")
    for rec, where, value in tails:
        send(rec, where, value)
        if producer.flush(30):
            raise TimeoutError(f"producer could not deliver to {where[0]!r} in 30s")


class Producer(threading.Thread):
    """Writes the records spread over the whole run, so every run of the pipeline meets new data.

    The records are cut into one chunk per run (the kills plus the draining run). Each run, once its
    query has started, releases the next chunk (``release``). The producer writes it in ``pieces``
    slices, the next one only when the query has planned a new batch (a new ``offsets/n`` in the
    checkpoint), so each slice makes a batch of its own: a fault point a few batches ahead is
    reached and a SIGKILL lands while batches flow, however slowly the machine runs. Whatever an
    earlier chunk still owes is written at once when the next is released; ``release(every=True)``
    (the kills are over) writes everything left. The producer never runs ahead of the kills."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        records: int,
        chunks: int,
        checkpoint: str,
        workload: Sequence[Record] | None = None,
        topics: Mapping[str, str] | None = None,
        seed: int = 1,
        partitions: int = 2,
        timeout: float = 300.0,
        pieces: int = 4,
        codec: Any = None,
    ) -> None:
        """``records`` of ``workload`` (the user's, to ``topics`` by name), else of ``make_records(seed)`` to
        ``topic``, spread over ``partitions``; a broker that is down is retried for ``timeout`` seconds.
        ``codec``: the workload's values written in a Schema Registry's wire format (``produce_user_records``)."""
        super().__init__(name="chaos-producer", daemon=True)
        self.bootstrap, self.topic, self.chunks, self.checkpoint = bootstrap, topic, max(1, chunks), checkpoint
        self.total, self.workload, self.topics = records, workload, dict(topics or {"": topic})
        self.seed, self.partitions, self.timeout = seed, partitions, timeout
        self.pieces = max(1, pieces)
        self.codec = codec
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

    def write(self, n: int) -> None:
        """Write the next ``n`` records, waiting out a broker that is down for ``timeout`` seconds."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.timeout
        while True:
            try:
                if self.workload is not None:
                    part = self.workload[self.written : self.written + n]
                    produce_user_records(
                        self.bootstrap,
                        self.topics,
                        part,
                        partitions=self.partitions,
                        first=self.written,
                        codec=self.codec,
                    )
                else:
                    recs = make_records(n, seed=self.seed, start=self.written)
                    produce_records(self.bootstrap, self.topic, recs, partitions=self.partitions)
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
            total = self.total
            size = -(-total // self.chunks)
            piece = max(1, -(-size // self.pieces))
            while self.written < total and not self.stopped:
                self.tick.clear()
                released = self.released
                # the chunks before the current one (all of them once the kills are over)
                owed = total if self.rest else min(total, max(0, released - 1) * size)
                if self.written < owed:
                    self.write(owed - self.written)
                limit = min(total, released * size)
                planned = self._planned()
                if self.written < limit:
                    self.write(min(piece, limit - self.written))
                # the next slice once the query has planned a batch since this one was written (so
                # each gets a batch of its own), or at once when another chunk is released
                while self.written < total and not self.stopped and not self.tick.wait(0.2):
                    if self.written < limit and self._planned() > planned:
                        break
        except BaseException as exc:  # surfaced by the main thread
            self.error = exc
        finally:
            self.done.set()


def load(cfg: ChaosConfig) -> list[Record] | None:
    """The user's records (``--generator`` / ``--records-file``), checked (a partition out of range is refused
    before anything runs); None for the default workload (``make_records``), which is made as it goes."""
    records: list[Record] | None = None
    if cfg.generator:
        records = generate_records(cfg.generator, cfg.seed, cfg.records)
    elif cfg.records_file:
        records = read_records_file(cfg.records_file, cfg.records)
    for i, rec in enumerate(records or ()):
        user_partition(rec, i, cfg.partitions)
    if cfg.value_format == "avro" and records is not None and cfg.schema:
        from connectors.toolkit.chaos.avro import check_records

        check_records(records, cfg.schema, "--generator" if cfg.generator else "--records-file")
    return records


def make_out_topics(cfg: ChaosConfig, bootstrap: str, table: str) -> None:
    """A Kafka sink job's topics for the run writing ``table``: ``out_topic_of(table)`` (as many partitions
    as the source's) and its dead-letter topic (``--dead-letters``)."""
    if not cfg.kafka_sink:
        return
    create_topic(bootstrap, out_topic_of(table), cfg.partitions)
    letters = cfg.dead_letters_for(table)
    if letters:
        create_topic(bootstrap, letters, 1)
