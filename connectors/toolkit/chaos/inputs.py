"""The one front door of a chaos run: what the command line or the pytest plugin was given, checked once,
refused with the input's own name and the fix, its services found or started, as a frozen ``ChaosConfig``.

``spark-eos chaos`` (``cli``) and ``eos_chaos`` (``connectors.toolkit.pytest_plugin``) both call
``prepare``; they differ only in how they spell an input in a refusal (``CLI_NAMES``, ``PLUGIN_NAMES``) and
in where a service comes from when none is named (``Services``: embedded processes the command stops at
its end, or the plugin's session fixtures). Nothing is started before every refusal has had its say.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from connectors.toolkit import oracle as oracle_mod
from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, PIPELINES, SINK_KINDS, ChaosConfig
from connectors.toolkit.chaos.workload import load_generator
from eos_core.errors import ConfigError

__all__ = ["CLI_NAMES", "PLUGIN_NAMES", "Asked", "Services", "named_by", "prepare"]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")  # what Kafka accepts as a topic name

# how a refusal names each input: the command line's flags, or the pytest plugin's (eos_chaos) keywords
CLI_NAMES: dict[str, str] = {
    "app": "--app",
    "pipeline": "--pipeline",
    "sink_kind": "--sink-kind",
    "faults": "--faults",
    "kills": "--kills",
    "records": "--records",
    "partitions": "--partitions",
    "max_offsets": "--max-offsets",
    "bootstrap": "--bootstrap",
    "app_kafka_config": "--app-kafka-config",
    "dsn": "--dsn",
    "dead_letters": "--dead-letters",
    "generator": "--generator",
    "records_file": "--records-file",
    "oracle": "--oracle",
    "tolerance": "--tolerance",
    "ignore_columns": "--ignore-columns",
    "reference_runs": "--reference-runs",
    "only_kills": "--only-kills",
    "minimise": "--minimise",
    "report_dir": "--report",
    "connect": "--connect",
    "value_format": "--value-format",
    "schema": "--schema",
    "schema_registry": "--schema-registry",
}
PLUGIN_NAMES: dict[str, str] = {
    **{k: f"{k}=" for k in CLI_NAMES},
    "app": "app",
    "bootstrap": "EOS_KAFKA_BOOTSTRAP",
    "dsn": "EOS_POSTGRES_DSN",
}


class Services(Protocol):
    """Where a run's services come from when none is named: ``kafka()`` a broker (``.bootstrap``),
    ``postgres()`` a Postgres with two-phase commit (``.dsn``; restartable when spark-eos runs it)."""

    def kafka(self) -> Any: ...

    def postgres(self) -> Any: ...


def named_by(value: str | None, env: str, flag: str) -> str | None:
    """Which input named a service (``flag``, or the variable ``env`` it defaults to); None when none did."""
    if not value:
        return None
    return env if value == os.environ.get(env) else flag


@dataclass(frozen=True)
class Asked:
    """What a chaos run was given, unchecked, as the command line's flags or the plugin's keywords say it:
    ``prepare``'s keyword arguments. ``bootstrap`` / ``dsn``: the broker and Postgres the user named
    (``kafka_named`` / ``postgres_named``: which input named them, ``named_by``)."""

    workdir: str
    pipeline: str | None = None
    app: str | None = None
    sink_kind: str = "2pc"
    kills: int = 10
    seed: int = 1
    records: int = 10_000
    partitions: int = 2
    max_offsets: int = 1000
    faults: str | Mapping[str, int] | None = None
    bootstrap: str | None = None
    kafka_named: str | None = None
    app_kafka_config: str | None = None
    dsn: str | None = None
    postgres_named: str | None = None
    options: Mapping[str, str] | None = None
    id_field: str = "id"
    payload: Sequence[str] = ()
    dead_letters: str | None = None
    generator: Any = None
    records_file: str | None = None
    oracle: str | None = None
    tolerance: float = 0.0
    ignore_columns: Sequence[str] = ()
    reference_runs: int = 2
    only_kills: Sequence[int] | None = None
    minimise: bool = False
    report_dir: str | None = None
    timeout: float = 300.0
    progress: bool = True
    connect: bool = False
    value_format: str = "json"
    schema: str | None = None  # an .avsc file (value_format avro)
    schema_registry: str | None = None  # its URL; None: EOS_SCHEMA_REGISTRY_URL


# what ChaosConfig takes of Asked as it is (prepare makes the rest: the job, the services, parsed values)
_MADE = {
    "pipeline",
    "bootstrap",
    "dsn",
    "options",
    "oracle",
    "ignore_columns",
    "only_kills",
    "faults",
    "schema",
    "schema_registry",
}
_AS_GIVEN = tuple(
    f.name for f in dataclasses.fields(Asked) if f.name in {g.name for g in dataclasses.fields(ChaosConfig)} - _MADE
)


def prepare(services: Services, *, names: Mapping[str, str] = CLI_NAMES, **given: Any) -> ChaosConfig:
    """Check everything a chaos run was given (``given``: the fields of ``Asked``), refuse what cannot run
    (``ConfigError`` naming the input as ``names`` spells it, and the fix), then find or start its services
    and return its config. ``services`` gives the broker and the Postgres nobody named: no broker when the
    faults need one of the run's own (``kit.FaultKit`` starts it), no Postgres for a job writing with the
    kafka-eos sink unless one is named."""
    n = dict(CLI_NAMES, **names)
    try:
        a = Asked(**given)
    except TypeError as exc:
        raise ConfigError(
            f"chaos: {exc} (the inputs are {', '.join(f.name for f in dataclasses.fields(Asked))})"
        ) from None
    _check_numbers(n, kills=a.kills, records=a.records, partitions=a.partitions, max_offsets=a.max_offsets)
    _check_job(n, a.pipeline, a.app, a.sink_kind)
    if a.connect and not a.app:
        raise ConfigError(
            f"{n['connect']} needs {n['app']}: it runs your job as a Spark Connect client (the reference pipelines "
            "run on a Spark of their own process)"
        )
    _check_workload(n, a.app, a.generator, a.records_file, a.oracle)
    schema, registry = _check_value_format(n, a)
    mode, key = _check_oracle(n, a.oracle, a.tolerance, a.ignore_columns, a.reference_runs)
    only = _check_kills(n, a.kills, a.only_kills, a.minimise)
    weights = _check_faults(n, a)
    if a.report_dir and os.path.exists(a.report_dir) and not os.path.isdir(a.report_dir):
        raise ConfigError(
            f"{n['report_dir']} {a.report_dir!r}: a file is there; name a directory (it is created if missing)"
        )
    _check_kafka_config(n, a.app_kafka_config)
    bootstrap, dsn, pg_service = a.bootstrap, a.dsn, None
    if {"own-broker", "kafka-cluster"} & kinds.needed(weights):
        bootstrap = ""  # the run starts a broker (or a replicated cluster) of its own (kit.FaultKit)
    elif not bootstrap:
        bootstrap = services.kafka().bootstrap
    if not dsn and not (a.app and a.sink_kind in KAFKA_SINK_KINDS):
        pg_service = services.postgres()
        dsn = pg_service.dsn
    return ChaosConfig(
        **{name: getattr(a, name) for name in _AS_GIVEN},
        pipeline="app" if a.app else (a.pipeline or "2pc"),
        bootstrap=bootstrap or "",
        dsn=dsn or "",
        payload_fields=tuple(a.payload),
        options=dict(a.options or {}),
        oracle=mode,
        oracle_key=key,
        ignore_columns=tuple(a.ignore_columns),
        only_kills=only,
        faults=weights,
        postgres_service=pg_service,
        schema=schema,
        schema_file=a.schema,
        schema_registry=registry,
    )


def _check_value_format(n: Mapping[str, str], a: Asked) -> tuple[str | None, str | None]:
    """``value_format`` avro: the schema file's text and the registry's URL (given, else EOS_SCHEMA_REGISTRY_URL)."""
    if a.value_format not in ("json", "avro"):
        raise ConfigError(f"{n['value_format']} {a.value_format!r}: json (the default) or avro")
    if a.value_format == "json":
        for name in ("schema", "schema_registry"):
            if getattr(a, name):
                raise ConfigError(f"{n[name]} goes with {n['value_format']} avro; drop it, or add that")
        return None, None
    if not a.app:
        raise ConfigError(
            f"{n['value_format']} avro needs {n['app']}: the reference pipelines read JSON; your job reads the "
            "registry-encoded records (value.format=avro)"
        )
    if not (a.generator or a.records_file):
        raise ConfigError(
            f"{n['value_format']} avro writes YOUR records' values with {n['schema']}: give {n['generator']} or "
            f"{n['records_file']} (records whose values are JSON objects the schema fits)"
        )
    if a.records_file and a.records_file.endswith(".avro"):
        raise ConfigError(
            f"{n['records_file']} {a.records_file!r} holds plain Avro (what from_avro reads) and {n['value_format']} "
            "avro writes JSON objects in a registry's wire format: give a *.jsonl file, or drop the value format"
        )
    if not a.schema:
        raise ConfigError(f"{n['value_format']} avro needs {n['schema']} FILE: the records' Avro schema (an .avsc)")
    from connectors.services.schema_registry import URL_ENV
    from connectors.toolkit.chaos.avro import read_schema_file

    text = read_schema_file(a.schema, option=n["schema"])
    registry = (a.schema_registry or os.environ.get(URL_ENV) or "").strip()
    if not registry:
        raise ConfigError(
            f"{n['value_format']} avro needs a Schema Registry: {n['schema_registry']} URL, or {URL_ENV} (spark-eos "
            "services up --with-registry starts one and names it)"
        )
    return text, registry


def _check_faults(n: Mapping[str, str], a: Asked) -> dict[str, int]:
    """The fault kinds' weights, parsed; what the setup cannot inject refused (``kinds.refuse``)."""
    weights = kinds.parse_faults(a.faults, option=n["faults"])
    kafka_sink = bool(a.app) and a.sink_kind in KAFKA_SINK_KINDS
    if kafka_sink and a.dead_letters and not _TOPIC_NAME.fullmatch(a.dead_letters.replace("{table}", "t")):
        raise ConfigError(
            f"{n['dead_letters']} {a.dead_letters!r}: with {n['sink_kind']} {a.sink_kind} the dead letters are the "
            "sink's errors.topic, a Kafka topic the run creates: letters, digits, '.', '_' and '-' only "
            "(e.g. {table}_dlq)"
        )
    setup = kinds.Setup(
        kafka_named=a.kafka_named if a.bootstrap else None,
        postgres_named=a.postgres_named if a.dsn else None,
        dsn=a.dsn,
        partitions=a.partitions,
        sink_kind=a.sink_kind if a.app else None,
        names=n,
        connect=a.connect,
    )
    kinds.refuse(weights, setup)
    return weights


def _check_kafka_config(names: Mapping[str, str], path: str | None) -> None:
    """The job's Kafka client properties must be a file it can read (the runs would each fail on it)."""
    from eos_core.kafka_config import read_properties

    if path:
        try:
            read_properties(path)
        except ConfigError as exc:
            raise ConfigError(f"{names['app_kafka_config']}: {exc}") from None


def _check_numbers(names: Mapping[str, str], **values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ConfigError(f"{names[name]} {value}: at least 1")


def _check_job(names: Mapping[str, str], pipeline: str | None, app: str | None, sink_kind: str) -> None:
    if app and pipeline:
        raise ConfigError(
            f"{names['app']} and {names['pipeline']}: pick one (your job, or one of our reference pipelines)"
        )
    if pipeline is not None and pipeline not in PIPELINES:
        raise ConfigError(f"{names['pipeline']} {pipeline!r}: expected one of {', '.join(PIPELINES)}")
    if sink_kind not in SINK_KINDS:
        raise ConfigError(f"{names['sink_kind']} {sink_kind!r}: expected one of {', '.join(SINK_KINDS)}")
    if sink_kind != "2pc" and not app:
        raise ConfigError(
            f"{names['sink_kind']} {sink_kind} needs {names['app']} (your job, whose sink it names); the "
            f"reference pipelines ({names['pipeline']}) have their own sinks"
        )


def _check_workload(
    names: Mapping[str, str], app: str | None, generator: Any, records_file: str | None, oracle: str | None
) -> None:
    for name, given in (("generator", generator), ("records_file", records_file), ("oracle", oracle)):
        if given and not app:
            raise ConfigError(f"{names[name]} needs {names['app']} (the reference pipelines make their own records)")
    if generator and records_file:
        raise ConfigError(
            f"{names['generator']} and {names['records_file']}: pick one (a function making records, or a file of them)"
        )
    if records_file and not os.path.isfile(records_file):
        raise ConfigError(f"{names['records_file']} {records_file!r}: no such file")
    if isinstance(generator, str):
        load_generator(generator, option=names["generator"])  # a bad module or function: refused now


def _check_oracle(
    names: Mapping[str, str],
    oracle: str | None,
    tolerance: float,
    ignore_columns: Sequence[str],
    reference_runs: int,
) -> tuple[str | None, tuple[str, ...]]:
    """``oracle`` parsed (mode, key), its tuning inputs checked."""
    mode: str | None = None
    key: tuple[str, ...] = ()
    if oracle:
        try:
            mode, key = oracle_mod.parse_mode(oracle, option=names["oracle"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if tolerance < 0 or math.isnan(tolerance):
        raise ConfigError(f"{names['tolerance']} {tolerance}: a number >= 0 (e.g. 1e-9)")
    if reference_runs < 1:
        raise ConfigError(
            f"{names['reference_runs']} {reference_runs}: at least 1 (2, the default, also checks the job is "
            "deterministic)"
        )
    tuned = {"tolerance": tolerance != 0, "ignore_columns": bool(ignore_columns), "reference_runs": reference_runs != 2}
    for name, used in tuned.items():
        if used and not oracle:
            raise ConfigError(
                f"{names[name]} tunes the oracle's comparison: it needs {names['oracle']} append|upsert:KEY"
            )
    return mode, key


def _check_kills(
    names: Mapping[str, str], kills: int, only_kills: Sequence[int] | None, minimise: bool
) -> tuple[int, ...] | None:
    only = None if only_kills is None else tuple(sorted(set(only_kills)))
    if only is not None and (not only or any(not 0 <= i < kills for i in only)):
        given = ",".join(map(str, only_kills or ()))
        raise ConfigError(
            f"{names['only_kills']} {given}: kill numbers from 0 to {kills - 1} ({names['kills']} {kills}), "
            "at least one"
        )
    if minimise and (len(only) if only is not None else kills) < 2:
        raise ConfigError(f"{names['minimise']} drops kills one at a time: it needs at least 2 ({names['kills']})")
    return only
