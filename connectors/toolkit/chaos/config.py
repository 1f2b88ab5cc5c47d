"""What a chaos run was asked to do: ``ChaosConfig``, as the front door (``inputs.prepare``) checked it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_FAULTS", "KAFKA_SINK_KINDS", "PIPELINES", "SINK_KINDS", "ChaosConfig"]

PIPELINES = ("2pc", "upsert", "stateful")
"""The reference pipelines ``--pipeline`` runs (``integration/harness/runner.py`` of a clone)."""

SINK_KINDS = ("2pc", "upsert", "foreachbatch", "other", "kafka", "kafka-partition")
"""What a user's job (``--app``) writes with: it picks the fault points and the checks."""

KAFKA_SINK_KINDS = {"kafka": "batch", "kafka-partition": "partition"}  # the kafka-eos sink's visibility by kind

DEFAULT_FAULTS: dict[str, int] = {"kill": 1, "fault-point": 1}  # what --faults draws when not given


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run, as asked: a reference ``pipeline`` (``PIPELINES``), or the user's job ``app``
    (``module:function``; ``pipeline`` is then ``"app"``) writing with ``sink_kind``; the seed's schedule of
    ``kills`` faults drawn with the weights ``faults`` (parsed, in ``kinds.KINDS`` order); the workload;
    the services (``bootstrap`` empty: the faults need a broker of the run's own; ``postgres_service``: the
    server spark-eos runs, which the Postgres server faults restart). ``inputs.prepare`` makes it from
    what the command line or the pytest plugin was given, every refusal behind it; what a run finds as it
    goes is its ``runs.RunState``."""

    pipeline: str
    kills: int
    seed: int
    records: int
    bootstrap: str
    dsn: str
    workdir: str
    # the job's Kafka client properties (its principal's); None: those of the toolkit's own clients
    # (EOS_KAFKA_CONFIG, --kafka-config), none on a broker of the run's own
    app_kafka_config: str | None = None
    partitions: int = 2
    max_offsets: int = 1000
    master: str = "local[2,2]"
    progress: bool = True
    timeout: float = 300.0  # for one run of the pipeline
    app: str | None = None  # module:function, see connectors.toolkit.app_runner
    sink_kind: str = "2pc"  # the job's sink: SINK_KINDS (2pc: decisions checked; kafka*: the topic checked)
    id_field: str = "id"  # the record field and table column that identify a record
    payload_fields: tuple[str, ...] = ()  # fields the table must hold unchanged
    dead_letters: str | None = None  # the job sink's errors.table ({table}: the run's table): rows count as delivered
    options: Mapping[str, str] = field(default_factory=dict)  # handed to the job (Job.options)
    # the workload: the user's generator (module:function, records(seed, n)) or file, else make_records
    generator: Any = None  # "module:function" or the function
    records_file: str | None = None
    # the oracle: "append" | "upsert" (then oracle_key), reference runs of the job without faults
    oracle: str | None = None
    oracle_key: tuple[str, ...] = ()
    tolerance: float = 0.0
    ignore_columns: tuple[str, ...] = ()
    reference_runs: int = 2
    only_kills: tuple[int, ...] | None = None  # run only these kills of the seed's schedule (--only-kills)
    faults: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_FAULTS))  # kind -> weight
    postgres_service: Any = None  # the PostgresService to restart/crash/stop (pg-restart, pg-crash, pg-stop)
    minimise: bool = False  # a failing run is re-run dropping kills one at a time
    report_dir: str | None = None  # where report.html and junit.xml go (None: none)
    connect: bool = False  # the job runs as a Spark Connect client of a server its run starts (app_runner --connect)
    # the records' values: JSON objects, or (avro) those objects in a Schema Registry's wire format, written with
    # ``schema`` (the schema's text) under <topic>-value of the registry at ``schema_registry``
    value_format: str = "json"
    schema: str | None = None
    schema_file: str | None = None  # where ``schema`` was read from (the reproduce command names it)
    schema_registry: str | None = None

    @property
    def planned(self) -> int:
        """How many kills this run makes (``only_kills`` of the seed's ``kills``)."""
        return self.kills if self.only_kills is None else len(self.only_kills)

    @property
    def points(self) -> str:
        """Whose fault points the kill schedule draws from (``schedule.fault_points``)."""
        return self.sink_kind if self.app else self.pipeline

    @property
    def kafka_sink(self) -> bool:
        """The user's job writes with the kafka-eos sink into the run's topic (``job.out_topic``)."""
        return bool(self.app) and self.sink_kind in KAFKA_SINK_KINDS

    @property
    def codec(self) -> Any:
        """The registry codec of ``value_format`` avro (``chaos.avro.RegistryCodec``), None for JSON: a new one
        per call (its clients are not shared between threads)."""
        if self.value_format != "avro" or not self.schema_registry:
            return None
        from connectors.toolkit.chaos.avro import RegistryCodec

        return RegistryCodec(self.schema_registry, self.schema)

    def dead_letters_for(self, table: str) -> str | None:
        """The job sink's dead letters for the run writing ``table``: its ``errors.table`` (a Kafka sink job:
        its ``errors.topic``), ``{table}`` replaced."""
        return self.dead_letters.replace("{table}", table) if self.dead_letters else None
