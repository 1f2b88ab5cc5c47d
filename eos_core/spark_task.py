"""Spark's task context as the connectors read it: which partition, attempt and micro-batch a task is.

The one reader of PySpark's ``TaskContext`` for the sinks and the source (``task_identity()``);
outside a Spark task (the driver, unit tests) it is partition 0, first attempt, no batch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TaskIdentity", "task_identity"]


@dataclass(frozen=True)
class TaskIdentity:
    """Who is running: from Spark's TaskContext on an executor."""

    partition: int = 0
    attempt: int = 0  # the attempt number of this partition's task
    task_attempt: int = 0  # Spark's task attempt id, unique in the application
    stream_batch: int | None = None  # streaming.sql.batchId (None in a batch job)
    query_id: str | None = None
    run_id: str | None = None  # Spark's run id of the streaming query (its job group)


def task_identity() -> TaskIdentity:
    """The running task's identity; ``TaskIdentity()`` outside a Spark task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # outside Spark (unit tests): one partition, first attempt
        return TaskIdentity()
    raw = ctx.getLocalProperty("streaming.sql.batchId")
    return TaskIdentity(
        partition=ctx.partitionId(),
        attempt=ctx.attemptNumber(),
        task_attempt=ctx.taskAttemptId(),
        stream_batch=int(raw) if raw not in (None, "") else None,
        query_id=ctx.getLocalProperty("sql.streaming.queryId") or None,
        run_id=ctx.getLocalProperty("spark.jobGroup.id") or None,
    )
