"""Run a user's streaming job under the chaos toolkit: one process, one query, killed from outside.

    python -m connectors.toolkit.app_runner --app mymodule:build --bootstrap HOST:PORT --topic T --dsn URL \
        --table TBL --checkpoint DIR [--trigger available-now|processing:SECONDS] [--max-offsets N]

The user's module names a function that builds the query, not started::

    from connectors.toolkit.app_runner import Job

    def build(spark, job: Job):
        return (spark.readStream.format("kafka-eos")
                .option("kafka.bootstrap.servers", job.bootstrap).option("subscribe", job.topic)
                .option("maxOffsetsPerTrigger", job.max_offsets).load()
                ...                                   # the job's own transformation
                .writeStream.format("postgres-2pc").option("dsn", job.dsn)
                .option("table", job.table).option("sink.id", job.sink_id))

The runner sets ``checkpointLocation`` and the trigger (the chaos run needs both: it restarts the
query from the checkpoint after each kill and drains the topic with ``availableNow`` at the end).
An optional ``setup(job)`` in the same module runs before each start (make it idempotent: e.g.
``CREATE TABLE IF NOT EXISTS``). The records in ``job.topic`` are JSON objects written by the
chaos producer (``{"id", "key", "amount"}``) unless the run names the user's own records
(``--generator`` / ``--records-file`` of ``spark-eos chaos``): then they are the user's, and a record
whose ``topic`` is ``orders`` is in ``job.topic_named("orders")`` (``job.topics``, for joins). A
reference run (``--oracle``) calls the same ``setup`` and ``build`` with ``job.table`` set to the
reference table (``<table>_ref1``): derive every name the job writes from ``job.table``.
Every ``foreachBatch`` function the job sets runs between two fault points (``pipeline.batch``
before it, ``sink.after_commit`` after it returned, before Spark's commit; ``batch=`` the batch id),
which ``--sink-kind foreachbatch`` kills at.

Exit code 0 when the query ended (availableNow drained the topic), 2 when it failed (the error is
printed last on stderr after ``RUNNER FAILED:``), 3 on ``--timeout``. ``RUNNER STARTED`` on stdout
tells the chaos loop that the query runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eos_core import faults

__all__ = [
    "Job",
    "build_parser",
    "executor_env",
    "load_app",
    "main",
    "mark_process_group",
    "serve",
    "sink_id_of",
    "with_trigger",
]


@dataclass(frozen=True)
class Job:
    """What a chaos run hands the user's ``build(spark, job)``: where to read and where to write."""

    bootstrap: str
    topic: str
    dsn: str
    table: str
    max_offsets: int = 1000
    options: dict[str, str] = field(default_factory=dict)  # --option key=value, for the job's own use
    topics: dict[str, str] = field(default_factory=dict)  # the run's other topics by the records' names
    checkpoint: str = ""  # the query's checkpoint location (connectors.twopc_batch needs it as checkpointLocation)

    def topic_named(self, name: str) -> str:
        """The run's topic for the records whose ``topic`` is ``name`` ("" or absent: ``self.topic``)."""
        if not name:
            return self.topic
        if name not in self.topics:
            raise KeyError(f"no topic named {name!r} in this run: the records name {sorted(self.topics) or 'none'}")
        return self.topics[name]

    @property
    def sink_id(self) -> str:
        """A ``postgres-2pc`` sink id unique to this run (see ``sink_id_of``)."""
        return sink_id_of(self.table)


def sink_id_of(table: str) -> str:
    """The sink id a chaos run gives the job writing ``table`` (the table name, dots replaced)."""
    return table.replace(".", "_")


def load_app(spec: str) -> tuple[Callable[..., Any], Callable[[Job], Any] | None]:
    """``module:function`` -> (the build function, the module's optional ``setup``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"--app {spec!r}: expected module:function, e.g. myjob:build")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(
            f"--app {spec!r}: cannot import {module_name!r} ({exc}); run from the directory that holds it or "
            "put it on PYTHONPATH"
        ) from exc
    build = getattr(module, attr, None)
    if not callable(build):
        raise SystemExit(f"--app {spec!r}: {module_name} has no function {attr!r}")
    setup = getattr(module, "setup", None)
    return build, setup if callable(setup) else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m connectors.toolkit.app_runner", description=__doc__.split("\n")[0])
    p.add_argument("--app", required=True, help="module:function that builds the query (not started)")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-offsets", type=int, default=1000)
    p.add_argument("--trigger", default="available-now", help="available-now | processing:SECONDS")
    p.add_argument("--master", default="local[2,2]")
    p.add_argument("--timeout", type=float, default=600.0, help="give up (exit 3) after this many seconds")
    p.add_argument("--option", action="append", default=[], help="key=value handed to the job (repeatable)")
    p.add_argument(
        "--topics", action="append", default=[], help="name=topic: the run's topic of that name (repeatable)"
    )
    p.add_argument("--conf", action="append", default=[], help="key=value: a Spark setting of the session (repeatable)")
    return p


FAULT_ENV = (faults.ENV_SPEC, faults.ENV_STATE, faults.ENV_LOG, faults.ENV_PGID)


def executor_env(master: str) -> dict[str, str]:
    """What executors need from the driver's environment on a master whose executors are not its
    children (a standalone cluster): the fault spec, its state and log, and the job's process group
    (a ``kill-group`` point in a task then takes the driver down too, as on a local master), as
    ``spark.executorEnv.*`` settings. On a local master the executors inherit the environment."""
    if master.startswith("local"):
        return {}
    return {f"spark.executorEnv.{k}": os.environ[k] for k in FAULT_ENV if os.environ.get(k)}


def _spark(master: str, conf: dict[str, str] | None = None) -> Any:
    # On a local master the Python workers run on this machine: unless the user chose their interpreter,
    # they run this one, which has spark-eos (python3 on PATH may not; the chaos tool starts us with it)
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import connectors

    builder = (
        SparkSession.builder.master(master)
        .appName("eos-chaos-app")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
    )
    for key, value in {**executor_env(master), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    connectors.register(spark)
    return spark


def mark_process_group() -> None:
    """Call first, before Spark starts: kill-group fault points then know the job's process group.

    Executor Python workers live in PySpark's daemon's own process group; the variable is inherited
    by the JVM and every worker it starts (so it must be set before the JVM starts).
    """
    os.environ[faults.ENV_PGID] = str(os.getpgrp())


def serve(start: Callable[[], Any], timeout: float) -> int:
    """Start the query (``start()``), wait for its end; the exit code and the markers the chaos loop reads.

    0 when it ended (availableNow drained), 2 when it failed (``RUNNER FAILED:`` + the error, last on
    stderr), 3 after ``timeout`` seconds. ``RUNNER STARTED`` on stdout once it runs.
    """
    started = time.monotonic()
    try:
        query = start()
        print(f"RUNNER STARTED pid={os.getpid()} query={query.id}", flush=True)
        if not query.awaitTermination(timeout):
            print(
                f"RUNNER STACKS of the query still running after {timeout}s:\n{_stacks()}", file=sys.stderr, flush=True
            )
            query.stop()
            print(f"RUNNER TIMEOUT after {timeout}s", file=sys.stderr, flush=True)
            return 3
        if query.exception() is not None:
            raise query.exception()
    except Exception as exc:
        msg = str(exc).replace("\n", " ")[:4000]
        print(f"RUNNER FAILED: {type(exc).__name__}: {msg}", file=sys.stderr, flush=True)
        return 2
    print(f"RUNNER DONE in {time.monotonic() - started:.1f}s", flush=True)
    return 0


def _stacks() -> str:
    """Where a query that outlived its timeout is: the JVM's stream execution threads (what a hang's report
    needs; the process's own Python thread only waits in awaitTermination). Never raises."""
    lines: list[str] = []
    try:
        from pyspark import SparkContext

        traces = SparkContext._jvm.java.lang.Thread.getAllStackTraces()  # type: ignore[union-attr]
        for thread in traces.keySet().toArray():
            if str(thread.getName()).startswith("stream execution"):
                lines.append(f"JVM thread {thread.getName()!r} ({thread.getState()}):")
                lines += [f"    at {frame}" for frame in list(traces.get(thread))[:30]]
    except Exception as exc:  # the JVM may be the thing that hangs
        lines.append(f"(no JVM stacks: {type(exc).__name__}: {exc})")
    return "\n".join(lines) or "(no stream execution thread)"


def foreach_batch_with_fault_points(func: Callable[[Any, int], Any]) -> Callable[[Any, int], None]:
    """The user's foreachBatch function between two fault points, on the driver: ``pipeline.batch``
    before it runs and ``sink.after_commit`` after it returned, before Spark writes ``commits/n``
    (the moment a non-idempotent foreachBatch write is replayed). Both carry ``batch=batch_id``."""

    def run_batch(df: Any, batch_id: int) -> None:
        faults.point("pipeline.batch", batch=batch_id)
        func(df, batch_id)
        faults.point("sink.after_commit", batch=batch_id)

    run_batch.__name__ = getattr(func, "__name__", "foreach_batch")
    return run_batch


def _wrap_foreach_batch() -> None:
    """Every ``foreachBatch`` the user's ``build`` sets gets the fault points (this process only)."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    original = DataStreamWriter.foreachBatch
    if getattr(original, "_eos_wrapped", False):
        return

    def foreachBatch(self: Any, func: Callable[[Any, int], Any]) -> Any:  # Spark's name
        return original(self, foreach_batch_with_fault_points(func))

    foreachBatch._eos_wrapped = True  # type: ignore[attr-defined]
    DataStreamWriter.foreachBatch = foreachBatch  # type: ignore[method-assign]


def with_trigger(writer: Any, trigger: str) -> Any:
    """``available-now`` or ``processing:SECONDS`` applied to a DataStreamWriter."""
    if trigger == "available-now":
        return writer.trigger(availableNow=True)
    if trigger.startswith("processing:"):
        return writer.trigger(processingTime=f"{float(trigger.split(':', 1)[1])} seconds")
    raise SystemExit(f"--trigger {trigger!r}: expected available-now or processing:SECONDS")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag, given in (("--option", args.option), ("--topics", args.topics), ("--conf", args.conf)):
        bad = [kv for kv in given if "=" not in kv]
        if bad:
            raise SystemExit(f"{flag} {bad[0]!r}: expected key=value")
    options = dict(kv.split("=", 1) for kv in args.option)
    conf = dict(kv.split("=", 1) for kv in args.conf)
    topics = dict(kv.split("=", 1) for kv in args.topics)
    mark_process_group()  # only once the job will run: a refusal leaves the caller's environment alone
    job = Job(args.bootstrap, args.topic, args.dsn, args.table, args.max_offsets, options, topics, args.checkpoint)
    build, setup = load_app(args.app)

    def start() -> Any:
        if setup is not None:
            setup(job)
        spark = _spark(args.master, conf)
        _wrap_foreach_batch()
        writer = build(spark, job)
        if not hasattr(writer, "start") or not hasattr(writer, "trigger"):
            raise TypeError(
                f"{args.app} returned {type(writer).__name__}; it must return the query's DataStreamWriter "
                "(df.writeStream...), not started: the runner sets the checkpoint and the trigger"
            )
        return with_trigger(writer.option("checkpointLocation", args.checkpoint), args.trigger).start()

    return serve(start, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
