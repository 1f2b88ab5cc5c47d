"""Spark's task context: one reader (eos_core.spark_task) for both sinks and the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark import TaskContext

from eos_core import spark_task
from eos_core.spark_task import TaskIdentity, task_identity

ROOT = Path(__file__).resolve().parent.parent


class _FakeContext:
    """What PySpark's TaskContext answers in a task (its local properties: the job's)."""

    def __init__(self, **props: str) -> None:
        self.props = props

    def partitionId(self) -> int:  # PySpark's names
        return 3

    def attemptNumber(self) -> int:
        return 1

    def taskAttemptId(self) -> int:
        return 42

    def getLocalProperty(self, key: str) -> str | None:
        return self.props.get(key)


def test_outside_a_task_it_is_partition_0_first_attempt_no_batch() -> None:
    assert TaskContext.get() is None
    assert task_identity() == TaskIdentity(0, 0, 0, None, None, None)


@pytest.mark.parametrize(
    ("props", "batch", "query", "run"),
    [
        ({"streaming.sql.batchId": "7", "sql.streaming.queryId": "q", "spark.jobGroup.id": "r"}, 7, "q", "r"),
        ({"streaming.sql.batchId": "", "sql.streaming.queryId": "", "spark.jobGroup.id": ""}, None, None, None),
        ({}, None, None, None),  # a batch job: no micro-batch, no query
    ],
)
def test_in_a_task_it_reads_partition_attempts_and_batch(
    monkeypatch: pytest.MonkeyPatch, props: dict[str, str], batch: int | None, query: str | None, run: str | None
) -> None:
    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: _FakeContext(**props)))
    assert task_identity() == TaskIdentity(
        partition=3, attempt=1, task_attempt=42, stream_batch=batch, query_id=query, run_id=run
    )


def test_the_source_labels_its_fault_points_with_the_batch_as_spark_spells_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from sources.kafka import reader

    assert reader._batch_id() is None
    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: _FakeContext(**{"streaming.sql.batchId": "2"})))
    assert reader._batch_id() == "2"  # the fault log's batch of a source point is a string


def test_nothing_else_in_the_wheel_reads_the_task_context() -> None:
    readers = sorted(
        str(p.relative_to(ROOT))
        for top in ("connectors", "eos_core", "sources", "sinks")
        for p in (ROOT / top).rglob("*.py")
        if re.search(r"\bTaskContext\b", p.read_text())
    )
    assert readers == [str(Path(spark_task.__file__).relative_to(ROOT))]
