"""Reference pipelines (``ledger``, ``balances``, ``transfers``): each builds its query from a ``PipelineConfig``.

from connectors.pipelines import load_config, prepare, session, start
cfg = load_config("configs/ledger.toml")
prepare(cfg)                      # create the target table (transfers: the topics) if missing
spark = session(cfg)              # local[*] by default; RocksDB state store, our formats
query = start(spark, cfg)
query.awaitTermination()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from connectors.pipelines.config import PIPELINE_NAMES, PipelineConfig, load_config, parse_config, parse_trigger

__all__ = [
    "PIPELINE_NAMES",
    "PipelineConfig",
    "builder",
    "load_config",
    "parse_config",
    "prepare",
    "require_extras",
    "session",
    "start",
    "table_ddl",
]


def builder(name: str) -> Callable[[Any, PipelineConfig], Any]:
    """The ``build(spark, cfg) -> DataStreamWriter`` function of pipeline ``name``."""
    if name == "ledger":
        from connectors.pipelines.ledger import build

        return build
    if name == "balances":
        from connectors.pipelines.balances import build as build_balances

        return build_balances
    if name == "transfers":
        from connectors.pipelines.transfers import build as build_transfers

        return build_transfers
    raise KeyError(f"unknown pipeline {name!r}; expected one of {', '.join(PIPELINE_NAMES)}")


def table_ddl(cfg: PipelineConfig) -> str:
    from connectors.pipelines import balances, ledger

    if cfg.pipeline not in ("ledger", "balances"):
        raise KeyError(f"pipeline {cfg.pipeline!r} writes to Kafka: it has no table")
    return ledger.ddl(cfg.table) if cfg.pipeline == "ledger" else balances.ddl(cfg.table)


def prepare(cfg: PipelineConfig) -> None:
    """Create the pipeline's target table when it does not exist (idempotent); with malformed =
    "dead-letter", check that it refuses malformed events' rows (else they would land in it).
    ``transfers``: create its output and dead-letter topics when missing (idempotent)."""
    if cfg.pipeline == "transfers":
        from connectors.pipelines import transfers

        transfers.prepare(cfg)
        return
    import psycopg

    from connectors.pipelines.ledger import MALFORMED_COLUMN
    from eos_core.errors import ConfigError
    from sinks.postgres.connection import ddl_lock

    with psycopg.connect(cfg.dsn, autocommit=True, connect_timeout=15) as conn, ddl_lock(conn):
        conn.execute(table_ddl(cfg))
        if cfg.dead_letter_table is None:
            return
        guarded = conn.execute(
            "SELECT 1 FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c' "
            "AND pg_get_constraintdef(oid) = 'CHECK ((malformed IS NULL))'",
            (cfg.table,),
        ).fetchone()
        if guarded is None:
            check = MALFORMED_COLUMN.split(" ", 2)[2]
            raise ConfigError(
                f"{cfg.pipeline}: table {cfg.table} has a 'malformed' column without {check}, so malformed events "
                f"would land in it instead of the dead-letter table ({cfg.pipeline}.malformed = 'dead-letter'); add "
                f"it: ALTER TABLE {cfg.table} ADD {check}",
                option=f"{cfg.pipeline}.malformed",
            )


def session(cfg: PipelineConfig) -> Any:
    """A SparkSession for ``cfg``: its master, the RocksDB state store with changelog checkpoints.

    Under ``spark-submit`` with no ``spark.master`` in the config, submit's ``--master`` holds. On this
    machine (``local``, ``local-cluster``) executors run the driver's interpreter and import the
    package from where the driver does; on a cluster they run the environment the user ships
    (``spark.archives`` with ``PYSPARK_PYTHON``; docs/deployment.md), never the driver's paths.
    """
    from connectors.pipelines.balances import STATE_CONF
    from connectors.services.spark import local_session

    master = effective_master(cfg)
    on_this_machine = master is not None and master.startswith("local")
    # Spark otherwise binds to the first non-loopback interface; spark-eos runs on loopback unless told
    if on_this_machine:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf: dict[str, Any] = {**STATE_CONF, "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions)}
    if on_this_machine:  # executors (local-cluster) import this package from the same place as the driver
        conf["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    conf.update(cfg.spark_conf)
    if cfg.pipeline == "balances":
        # transformWithState in ProcessingTime mode asks for a no-data batch after every batch, so an
        # available-now query never ends; TTL is still honoured (expired state reads as absent)
        conf.setdefault("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    if master is not None and master.startswith("local-cluster"):
        conf.setdefault("spark.executor.memory", "512m")
    return local_session(cfg.app_name or f"spark-eos-{cfg.pipeline}", master, same_python=on_this_machine, **conf)


def effective_master(cfg: PipelineConfig) -> str | None:
    """The config's master; else, under spark-submit, None (submit's ``--master``); else ``local[*]``."""
    if cfg.master:
        return cfg.master
    return None if os.environ.get("PYSPARK_GATEWAY_PORT") else "local[*]"


def start(spark: Any, cfg: PipelineConfig) -> Any:
    """Build and start the pipeline's streaming query (checkpoint and trigger from ``cfg``)."""
    writer = builder(cfg.pipeline)(spark, cfg).option("checkpointLocation", cfg.checkpoint)
    kind, seconds = parse_trigger(cfg.trigger)
    writer = (
        writer.trigger(availableNow=True)
        if kind == "available-now"
        else writer.trigger(processingTime=f"{int(seconds * 1000)} milliseconds")
    )
    return writer.queryName(cfg.app_name or f"{cfg.pipeline}_{cfg.effective_sink_id}").start()


EXTRAS = {"yaml": "pyyaml", "google.protobuf": "protobuf", "grpc": "grpcio"}


def require_extras() -> None:
    """The reference pipelines (and the demo) need the ``pipelines`` extra; say so before anything starts."""
    import importlib.util

    missing = [pkg for module, pkg in EXTRAS.items() if importlib.util.find_spec(module) is None]
    if missing:
        from eos_core.errors import ConfigError

        raise ConfigError(
            f"the reference pipelines need {', '.join(missing)}, which the connectors themselves do not: "
            "pip install 'spark-eos[pipelines]'",
            option="pipelines",
        )
