"""What a chaos run was asked to do: the pipeline or the user's job, its sink kind, the faults, the workload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.toolkit.chaos import kinds

PIPELINES = ("2pc", "upsert", "stateful")


SINK_KINDS = ("2pc", "upsert", "foreachbatch", "other", "kafka", "kafka-partition")


KAFKA_SINK_KINDS = {"kafka": "batch", "kafka-partition": "partition"}  # the kafka-eos sink's visibility by kind


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
    workload: list[Any] | None = None  # the user's records, loaded by run()
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
        return kinds.parse_faults(self.faults)

    @property
    def kafka_sink(self) -> bool:
        """The user's job writes with the kafka-eos sink into the run's topic (``job.out_topic``)."""
        return bool(self.app) and self.sink_kind in KAFKA_SINK_KINDS


def dead_letters_of(cfg: ChaosConfig, table: str) -> str | None:
    """The job sink's dead letters for the run writing ``table``: its ``errors.table`` (a Kafka sink job:
    its ``errors.topic``), ``{table}`` replaced."""
    return cfg.dead_letters.replace("{table}", table) if cfg.dead_letters else None
