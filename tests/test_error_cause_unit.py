"""``error_cause``: the one line that says why, out of Spark's wrapping (issue 32 item 9)."""

from __future__ import annotations

from connectors.core.errors import ConfigError, FatalError, error_cause

WRAPPED = """[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_DATA_SOURCE_ERROR] Failed to
plan Python data source `postgres-2pc` in batch write: Traceback (most recent call last):
  File "/x/worker.py", line 10, in main
    raise ConfigError(...)
connectors.core.errors.ConfigError: postgres-2pc: option 'sink.id' is required; give each query its own id
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
