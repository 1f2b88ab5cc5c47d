"""Pipeline configuration: a TOML or YAML file -> a checked, frozen ``PipelineConfig``.

Example (TOML; YAML takes the same keys)::

    pipeline = "ledger"                 # or "balances", "transfers"

    [source]
    bootstrap = "${EOS_KAFKA_BOOTSTRAP}"  # ${VAR} and ${VAR:-default} are expanded
    kafka_config = "app.properties"     # the cluster's security settings (a Java client properties file:
                                        # security.protocol, sasl.*, ssl.*), for every Kafka client of the
                                        # pipeline; default: the file EOS_KAFKA_CONFIG names (spark-eos run
                                        # --kafka-config), else none (a plaintext cluster)
    topic = "payments"
    starting_offsets = "earliest"
    max_offsets_per_trigger = 1000

    [sink]
    dsn = "${EOS_POSTGRES_DSN}"
    table = "ledger"
    sink_id = "ledger"                 # ledger only: names the 2PC sink; unique per query

    [spark]
    master = "local[*]"
    trigger = "5s"                     # a processing-time interval, or "available-now"
    checkpoint = "./checkpoints/ledger"
    shuffle_partitions = 2
    conf = { "spark.sql.streaming.minBatchesToRetain" = "20" }

    [restart]
    strategy = "fixed-delay:3:10s"

    [ledger]                           # (the same two keys under [balances])
    malformed = "dead-letter"          # or "fail": stop with an error naming the record
    dead_letters = "ledger_dead_letters"  # the dead-letter table (default: <sink.table>_dead_letters)

    [balances]
    ttl = "7d"                         # idle accounts' state expires (processing time)
    last_n = 10                        # events kept per account in ListState

The ``transfers`` pipeline writes to Kafka, not Postgres: its ``[sink]`` takes ``topic`` (the output
topic), ``sink_id`` and ``options`` (``kafka-eos`` sink options), and no ``dsn`` or ``table``::

    [sink]
    topic = "transfers"
    sink_id = "transfers"

    [transfers]
    malformed = "dead-letter"          # or "fail"
    dead_letters = "transfers-dead-letters"  # the dead-letter topic (default: <sink.topic>-dead-letters)
    partitions = 0                     # of the topics prepare() creates; 0: as many as source.topic has
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.pipelines.restart import parse_strategy
from eos_core.conninfo import redact_dsn
from eos_core.errors import ConfigError
from eos_core.kafka_config import CONFIG_ENV, kafka_options, redact_options
from eos_core.options import parse_duration

__all__ = ["PIPELINE_NAMES", "PipelineConfig", "load_config", "parse_config", "parse_trigger"]

PIPELINE_NAMES = ("ledger", "balances", "transfers")
MALFORMED = ("dead-letter", "fail")
KAFKA_SINKS = ("transfers",)
"""Pipelines that write to Kafka (sink.topic) rather than Postgres (sink.dsn, sink.table)."""
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")

_SECTIONS: dict[str, set[str]] = {
    "source": {"bootstrap", "kafka_config", "topic", "starting_offsets", "max_offsets_per_trigger", "options"},
    "sink": {"dsn", "table", "topic", "sink_id", "options"},
    "spark": {"master", "trigger", "checkpoint", "shuffle_partitions", "conf", "app_name"},
    "restart": {"strategy"},
    "ledger": {"malformed", "dead_letters"},
    "balances": {"ttl", "last_n", "malformed", "dead_letters"},
    "transfers": {"malformed", "dead_letters", "partitions"},
    "log": {"format", "progress"},
}
_TOP = {"pipeline", *_SECTIONS}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class PipelineConfig:
    """Everything a reference pipeline needs; built by ``parse_config`` or directly in code."""

    pipeline: str
    bootstrap: str
    topic: str
    dsn: str = ""  # ledger, balances: required
    table: str = ""  # ledger, balances: required
    checkpoint: str = ""  # required
    sink_id: str = ""
    sink_topic: str = ""  # transfers: the output topic (sink.topic), required
    topic_partitions: int = 0  # transfers: partitions of the topics prepare() creates; 0: the source topic's
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 1000
    source_options: Mapping[str, str] = field(default_factory=dict)
    sink_options: Mapping[str, str] = field(default_factory=dict)
    kafka_config: str = ""  # a Java client properties file: the security settings of every Kafka client
    master: str = ""  # "": spark-submit's --master, else local[*] (pipelines.effective_master)
    trigger: str = "5s"
    shuffle_partitions: int = 2
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = ""
    restart: str = "none"
    malformed: str = "dead-letter"  # a malformed event: "dead-letter" (to dead_letter_table) or "fail" (stop)
    dead_letters: str = ""  # "": <table>_dead_letters
    ttl_seconds: float = 7 * 24 * 3600.0
    last_n: int = 10
    log_format: str = "text"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.pipeline not in PIPELINE_NAMES:
            raise ConfigError(
                f"pipeline {self.pipeline!r} is unknown; expected one of {', '.join(PIPELINE_NAMES)}", option="pipeline"
            )
        to_kafka = self.pipeline in KAFKA_SINKS
        sink_keys = (("sink_topic", "sink.topic"),) if to_kafka else (("dsn", "sink.dsn"), ("table", "sink.table"))
        for name, where in (
            ("bootstrap", "source.bootstrap"),
            ("topic", "source.topic"),
            *sink_keys,
            ("checkpoint", "spark.checkpoint"),
        ):
            if not str(getattr(self, name) or "").strip():
                raise ConfigError(f"config: '{where}' is required and empty", option=where)
        foreign = (("dsn", "sink.dsn"), ("table", "sink.table")) if to_kafka else (("sink_topic", "sink.topic"),)
        for name, where in foreign:
            if str(getattr(self, name) or "").strip():
                writes = "to Kafka: set sink.topic" if to_kafka else "to Postgres: set sink.dsn and sink.table"
                raise ConfigError(
                    f"config: '{where}' does not apply to pipeline {self.pipeline!r} (it writes {writes}); remove it",
                    option=where,
                )
        if to_kafka:
            self._check_topics()
        if self.kafka_config:
            self.kafka_options  # a file that cannot be read is refused here, naming it  # noqa: B018
        parse_trigger(self.trigger)
        parse_strategy(self.restart)
        if self.malformed not in MALFORMED:
            raise ConfigError(
                f"config: {self.pipeline}.malformed = {self.malformed!r}; expected 'dead-letter' (the event goes to "
                "the dead-letter table, in the batch's transaction, with its topic, partition, offset and value) or "
                "'fail' (the query stops with an error naming the record); nothing is ever dropped",
                option=f"{self.pipeline}.malformed",
            )
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ConfigError(
                "config: source.max_offsets_per_trigger must be >= 1", option="source.max_offsets_per_trigger"
            )
        if self.shuffle_partitions < 1:
            raise ConfigError("config: spark.shuffle_partitions must be >= 1", option="spark.shuffle_partitions")
        if self.ttl_seconds <= 0:
            raise ConfigError("config: balances.ttl must be > 0", option="balances.ttl")
        if self.last_n < 1:
            raise ConfigError("config: balances.last_n must be >= 1", option="balances.last_n")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"config: log.format {self.log_format!r}; expected text or json", option="log.format")

    @property
    def kafka_options(self) -> dict[str, str]:
        """The ``kafka.*`` options of the pipeline's source and Kafka sink: the bootstrap and ``kafka_config``'s
        settings (``source.options`` / ``sink.options`` given beside them win)."""
        try:
            return kafka_options(self.bootstrap, self.kafka_config)
        except ConfigError as exc:
            raise ConfigError(f"config: 'source.kafka_config': {exc}", option="source.kafka_config") from None

    def _check_topics(self) -> None:
        """transfers: the output and dead-letter topics are Kafka topic names, distinct from each other and
        from the source topic; the rows choose their topic, so no sink option may override it."""
        named = [("sink.topic", self.sink_topic)]
        if self.dead_letter_topic is not None:
            named.append((f"{self.pipeline}.dead_letters", self.dead_letter_topic))
        for where, name in named:
            if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
                raise ConfigError(
                    f"config: '{where}' = {name!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; at "
                    "most 249)",
                    option=where,
                )
            if name == self.topic:
                raise ConfigError(
                    f"config: '{where}' = {name!r} is source.topic too: the pipeline would read what it writes; "
                    "name another topic",
                    option=where,
                )
        if self.dead_letter_topic == self.sink_topic:
            raise ConfigError(
                f"config: '{self.pipeline}.dead_letters' = {self.sink_topic!r} is sink.topic too: malformed events "
                "would land among the good ones; name another topic",
                option=f"{self.pipeline}.dead_letters",
            )
        if "topic" in self.sink_options:
            raise ConfigError(
                "config: 'sink.options.topic' would send every row, malformed events too, to one topic; set "
                "sink.topic (and transfers.dead_letters) instead",
                option="sink.options.topic",
            )
        if self.topic_partitions < 0:
            raise ConfigError(
                f"config: {self.pipeline}.partitions must be >= 0 (0: as many as source.topic has)",
                option=f"{self.pipeline}.partitions",
            )

    @property
    def dead_letter_table(self) -> str | None:
        """Where malformed events go in Postgres (None: malformed=fail, or a pipeline writing to Kafka)."""
        if self.malformed != "dead-letter" or self.pipeline in KAFKA_SINKS:
            return None
        return self.dead_letters or f"{self.table}_dead_letters"

    @property
    def dead_letter_topic(self) -> str | None:
        """transfers: the topic malformed events go to (None: malformed=fail, or a pipeline writing to Postgres)."""
        if self.malformed != "dead-letter" or self.pipeline not in KAFKA_SINKS:
            return None
        return self.dead_letters or f"{self.sink_topic}-dead-letters"

    @property
    def target(self) -> str:
        """What the pipeline writes: its table, or its output topic."""
        return self.sink_topic if self.pipeline in KAFKA_SINKS else self.table

    @property
    def effective_sink_id(self) -> str:
        return self.sink_id or re.sub(r"[^A-Za-z0-9_]", "_", self.target)

    def replace(self, **changes: Any) -> PipelineConfig:
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        """Every field; the DSN's password and the value of every secret option (source, sink, Spark) as ``***``."""
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "dsn":
                value = redact_dsn(value)
            elif f.name in ("source_options", "sink_options", "spark_conf"):
                value = redact_options(value)
            shown.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    __str__ = __repr__


def parse_trigger(text: str) -> tuple[str, float]:
    """``"available-now"`` -> ("available-now", 0); ``"5s"``/``"500ms"``/``"2"`` -> ("processing", seconds)."""
    raw = str(text).strip().lower()
    if raw in ("available-now", "availablenow", "available_now"):
        return "available-now", 0.0
    try:
        seconds = parse_duration(raw)
    except ValueError:
        raise ConfigError(
            f"config: spark.trigger {text!r} is neither 'available-now' nor an interval such as 500ms, 5s or 1m",
            option="spark.trigger",
        ) from None
    return "processing", seconds


def _expand(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            got = os.environ.get(name)
            if got is None or got == "":
                if default is None:
                    raise ConfigError(
                        f"config: '{where}' uses ${{{name}}} but the environment variable {name} is not set "
                        f"(set it, or write ${{{name}:-default}})",
                        option=where,
                    )
                return default
            return got

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}") for k, v in value.items()}
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"config: '{where}' must be a table/mapping of option = value", option=where)
    return {str(k): ("true" if v is True else "false" if v is False else str(v)) for k, v in value.items()}


def parse_config(data: Mapping[str, Any], *, pipeline: str | None = None, source: str = "config") -> PipelineConfig:
    """Check a parsed TOML/YAML mapping and build the config; ``pipeline`` is used when the file names none."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a table/mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; valid top-level keys: {', '.join(sorted(_TOP))}",
            option=unknown[0],
        )
    sections: dict[str, dict[str, Any]] = {}
    for section, keys in _SECTIONS.items():
        sec = data.get(section) or {}
        if not isinstance(sec, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table/mapping", option=section)
        bad = sorted(set(sec) - keys)
        if bad:
            raise ConfigError(
                f"{source}: unknown key(s) {', '.join(f'{section}.{b}' for b in bad)}; valid in [{section}]: "
                f"{', '.join(sorted(keys))}",
                option=f"{section}.{bad[0]}",
            )
        sections[section] = {k: _expand(v, f"{section}.{k}") for k, v in sec.items()}
    src, snk, spk = sections["source"], sections["sink"], sections["spark"]
    bal, log = sections["balances"], sections["log"]
    name: Any = data.get("pipeline") or pipeline
    if not name:
        raise ConfigError(f'{source}: no pipeline named (set pipeline = "ledger" or pass PIPELINE)', option="pipeline")
    to_kafka = str(name) in KAFKA_SINKS

    def typed(sec: str, key: str, kind: type, default: Any) -> Any:
        value = sections[sec].get(key, default)
        if value is None or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
            return value
        if kind is int and isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise ConfigError(f"{source}: '{sec}.{key}' must be {kind.__name__}, got {value!r}", option=f"{sec}.{key}")

    ttl_raw = bal.get("ttl", "7d")
    try:
        ttl = parse_duration(str(ttl_raw))
    except ValueError:
        raise ConfigError(
            f"{source}: 'balances.ttl' {ttl_raw!r} is not a duration (e.g. 30m, 7d)", option="balances.ttl"
        ) from None
    progress = log.get("progress", True)
    return PipelineConfig(
        pipeline=str(name),
        bootstrap=str(src.get("bootstrap") or os.environ.get("EOS_KAFKA_BOOTSTRAP", "")),
        topic=str(src.get("topic", "")),
        starting_offsets=str(src.get("starting_offsets", "earliest")),
        max_offsets_per_trigger=typed("source", "max_offsets_per_trigger", int, 1000),
        source_options=_str_map(src.get("options"), "source.options"),
        kafka_config=str(src.get("kafka_config") or os.environ.get(CONFIG_ENV, "")),
        # a pipeline writing to Kafka takes no Postgres from the environment (one in the file is refused)
        dsn=str(snk.get("dsn") or ("" if to_kafka else os.environ.get("EOS_POSTGRES_DSN", ""))),
        table=str(snk.get("table", "")),
        sink_id=str(snk.get("sink_id", "")),
        sink_topic=str(snk.get("topic", "")),
        topic_partitions=typed("transfers", "partitions", int, 0),
        sink_options=_str_map(snk.get("options"), "sink.options"),
        master=str(spk.get("master", "")),
        trigger=str(spk.get("trigger", "5s")),
        checkpoint=str(spk.get("checkpoint", "")),
        shuffle_partitions=typed("spark", "shuffle_partitions", int, 2),
        spark_conf=_str_map(spk.get("conf"), "spark.conf"),
        app_name=str(spk.get("app_name", "")),
        restart=str(sections["restart"].get("strategy", "none")),
        malformed=str(sections.get(str(name), {}).get("malformed", "dead-letter")),
        dead_letters=str(sections.get(str(name), {}).get("dead_letters", "")),
        ttl_seconds=ttl,
        last_n=typed("balances", "last_n", int, 10),
        log_format=str(log.get("format", "text")),
        progress=bool(progress) if isinstance(progress, bool) else str(progress).lower() in ("1", "true", "yes", "on"),
    )


def load_config(
    path: str, *, pipeline: str | None = None, overrides: Mapping[str, Any] | None = None
) -> PipelineConfig:
    """Read a ``.toml``, ``.yaml`` or ``.yml`` file and parse it; ``overrides`` replace fields afterwards."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist", option="--config")
    ext = os.path.splitext(path)[1].lower()
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        if ext == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(raw.decode("utf-8"))
        elif ext in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(raw) or {}
        else:
            raise ConfigError(
                f"config file {path!r}: unknown extension {ext!r}; use .toml, .yaml or .yml", option="--config"
            )
    except ConfigError:
        raise
    except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError: say where
        raise ConfigError(f"config file {path!r} is not valid {ext[1:].upper()}: {exc}", option="--config") from None
    cfg = parse_config(data, pipeline=pipeline, source=f"config {path}")
    return cfg.replace(**overrides) if overrides else cfg
