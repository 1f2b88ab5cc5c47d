"""``error_cause``: the one line that says why, out of Spark's wrapping (issue 32 item 9)."""

from __future__ import annotations

import json

from eos_core.errors import ConfigError, FatalError, error_cause

WRAPPED = """[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_DATA_SOURCE_ERROR] Failed to
plan Python data source `postgres-2pc` in batch write: Traceback (most recent call last):
  File "/x/worker.py", line 10, in main
    raise ConfigError(...)
eos_core.errors.ConfigError: postgres-2pc: option 'sink.id' is required; give each query its own id
\tat org.apache.spark.sql.execution.python.PythonPlannerRunner.runInPython(PythonPlannerRunner.scala:191)
\tat org.apache.spark.sql.execution.streaming.MicroBatchExecution.runBatch(MicroBatchExecution.scala:1)
"""


class CapturedLike(Exception):
    def __init__(self, desc: str) -> None:
        super().__init__(desc)
        self.desc = desc


def test_our_line_is_found_in_the_wrapped_text() -> None:
    assert error_cause(CapturedLike(WRAPPED)) == (
        "ConfigError: postgres-2pc: option 'sink.id' is required; give each query its own id"
    )
    assert error_cause(WRAPPED).startswith("ConfigError: postgres-2pc:")


def test_our_error_as_such_or_as_a_cause() -> None:
    assert error_cause(FatalError("sink id 'x'\n  belongs to q")) == "FatalError: sink id 'x' belongs to q"
    try:
        try:
            raise ConfigError("bad 'table'")
        except ConfigError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert error_cause(outer) == "ConfigError: bad 'table'"


def test_anything_else_is_its_type_and_first_line_without_sparks_class() -> None:
    assert error_cause(CapturedLike("[TABLE_OR_VIEW_NOT_FOUND] The table x cannot be found.\nmore")) == (
        "CapturedLike: The table x cannot be found."
    )
    assert error_cause(KeyError("id")) == "KeyError: 'id'"


def test_spark_eos_run_prints_the_cause_not_the_wrapping(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """``spark-eos run``: the give-up line and the log's ``error`` field are our line, the rest is ``detail``."""
    import io

    from connectors.pipelines import parse_config, supervisor
    from tests.test_cli import GOOD, _FakeQuery

    monkeypatch.setattr(supervisor, "prepare", lambda cfg: None)
    monkeypatch.setattr(supervisor, "session", lambda cfg: type("S", (), {"stop": lambda self: None})())
    monkeypatch.setattr(supervisor, "start", lambda spark, cfg: _FakeQuery(CapturedLike(WRAPPED)))
    out = io.StringIO()
    cfg = parse_config({**GOOD, "restart": {"strategy": "none"}})
    assert supervisor.run(cfg, log=supervisor.Log("json", out=out, live=False)) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        "gives up: ConfigError: postgres-2pc: option 'sink.id' is required; give each query its own id"
    )
    failed = [json.loads(x) for x in out.getvalue().splitlines() if '"pipeline.failed"' in x]
    assert (
        failed
        and failed[0]["error"].startswith("ConfigError: postgres-2pc")
        and "PythonPlannerRunner" in failed[0]["detail"]
    )


def test_a_subclass_of_ours_is_found_by_its_module_path() -> None:
    # a connector's own error class (a FatalError subclass) raised in a Python worker reaches the driver as
    # text: its traceback's last line names it by module path
    text = (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: Traceback (most recent call last):\n"
        '  File "/x/sinks/kafka/plan.py", line 1, in meet_marker\n'
        "sinks.kafka.plan.LineageMismatch: kafka-eos sink 's': task slot 0 already wrote batch 4\n"
        "\tat org.apache.spark.sql.errors.QueryCompilationErrors$.pythonDataSourceError(QueryCompilationErrors.scala:1)"
    )
    assert error_cause(text) == "LineageMismatch: kafka-eos sink 's': task slot 0 already wrote batch 4"
    assert error_cause("pyspark.errors.exceptions.base.PySparkValueError: [X] not ours") == "not ours"


PRIVILEGE = """[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: Traceback (most recent call last):
  File "/x/sinks/postgres/twophase/spark.py", line 88, in writer
    return TwoPhaseBatchWriter(self.options, schema)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/x/sinks/postgres/twophase/decisions.py", line 247, in ensure
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
  File "/x/.venv/lib/python3.11/site-packages/psycopg/connection.py", line 304, in execute
    raise ex.with_traceback(None)
psycopg.errors.InsufficientPrivilege: permission denied for database postgres
 SQLSTATE: 38000
\tat org.apache.spark.sql.errors.QueryCompilationErrors$.pythonDataSourceError(QueryCompilationErrors.scala:1)
"""


def test_a_driver_error_not_ours_is_the_line_its_traceback_ends_with() -> None:
    """Issue 44, finding 3: a Postgres refusal in a data source's writer gave 'Traceback (most recent call
    last):', the line Spark's wrapping ends with, instead of the cause (the text as Spark 4 wrapped it)."""
    assert error_cause(CapturedLike(PRIVILEGE)) == (
        "psycopg.errors.InsufficientPrivilege: permission denied for database postgres"
    )
    java = (
        "org.apache.spark.SparkException: Job aborted.\n\tat x.y(Z.scala:1)\n"
        "Caused by: org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access topics: [t]\n"
        "\tat a.b(C.java:2)"
    )
    assert error_cause(java) == (
        "org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access topics: [t]"
    )
    bare = (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: Traceback (most recent call last):"
    )
    assert "Traceback" not in error_cause(CapturedLike(bare))
