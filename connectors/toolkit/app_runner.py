"""Run a user's streaming job under the chaos toolkit: one process, one query, killed from outside.

    python -m connectors.toolkit.app_runner --app mymodule:build --bootstrap HOST:PORT --topic T --dsn URL \
        --table TBL --checkpoint DIR [--kafka-config FILE] [--trigger available-now|processing:SECONDS] \
        [--max-offsets N] [--out-topic T --visibility batch|partition]

The user's module names a function that builds the query, not started::

    from connectors.toolkit.app_runner import Job

    def build(spark, job: Job):
        return (spark.readStream.format("kafka-eos")
                .options(**job.kafka_options).option("subscribe", job.topic)
                .option("maxOffsetsPerTrigger", job.max_offsets).load()
                ...                                   # the job's own transformation
                .writeStream.format("postgres-2pc").option("dsn", job.dsn)
                .option("table", job.table).option("sink.id", job.sink_id))

``job.kafka_options`` are the ``kafka.*`` options of the run's cluster: ``kafka.bootstrap.servers`` and, on a
secured cluster, the settings of ``--kafka-config`` (``spark-eos chaos --app-kafka-config``, else its
``--kafka-config``): give them to every ``kafka-eos`` source and sink of the job.

The runner sets ``checkpointLocation`` and the trigger (the chaos run needs both: it restarts the
query from the checkpoint after each kill and drains the topic with ``availableNow`` at the end).
An optional ``setup(job)`` in the same module runs before each start (make it idempotent: e.g.
``CREATE TABLE IF NOT EXISTS``). The records in ``job.topic`` are JSON objects written by the
chaos producer (``{"id", "key", "amount"}``) unless the run names the user's own records
(``--generator`` / ``--records-file`` of ``spark-eos chaos``): then they are the user's, and a record
whose ``topic`` is ``orders`` is in ``job.topic_named("orders")`` (``job.topics``, for joins). A
reference run (``--oracle``) calls the same ``setup`` and ``build`` with ``job.table`` set to the
reference table (``<table>_ref1``): derive every name the job writes from ``job.table``.

A job whose sink is the ``kafka-eos`` Kafka sink (``spark-eos chaos --sink-kind kafka`` or
``kafka-partition``) writes to ``job.out_topic``, a topic the run creates (``<table>_out``; a
reference run's is ``<table>_ref1_out``), with ``sink.id`` ``job.sink_id`` and ``visibility``
``job.visibility`` (``batch`` for ``kafka``, ``partition`` for ``kafka-partition``); ``job.dsn`` is ""
unless the run names a Postgres::

    def build(spark, job: Job):
        return (spark.readStream.format("kafka-eos")...load()
                ...
                .writeStream.format("kafka-eos").options(**job.kafka_options)
                .option("topic", job.out_topic).option("sink.id", job.sink_id)
                .option("visibility", job.visibility))

Such a run refuses (exit 64, ``RUNNER REFUSED:`` and why, which ``spark-eos chaos`` reports as a
config error) a query that does not write that way: another format, another topic, sink id or
visibility, or a ``marker.topic`` (the checker reads the markers from ``job.out_topic``); so does a
run of another ``--sink-kind`` whose query writes with the ``kafka-eos`` sink.

Every ``foreachBatch`` function the job sets runs between two fault points (``pipeline.batch``
before it, ``sink.after_commit`` after it returned, before Spark's commit; ``batch=`` the batch id),
which ``--sink-kind foreachbatch`` kills at.

Exit code 0 when the query ended (availableNow drained the topic), 2 when it failed (the error is
printed last on stderr after ``RUNNER FAILED:``), 3 on ``--timeout``, 64 when the job does not fit the
run (a ``ConfigError`` of ``setup`` or ``build``, or the check above: ``RUNNER REFUSED:``). ``RUNNER STARTED`` on stdout
tells the chaos loop that the query runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connectors.launch import pyspark_daemon
from eos_core import faults
from eos_core.errors import ConfigError

__all__ = [
    "Job",
    "build_parser",
    "executor_env",
    "load_app",
    "main",
    "mark_process_group",
    "out_topic_of",
    "python_stacks",
    "serve",
    "sink_id_of",
    "sink_refusal",
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
    out_topic_name: str = ""  # a kafka-eos sink job's topic, made by the run (out_topic_of(table)); see out_topic
    visibility: str = "batch"  # a kafka-eos sink job: the sink's visibility the run's --sink-kind names
    kafka_config: str = ""  # the job's Kafka client properties (--kafka-config), "" on a plaintext cluster
    schema_registry: str = ""  # the run's Schema Registry (--value-format avro), "" without one

    @property
    def kafka_options(self) -> dict[str, str]:
        """The ``kafka.*`` options of the run's cluster: its bootstrap and the ``--kafka-config`` settings."""
        from eos_core.kafka_config import kafka_options

        return kafka_options(self.bootstrap, self.kafka_config)

    @property
    def registry_options(self) -> dict[str, str]:
        """``schema.registry.url`` of the run's Schema Registry (``--value-format avro``), for the kafka-eos source
        (``value.format=avro``) and sink; empty when the run has none."""
        return {"schema.registry.url": self.schema_registry} if self.schema_registry else {}

    @property
    def out_topic(self) -> str:
        """The topic a ``kafka-eos`` sink job writes, made by the run (``--sink-kind kafka|kafka-partition``)."""
        if not self.out_topic_name:
            raise ConfigError(
                "job.out_topic: this run makes no topic for the job to write; a job writing with the kafka-eos sink "
                "needs --sink-kind kafka or kafka-partition (sink_kind= in eos_chaos)"
            )
        return self.out_topic_name

    def topic_named(self, name: str) -> str:
        """The run's topic for the records whose ``topic`` is ``name`` ("" or absent: ``self.topic``)."""
        if not name:
            return self.topic
        if name not in self.topics:
            raise KeyError(f"no topic named {name!r} in this run: the records name {sorted(self.topics) or 'none'}")
        return self.topics[name]

    @property
    def sink_id(self) -> str:
        """A ``postgres-2pc`` or ``kafka-eos`` sink id unique to this run (see ``sink_id_of``)."""
        return sink_id_of(self.table)


def sink_id_of(table: str) -> str:
    """The sink id a chaos run gives the job writing ``table`` (the table name, dots replaced)."""
    return table.replace(".", "_")


def out_topic_of(table: str) -> str:
    """The topic a chaos run makes for a ``kafka-eos`` sink job whose run writes ``table``: ``<table>_out``."""
    return sink_id_of(table) + "_out"


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
    p.add_argument("--kafka-config", default="", help="the job's Kafka client properties (job.kafka_options)")
    p.add_argument(
        "--schema-registry",
        default=os.environ.get("EOS_SCHEMA_REGISTRY_URL", ""),
        help="the run's Schema Registry (job.registry_options; default EOS_SCHEMA_REGISTRY_URL, how a chaos run "
        "hands it over: off the command line, where a user:password@ would show)",
    )
    p.add_argument("--topic", required=True)
    p.add_argument("--dsn", default="", help="Postgres (none for a job that writes only to Kafka)")
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-offsets", type=int, default=1000)
    p.add_argument("--out-topic", default="", help="a kafka-eos sink job: the topic it writes (job.out_topic)")
    p.add_argument(
        "--visibility",
        choices=("batch", "partition"),
        default="batch",
        help="a kafka-eos sink job: the sink's visibility (job.visibility)",
    )
    p.add_argument("--trigger", default="available-now", help="available-now | processing:SECONDS")
    p.add_argument("--master", default="local[2,2]")
    p.add_argument("--timeout", type=float, default=600.0, help="give up (exit 3) after this many seconds")
    p.add_argument("--option", action="append", default=[], help="key=value handed to the job (repeatable)")
    p.add_argument(
        "--topics", action="append", default=[], help="name=topic: the run's topic of that name (repeatable)"
    )
    p.add_argument("--conf", action="append", default=[], help="key=value: a Spark setting of the session (repeatable)")
    p.add_argument(
        "--connect",
        action="store_true",
        help="run the job as a Spark Connect client: a Connect server (--master, --conf) starts beside this process, "
        "its driver, and dies with it; its fault points kill this process's group",
    )
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
    for key, value in {**pyspark_daemon.CONF, **executor_env(master), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    connectors.register(spark)
    return spark


def _connect_spark(master: str, conf: dict[str, str], workdir: str) -> Any:
    """A Spark Connect session on a Connect server this process starts (``--connect``): the server is the job's
    driver on ``master``; it inherits the run's fault spec, state and log, names this process's group as the one
    its fault points kill, and is SIGKILLed by the kernel when this process dies (a kill of the job's group)."""
    from pyspark.sql import SparkSession

    import connectors
    from connectors.services.spark_connect import ConnectServer

    settings = {
        "spark.sql.shuffle.partitions": "2",
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(sys.path),
        **pyspark_daemon.CONF,
        **executor_env(master),
        **conf,
    }
    server = ConnectServer(workdir, master=master, conf=settings, faults_group=os.getpgrp()).start()
    print(f"RUNNER CONNECT {server.remote} server pid={server.proc.pid if server.proc else 0}", flush=True)
    spark = SparkSession.builder.remote(server.remote).getOrCreate()
    connectors.register(spark)
    return spark


def _writer_classes(connect: bool) -> list[Any]:
    """The DataStreamWriter classes a job's ``build`` uses: the classic session's; with ``connect`` Spark
    Connect's too."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if not connect:
        return [DataStreamWriter]
    from pyspark.sql.connect.streaming.readwriter import DataStreamWriter as ConnectWriter

    return [DataStreamWriter, ConnectWriter]


def mark_process_group() -> None:
    """Call first, before Spark starts: kill-group fault points then know the job's process group.

    Executor Python workers live in PySpark's daemon's own process group; the variable is inherited
    by the JVM and every worker it starts (so it must be set before the JVM starts).
    """
    os.environ[faults.ENV_PGID] = str(os.getpgrp())


def serve(start: Callable[[], Any], timeout: float) -> int:
    """Start the query (``start()``), wait for its end; the exit code and the markers the chaos loop reads.

    0 when it ended (availableNow drained), 2 when it failed (``RUNNER FAILED:`` + the error, last on
    stderr), 3 after ``timeout`` seconds (first the stacks of the JVM's stream threads and of the Python
    workers: ``RUNNER STACKS``, ``python_stacks``), 64 on a ``ConfigError`` before the query started (``RUNNER
    REFUSED:`` + why: the job does not fit the run). ``RUNNER STARTED`` on stdout once it runs.
    """
    started = time.monotonic()
    try:
        query = start()
        print(f"RUNNER STARTED pid={os.getpid()} query={query.id}", flush=True)
        if not query.awaitTermination(timeout):
            print(
                f"RUNNER STACKS of the query still running after {timeout}s:\n{_stacks()}", file=sys.stderr, flush=True
            )
            print(python_stacks(), file=sys.stderr, flush=True)  # the workers' stacks, then which were asked
            query.stop()
            print(f"RUNNER TIMEOUT after {timeout}s", file=sys.stderr, flush=True)
            return 3
        if query.exception() is not None:
            raise query.exception()
    except ConfigError as exc:  # the job does not fit the run: no restart would change that
        print(f"RUNNER REFUSED: {str(exc).replace(chr(10), ' ')[:4000]}", file=sys.stderr, flush=True)
        return 64
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


def python_stacks(root: int | None = None, settle: float = 1.5) -> str:
    """Have the Python workers under ``root`` (this process) write their stacks to the log: each process of
    our worker daemon (``connectors.launch.pyspark_daemon``) that catches its dump signal gets it; their
    stacks reach this process's stderr through Spark's copy of their output within ``settle`` seconds. A
    process that does not catch it (PySpark's own daemon) is left alone: the signal would end it. What was
    signalled, in one line; never raises."""
    from connectors.toolkit.harness import descendants

    signalled = []
    try:
        for pid in descendants(os.getpid() if root is None else root):
            if not _dumps_on_signal(pid):
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, pyspark_daemon.DUMP_SIGNAL)
                signalled.append(pid)
    except Exception as exc:  # a report of a hang must not fail on its way out
        return f"(no Python stacks: {type(exc).__name__}: {exc})"
    if not signalled:
        return "(no Python worker of spark-eos's daemon to ask for its stacks)"
    time.sleep(settle)
    return f"Python workers {signalled} asked for their stacks (faulthandler's 'Current thread 0x...' blocks above)"


def _dumps_on_signal(pid: int) -> bool:
    """Whether ``pid`` runs our worker daemon (``python -m connectors.launch.pyspark_daemon``: the JVM's command
    line names it too, in a setting, and the JVM must never get the signal: HotSpot uses it for itself) and has
    a handler for its dump signal (``SigCgt``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if fh.read().split(b"\0")[1:3] != [b"-m", pyspark_daemon.MODULE.encode()]:
                return False
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            caught = next((line.split()[1] for line in fh if line.startswith("SigCgt:")), "0")
    except OSError:
        return False
    return bool(int(caught, 16) & (1 << (int(pyspark_daemon.DUMP_SIGNAL) - 1)))


def foreach_batch_with_fault_points(func: Callable[[Any, int], Any]) -> Callable[[Any, int], None]:
    """The user's foreachBatch function between two fault points (``eos_core.faults.around_batch``)."""
    return faults.around_batch(func)


def _wrap_foreach_batch(connect: bool = False) -> None:
    """Every ``foreachBatch`` the user's ``build`` sets gets the fault points (this process only; over Spark
    Connect the wrapped function runs in the server, whose environment holds the run's fault spec)."""
    for cls in _writer_classes(connect):
        _wrap_foreach_batch_of(cls)


def _wrap_foreach_batch_of(writer_class: Any) -> None:
    original = writer_class.foreachBatch
    if getattr(original, "_eos_wrapped", False):
        return

    def foreachBatch(self: Any, func: Callable[[Any, int], Any]) -> Any:  # Spark's name
        sink_of(self)["format"] = "foreachBatch"
        return original(self, foreach_batch_with_fault_points(func))

    foreachBatch._eos_wrapped = True  # type: ignore[attr-defined]
    writer_class.foreachBatch = foreachBatch


def sink_of(writer: Any) -> dict[str, Any]:
    """What the user's ``build`` gave ``writer``: ``{"format": ..., "options": {lower-case key: str}}``."""
    return writer.__dict__.setdefault("_eos_sink", {"format": "", "options": {}})  # type: ignore[no-any-return]


def record_sink(connect: bool = False) -> None:
    """Every DataStreamWriter remembers its format and options (this process only; Spark keeps them in
    the JVM, out of Python's reach), for ``sink_refusal``. Spark's own methods still do the work."""
    for cls in _writer_classes(connect):
        _record_sink_of(cls)


def _record_sink_of(writer_class: Any) -> None:
    if getattr(writer_class.format, "_eos_wrapped", False):
        return
    fmt, opt, opts = writer_class.format, writer_class.option, writer_class.options

    def format(self: Any, source: str) -> Any:  # Spark's names
        sink_of(self)["format"] = source
        return fmt(self, source)

    def option(self: Any, key: str, value: Any) -> Any:
        if value is not None:
            sink_of(self)["options"][key.lower()] = str(value)
        return opt(self, key, value)

    def options(self: Any, **given: Any) -> Any:
        sink_of(self)["options"].update({k.lower(): str(v) for k, v in given.items() if v is not None})
        return opts(self, **given)

    wrapper: Any
    for wrapper in (format, option, options):
        wrapper._eos_wrapped = True
    writer_class.format, writer_class.option, writer_class.options = format, option, options


# what a kafka-eos sink job's writer must be given, and why (sink_refusal)
_KAFKA_WIRING = (
    ("topic", "out_topic", "the topic the run creates and reads back read_committed"),
    ("sink.id", "sink_id", "the checker finds the sink's markers by it"),
    ("visibility", "visibility", "the --sink-kind names the visibility whose fault points the run draws"),
)


def sink_refusal(writer: Any, job: Job) -> str | None:
    """Why the query ``build`` returned does not fit the run, or None: a run with ``job.out_topic``
    (``--sink-kind kafka|kafka-partition``) needs ``format("kafka-eos")`` writing ``job.out_topic`` with
    ``job.sink_id`` and ``job.visibility``, markers on that topic; a run without it, another sink. A
    foreachBatch writer is not looked into (a ``connectors.kafka_batch`` inside it: the checker judges)."""
    sink = sink_of(writer)
    fmt, opts = str(sink["format"]), sink["options"]
    kafka = fmt.lower() == "kafka-eos"
    if not job.out_topic_name:
        if not kafka:
            return None
        return (
            "the job's query writes with the kafka-eos sink, but the run's --sink-kind is neither kafka nor "
            "kafka-partition: run it with --sink-kind kafka (visibility=batch) or kafka-partition (visibility=partition), "
            "which give it job.out_topic and read that topic back"
        )
    kind = "--sink-kind " + ("kafka" if job.visibility == "batch" else "kafka-partition")
    if fmt == "foreachBatch":
        return None
    if not kafka:
        what = f"format({fmt!r})" if fmt else "Spark's default format (no .format())"
        return (
            f"{kind}: the job's query writes with {what}, not with the kafka-eos sink; run it with the --sink-kind "
            "of its sink (2pc, upsert, foreachbatch, other), or write with .format('kafka-eos') into job.out_topic"
        )
    for key, attr, why in _KAFKA_WIRING:
        got, want = opts.get(key, "batch" if key == "visibility" else None), str(getattr(job, attr))
        if (got or "").lower() != want.lower():
            has = f"{key}={got!r}" if got is not None else f"no option {key!r}"
            return f"{kind}: the job's kafka-eos sink has {has}, the run needs {want!r} ({why}): give it .option({key!r}, job.{attr})"
    if opts.get("marker.topic") not in (None, job.out_topic_name):
        return (
            f"{kind}: the job's kafka-eos sink keeps its markers on marker.topic={opts['marker.topic']!r}; the run "
            "reads them from job.out_topic: leave marker.topic unset"
        )
    return None


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
    job = Job(
        args.bootstrap,
        args.topic,
        args.dsn,
        args.table,
        args.max_offsets,
        options,
        topics,
        args.checkpoint,
        args.out_topic,
        args.visibility,
        args.kafka_config,
        args.schema_registry,
    )
    build, setup = load_app(args.app)

    def start() -> Any:
        if setup is not None:
            setup(job)
        if args.connect:
            spark = _connect_spark(args.master, conf, os.path.join(os.path.dirname(args.checkpoint), "connect-server"))
        else:
            spark = _spark(args.master, conf)
        _wrap_foreach_batch(args.connect)
        record_sink(args.connect)
        writer = build(spark, job)
        if not hasattr(writer, "start") or not hasattr(writer, "trigger"):
            raise TypeError(
                f"{args.app} returned {type(writer).__name__}; it must return the query's DataStreamWriter "
                "(df.writeStream...), not started: the runner sets the checkpoint and the trigger"
            )
        why = sink_refusal(writer, job)
        if why:
            raise ConfigError(why)
        return with_trigger(writer.option("checkpointLocation", args.checkpoint), args.trigger).start()

    return serve(start, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
