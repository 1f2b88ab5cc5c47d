"""The fault kinds of a chaos run: what ``spark-eos chaos --faults kill:2,pg-restart:1,...`` draws from.

Each step of a chaos run's schedule is one fault, its kind drawn by the seed with the weights of
``--faults`` (default ``kill:1,fault-point:1``). Every fault leaves its proof in the run's fault log
(``faults.jsonl``): the fault points log their own firing (``eos_core.faults``); the chaos loop
appends one line per fault it injects from outside (``"point": "chaos.<kind>"``) with what it saw:
the pids it killed and that they are gone, the server's start time before and after, the connections
a proxy reset or held. A fault whose proof is missing (a cut that met no connection, a slow task of
which Spark ran no copy) fails the report's ``chaos.faults`` check: a fault that did not happen
proves nothing.

Each kind is one ``FaultKind`` record in ``KINDS``: its summary (``--help``, the docs), how the fault
loop injects it (``kill``: it ends the job's run; ``held``: a task of a run of its own is held at a
task-side fault point while something happens to it; ``outside``: injected into the running job from
outside, then healed), what it needs the run to set up (``NEEDS``: a broker of the run's own, a proxy,
the Postgres server spark-eos runs, a cluster) and its injector (a method of ``kit.FaultKit``). Every list the toolkit asks for (which
kinds need a run of their own, which get records before and after them, which need a broker of the
run's own) and every refusal is derived from the records. Adding a kind is one record, its injector,
its line in docs/guarantees.md and its test.

- ``kill`` / ``fault-point``: a SIGKILL of the job's process group from outside; the group killing
  itself at a fault point of the sink or the source. Both end the job's run.
- ``executor-loss``: the job runs on ``local-cluster[2,1,1024]`` (executors are JVMs of their own);
  a task is held at a task-side fault point while the executor JVM running it and its Python
  workers are SIGKILLed; Spark runs the task elsewhere and the query goes on.
- ``slow-task``: the job runs on a standalone cluster of two one-core workers on 127.0.0.2 and
  127.0.0.3 (``connectors.toolkit.chaos.cluster``) with ``spark.speculation`` on; one task is held
  ``HOLD_SECONDS`` and Spark starts a speculative copy on the other worker; both attempts run the
  sink's protocol and Spark accepts one.
- ``pg-restart`` / ``pg-crash`` / ``pg-stop``: the Postgres spark-eos runs is restarted cleanly,
  crashed (``immediate``: no shutdown checkpoint, WAL recovery) and started after a few seconds,
  or stopped cleanly for longer, while the job writes.
- ``pg-cut`` / ``pg-stall`` / ``kafka-cut`` / ``kafka-stall``: the job reaches Postgres (Kafka)
  through a TCP proxy (``connectors.toolkit.chaos.proxy``) that resets every connection and refuses new
  ones, or forwards no byte while keeping them open, for a few seconds. For Kafka the chaos run
  starts an Apache Kafka broker of its own that advertises the proxy (clients connect where the
  broker says, so a proxy in front of any other broker would be bypassed).
- ``broker-crash`` / ``broker-restart``: that broker SIGKILLed and started again on the same log
  directory after a few seconds, or restarted cleanly (controlled shutdown).
- ``leader-kill`` / ``rolling-restart``: the job's Kafka is a replicated cluster of the run's own (three
  KRaft nodes, three replicas per partition, two in sync required: ``connectors.services.kafka_cluster``);
  the node leading most of the run's partitions SIGKILLed, down a few seconds while another replica
  leads, started again; or every node restarted in turn, replicas back in sync before the next, as an
  operator's rolling restart. A run has one Kafka: these do not mix with the single broker's kinds.

A fault the setup cannot support is refused before anything runs, in one line naming the fault, why
and the fix (``refuse``): the broker faults on a broker the user named (``--bootstrap`` /
``EOS_KAFKA_BOOTSTRAP``), the Postgres server faults on a server the user named, ``slow-task``
where 127.0.0.2 cannot be bound or with one partition, and the Postgres faults on a job writing with
the ``kafka-eos`` sink (``--sink-kind kafka|kafka-partition``: the run has no Postgres;
``pg-cut``/``pg-stall`` only where ``--dsn`` names one the job reads). Every other kind applies to
such a job as to any: its task-side hold point is the sink's ``sink.after_write`` (rows staged, or
sent in the task's open transaction).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.toolkit.chaos.config import DEFAULT_FAULTS, KAFKA_SINK_KINDS
from eos_core.errors import ConfigError

__all__ = [
    "DEFAULT",
    "HOLD_SECONDS",
    "KINDS",
    "NEEDS",
    "FaultKind",
    "Hold",
    "Need",
    "Setup",
    "describe",
    "format_faults",
    "parse_faults",
    "refuse",
]

DEFAULT = DEFAULT_FAULTS

HOLD_SECONDS = 40.0  # slow-task: the other tasks must finish and Spark speculate (multiplier 1.5) meanwhile, also on a loaded machine
EXECUTOR_HOLD = 30.0  # executor-loss: the task waits this long at most for its executor to be killed
DISK_MB = 64  # disk-full: the size of the filesystem the run mounts for the job's checkpoint


# ---- what a run was given, as the refusals see it ----------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What the run was given: where the user named their broker / Postgres (``--bootstrap``,
    ``EOS_KAFKA_BOOTSTRAP``, ...; None when spark-eos runs it), the job's DSN, partitions, sink kind
    (None: a reference pipeline), and how a refusal names each input (``inputs.CLI_NAMES`` or the plugin's)."""

    kafka_named: str | None = None
    postgres_named: str | None = None
    dsn: str | None = None
    partitions: int = 2
    sink_kind: str | None = None
    names: Mapping[str, str] | None = None
    connect: bool = False  # the job runs as a Spark Connect client (--connect)

    def name(self, what: str) -> str:
        """How the run's caller names input ``what`` (``faults`` -> ``--faults`` or ``faults=``)."""
        return (self.names or {}).get(what, f"--{what.replace('_', '-')}")

    @property
    def kafka_sink(self) -> bool:
        """The job writes with the kafka-eos sink: the run gives it no Postgres unless ``dsn`` names one."""
        return self.sink_kind in KAFKA_SINK_KINDS


@dataclass(frozen=True)
class Need:
    """Something a fault kind needs the run to set up, and when a setup cannot give it:
    ``refuse(kind, setup)`` is the reason, naming the fault and the fix, or None."""

    name: str
    refuse: Callable[[FaultKind, Setup], str | None]


def _own_broker(kind: FaultKind, setup: Setup) -> str | None:
    if not setup.kafka_named:
        return None
    what = "advertises a proxy from" if "kafka-proxy" in kind.needs else "restarts"
    named = setup.kafka_named
    return (
        f"{setup.name('faults')} {kind.name}: needs a Kafka broker the chaos run starts itself (it {what} it), but "
        f"{named} names yours; unset {named} (an embedded Apache Kafka then runs the job's topics) or drop {kind.name}"
    )


def _pg_server(kind: FaultKind, setup: Setup) -> str | None:
    if not setup.postgres_named:
        return None
    named = setup.postgres_named
    return (
        f"{setup.name('faults')} {kind.name}: needs a Postgres spark-eos runs (it stops and starts the server), but "
        f"{named} names yours; unset {named} (an embedded Postgres then serves the run) or drop {kind.name}"
    )


def _pg_proxy(kind: FaultKind, setup: Setup) -> str | None:
    if not setup.dsn or tcp_address(setup.dsn) is not None:
        return None
    return (
        f"{setup.name('faults')} {kind.name}: the Postgres DSN names no single TCP host and port (a socket "
        "directory or several hosts), so no proxy can stand between the job and the server"
    )


def _two_hosts(kind: FaultKind, setup: Setup) -> str | None:
    from connectors.toolkit.chaos.cluster import worker_hosts_usable

    why = worker_hosts_usable()
    if why:
        return f"{setup.name('faults')} {kind.name}: needs a standalone cluster of two worker hosts here: {why}"
    if setup.partitions < 2:
        return (
            f"{setup.name('faults')} {kind.name}: needs --partitions >= 2 (Spark speculates once half a stage's "
            f"tasks finished; with {setup.partitions} there is no other task)"
        )
    return None


def _small_disk(kind: FaultKind, setup: Setup) -> str | None:
    import shutil

    if not hasattr(os, "geteuid") or not os.path.exists("/proc/mounts"):
        return f"{setup.name('faults')} {kind.name}: mounts a small filesystem for the job's checkpoint (Linux only)"
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return (
            f"{setup.name('faults')} {kind.name}: mounts a {DISK_MB} MB tmpfs for the job's checkpoint, which only root "
            "may (mount -t tmpfs); run the chaos run as root, or drop disk-full"
        )
    return None


NEEDS: dict[str, Need] = {
    need.name: need
    for need in (
        Need("own-broker", _own_broker),  # an Apache Kafka broker of the run's own
        Need("kafka-cluster", _own_broker),  # three replicating Apache Kafka nodes of the run's own
        Need("kafka-proxy", lambda kind, setup: None),  # a proxy in front of it, which it advertises
        Need("pg-server", _pg_server),  # the Postgres server spark-eos runs
        Need("pg-proxy", _pg_proxy),  # a proxy in front of the job's Postgres
        Need("two-hosts", _two_hosts),  # a standalone cluster of two worker hosts, speculation on
        Need("local-cluster", lambda kind, setup: None),  # executors as JVMs of their own
        Need("small-disk", _small_disk),  # the job's checkpoint on a small filesystem of the run's own
    )
}


# ---- the kinds --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """How a ``held`` kind holds a task: ``seconds`` at the sink's hold point (``log_others``: every other
    task passing it in that batch is logged too, a speculative copy among them), then ``act(kit, held,
    others_rule)`` while it waits (``held``: the hold's firing in the fault log), which returns the proof."""

    seconds: float
    act: Callable[[Any, Mapping[str, Any], str], dict[str, Any]]
    log_others: bool = False


Injector = Callable[[Any, Callable[[], None]], dict[str, Any]]
"""An ``outside`` kind's injector: ``inject(kit, feed)`` (``kit``: the run's ``kit.FaultKit``) injects the fault now, calls ``feed()`` once it is on
(the producer's next records: the kinds with ``feed`` set want the job writing into the fault), waits until it
healed and returns the proof."""


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: its ``--faults`` name, a summary, how the fault loop injects it (``kill``:
    the run ends with it; ``held``: a task of a run of its own held while ``hold.act`` happens;
    ``outside``: ``inject(kit)`` into the running job, waiting until it healed, returning the proof),
    what it ``needs`` of the setup (``NEEDS``), whether it acts on Postgres, and whether the job is fed
    records while it is on (``feed``)."""

    name: str
    summary: str
    how: str
    needs: tuple[str, ...] = ()
    postgres: bool = False
    fresh_run: bool = False  # armed in the run's environment: a run of its own
    inject: Injector | None = None
    hold: Hold | None = None
    feed: bool = False  # records are released while the fault is on, so that the job writes into it

    @property
    def from_outside(self) -> bool:
        """Injected from outside while the run goes on: the producer writes before it and after its heal."""
        return self.how == "outside"


def _pg_server_fault(kind: str) -> Injector:
    return lambda kit, feed: kit.pg_server(kind)


def _net_fault(proxy: str, kind: str) -> Injector:
    return lambda kit, feed: kit.net(getattr(kit, proxy), kind)


def _broker_fault(kind: str) -> Injector:
    return lambda kit, feed: kit.broker_fault(kind)


def _cluster_fault(kind: str) -> Injector:
    return lambda kit, feed: kit.cluster_fault(kind, feed)


KINDS: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind(
            "kill", "SIGKILL of the job's whole process group (driver, JVM, Python workers) at a random moment", "kill"
        ),
        FaultKind(
            "fault-point",
            "the job's process group kills itself at a named fault point of the sink or the source",
            "kill",
            fresh_run=True,
        ),
        FaultKind(
            "executor-loss",
            "an executor JVM and its Python workers SIGKILLed while one of its tasks is held "
            "(the job runs on local-cluster[2,1,1024])",
            "held",
            needs=("local-cluster",),
            fresh_run=True,
            hold=Hold(EXECUTOR_HOLD, lambda kit, held, others_rule: kit.lose_executor(held)),
        ),
        FaultKind(
            "slow-task",
            "a task held 40 s with spark.speculation on: Spark runs a copy on the other worker "
            "(a standalone cluster of two one-core workers on 127.0.0.2/.3)",
            "held",
            needs=("two-hosts",),
            fresh_run=True,
            hold=Hold(HOLD_SECONDS, lambda kit, held, others_rule: kit.speculate(held, others_rule), log_others=True),
        ),
        FaultKind(
            "pg-restart",
            "Postgres restarted cleanly (fast shutdown: every session ends)",
            "outside",
            needs=("pg-server",),
            postgres=True,
            inject=_pg_server_fault("pg-restart"),
        ),
        FaultKind(
            "pg-crash",
            "Postgres crashed (immediate: no shutdown checkpoint), down 3 s, started (WAL recovery)",
            "outside",
            needs=("pg-server",),
            postgres=True,
            inject=_pg_server_fault("pg-crash"),
        ),
        FaultKind(
            "pg-stop",
            "Postgres stopped cleanly, down 6 s (connections refused), started",
            "outside",
            needs=("pg-server",),
            postgres=True,
            inject=_pg_server_fault("pg-stop"),
        ),
        FaultKind(
            "pg-cut",
            "every connection to Postgres reset and new ones refused for 4 s (TCP proxy)",
            "outside",
            needs=("pg-proxy",),
            postgres=True,
            inject=_net_fault("pg_proxy", "pg-cut"),
        ),
        FaultKind(
            "pg-stall",
            "no byte to or from Postgres for 6 s, connections kept open (TCP proxy)",
            "outside",
            needs=("pg-proxy",),
            postgres=True,
            inject=_net_fault("pg_proxy", "pg-stall"),
        ),
        FaultKind(
            "kafka-cut",
            "every connection to Kafka reset and new ones refused for 4 s (TCP proxy; a broker of the run's own)",
            "outside",
            needs=("own-broker", "kafka-proxy"),
            inject=_net_fault("kafka_proxy", "kafka-cut"),
        ),
        FaultKind(
            "kafka-stall",
            "no byte to or from Kafka for 6 s, connections kept open (TCP proxy; a broker of the run's own)",
            "outside",
            needs=("own-broker", "kafka-proxy"),
            inject=_net_fault("kafka_proxy", "kafka-stall"),
        ),
        FaultKind(
            "broker-crash",
            "the Kafka broker SIGKILLed, down 3 s, started on the same log dir (a broker of the run's own)",
            "outside",
            needs=("own-broker",),
            inject=_broker_fault("broker-crash"),
        ),
        FaultKind(
            "broker-restart",
            "the Kafka broker restarted cleanly: controlled shutdown, start (a broker of the run's own)",
            "outside",
            needs=("own-broker",),
            inject=_broker_fault("broker-restart"),
        ),
        FaultKind(
            "leader-kill",
            "the Kafka node leading most of the run's partitions SIGKILLed, down 3 s while other replicas lead, "
            "started on its log dir (a three-node cluster of the run's own)",
            "outside",
            needs=("kafka-cluster",),
            inject=_cluster_fault("leader-kill"),
            feed=True,
        ),
        FaultKind(
            "rolling-restart",
            "every node of a three-node Kafka cluster of the run's own restarted in turn (controlled shutdown, "
            "start, every replica back in sync before the next)",
            "outside",
            needs=("kafka-cluster",),
            inject=_cluster_fault("rolling-restart"),
            feed=True,
        ),
        FaultKind(
            "disk-full",
            f"the checkpoint's filesystem full (a {DISK_MB} MB tmpfs the run mounts for it, filled to its last byte) "
            "while records arrive, until the job meets it (3 to 30 s), then freed",
            "outside",
            needs=("small-disk",),
            inject=lambda kit, feed: kit.fill_disk(feed),
            feed=True,
        ),
    )
}


def needed(weights: Mapping[str, int]) -> set[str]:
    """What the kinds drawn with a weight above 0 need of the setup (``NEEDS``' names)."""
    return {need for name, w in weights.items() if w > 0 for need in KINDS[name].needs}


def parse_faults(spec: str | Mapping[str, int] | None, *, option: str = "--faults") -> dict[str, int]:
    """``kill:2,pg-restart:1`` (a bare kind weighs 1) or a mapping -> {kind: weight}, in KINDS order
    (so the same weights draw the same schedule however they are written). A bad entry names ``option``."""
    if spec is None:
        return dict(DEFAULT)
    items: list[tuple[str, Any]]
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        items = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            name, sep, text = part.partition(":")
            items.append((name.strip(), text.strip() if sep else 1))
    weights: dict[str, int] = {}
    for name, raw in items:
        if name not in KINDS:
            raise ConfigError(f"{option} {name!r}: unknown fault kind; kinds: {', '.join(KINDS)}")
        weight = _weight(raw)
        if weight is None:
            raise ConfigError(f"{option} '{name}:{raw}': the weight is a whole number >= 0, e.g. {name}:2")
        if name in weights:
            raise ConfigError(f"{option}: {name} given twice; give each kind once with its weight")
        weights[name] = weight
    ordered = {k: weights[k] for k in KINDS if weights.get(k, 0) > 0}
    if not ordered:
        raise ConfigError(f"{option} {spec!r}: no fault kind with a weight above 0; e.g. kill:2,pg-restart:1")
    return ordered


def _weight(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if raw >= 0 else None
    if isinstance(raw, str) and raw.isdigit():
        return int(raw)
    return None


def format_faults(weights: Mapping[str, int]) -> str:
    return ",".join(f"{k}:{w}" for k, w in weights.items())


def describe(weights: Mapping[str, int]) -> Sequence[str]:
    total = sum(weights.values())
    return [f"{k} ({w}/{total}): {KINDS[k].summary}" for k, w in weights.items()]


def refuse(weights: Mapping[str, int], setup: Setup) -> None:
    """Refuse (ConfigError, one line naming the fault, why and the fix) every listed fault this setup
    cannot inject: first what cannot apply to a job writing with the kafka-eos sink (its own refusals say
    more than the general ones), then each kind's ``NEEDS`` in turn."""
    listed = [KINDS[k] for k, w in weights.items() if w > 0]
    for kind in (k for k in listed if setup.connect and {"local-cluster", "two-hosts"} & set(k.needs)):
        raise ConfigError(
            f"{setup.name('faults')} {kind.name}: not with {setup.name('connect')} (it moves the job to a cluster of "
            f"its own, which is untested behind a Spark Connect server); drop {kind.name} or {setup.name('connect')}"
        )
    replicated = [k.name for k in listed if "kafka-cluster" in k.needs]
    single = [k.name for k in listed if "own-broker" in k.needs]
    if replicated and single:
        raise ConfigError(
            f"{setup.name('faults')} {replicated[0]} and {single[0]}: a chaos run has one Kafka, a three-node cluster "
            f"({', '.join(replicated)}) or a single broker ({', '.join(single)}); run them in separate chaos runs"
        )
    if setup.kafka_sink:
        for kind in (k for k in listed if k.postgres):
            if "pg-proxy" in kind.needs and setup.dsn:
                continue  # a proxy in front of the Postgres the job names (job.dsn): the job may read it
            raise ConfigError(_postgres_on_a_kafka_job(kind, setup))
    for kind in listed:
        for need in kind.needs:
            why = NEEDS[need].refuse(kind, setup)
            if why:
                raise ConfigError(why)


def _postgres_on_a_kafka_job(kind: FaultKind, setup: Setup) -> str:
    why = (
        "the run gives the job no Postgres (none is started for a job writing with the kafka-eos sink)"
        if not setup.dsn
        else "it would stop and start a Postgres that the run does not use (the job writes to Kafka)"
    )
    fix = (
        f" (or, to cut the connections of a Postgres your job reads, name it with {setup.name('dsn')})"
        if not setup.dsn
        else ""
    )
    return (
        f"{setup.name('faults')} {kind.name}: {setup.name('sink_kind')} {setup.sink_kind}: {why}; drop {kind.name}"
        f"{fix}; the Postgres faults are for jobs that write to Postgres (2pc, upsert, foreachbatch, other)"
    )


def tcp_address(dsn: str) -> tuple[str, int] | None:
    """The TCP host and port a DSN connects to, or None when it is a socket directory or several hosts."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    host = str(parts.get("host") or parts.get("hostaddr") or "")
    port = str(parts.get("port") or "5432")
    if not host or host.startswith("/") or "," in host or "," in port:
        return None
    return host, int(port)
