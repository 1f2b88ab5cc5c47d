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
the Postgres server spark-eos runs, a cluster) and its injector. Every list the toolkit asks for (which
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

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.toolkit.chaos.config import DEFAULT_FAULTS, KAFKA_SINK_KINDS
from eos_core.errors import ConfigError

__all__ = [
    "DEFAULT",
    "KINDS",
    "NEEDS",
    "FaultKind",
    "FaultKit",
    "Hold",
    "Need",
    "Setup",
    "describe",
    "format_faults",
    "parse_faults",
    "refuse",
]

DEFAULT = DEFAULT_FAULTS

CUT_SECONDS = 4.0
STALL_SECONDS = 6.0
PG_CRASH_DOWN = 3.0
PG_STOP_DOWN = 6.0
BROKER_DOWN = 3.0
HOLD_SECONDS = 40.0  # slow-task: the other tasks must finish and Spark speculate (multiplier 1.5) meanwhile, also on a loaded machine
EXECUTOR_HOLD = 30.0  # executor-loss: the task waits this long at most for its executor to be killed
DISK_MB = 64  # disk-full: the size of the filesystem the run mounts for the job's checkpoint
DISK_FULL_SECONDS = (3.0, 30.0)  # disk-full: full at least this long, and until the job meets it, at most that
NO_SPACE = "No space left on device"  # what the JVM and Python say of ENOSPC
LOCAL_CLUSTER = "local-cluster[2,1,1024]"

SPECULATION_CONF = {
    "spark.speculation": "true",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
    "spark.speculation.interval": "200ms",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.cores": "1",
    "spark.executor.memory": "768m",
}


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
    act: Callable[[FaultKit, Mapping[str, Any], str], dict[str, Any]]
    log_others: bool = False


Injector = Callable[["FaultKit", Callable[[], None]], dict[str, Any]]
"""An ``outside`` kind's injector: ``inject(kit, feed)`` injects the fault now, calls ``feed()`` once it is on
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


def _lose_executor(kit: FaultKit, held: Mapping[str, Any], others_rule: str) -> dict[str, Any]:
    return kill_executor(int(held["pid"]))


def _speculate(kit: FaultKit, held: Mapping[str, Any], others_rule: str) -> dict[str, Any]:
    """Wait out the hold, then find Spark's copy of the held task in the fault log."""
    time.sleep(max(0.0, float(held["time"]) + HOLD_SECONDS + 1 - time.time()))
    copy = speculative_copy(kit.fault_log, held, others_rule)
    fields = ("pid", "partition", "attempt", "time")
    return {
        "held": {k: held.get(k) for k in fields},
        "copy": None if copy is None else {k: copy.get(k) for k in fields},
        "ok": copy is not None,
        "proof": (
            f"held {HOLD_SECONDS:.0f} s; a copy ran meanwhile (pid {copy.get('pid')}, attempt {copy.get('attempt', '?')})"
            if copy
            else f"held {HOLD_SECONDS:.0f} s; Spark ran NO copy of it meanwhile (speculation did not start)"
        ),
    }


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
            hold=Hold(EXECUTOR_HOLD, _lose_executor),
        ),
        FaultKind(
            "slow-task",
            "a task held 40 s with spark.speculation on: Spark runs a copy on the other worker "
            "(a standalone cluster of two one-core workers on 127.0.0.2/.3)",
            "held",
            needs=("two-hosts",),
            fresh_run=True,
            hold=Hold(HOLD_SECONDS, _speculate, log_others=True),
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


# ---- the kit: what the faults need, set up before the first run, and their injectors -----------------


def tcp_address(dsn: str) -> tuple[str, int] | None:
    """The TCP host and port a DSN connects to, or None when it is a socket directory or several hosts."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    host = str(parts.get("host") or parts.get("hostaddr") or "")
    port = str(parts.get("port") or "5432")
    if not host or host.startswith("/") or "," in host or "," in port:
        return None
    return host, int(port)


def with_address(dsn: str, host: str, port: int) -> str:
    """``dsn`` pointing at ``host:port`` instead (a proxy), everything else kept."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(dsn)
    parts.pop("hostaddr", None)
    parts.update(host=host, port=str(port))
    return make_conninfo(**parts)  # type: ignore[arg-type]


def _pid_alive(pid: int) -> bool:
    from connectors.services._proc import pid_alive

    return pid_alive(pid)


def _pg_started(dsn: str) -> str | None:
    """The server's ``pg_postmaster_start_time()`` (a restart changes it), None when unreachable."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()::text").fetchone()
            return None if row is None else str(row[0])
    except psycopg.Error:
        return None


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _logged_since(log: str, offset: int, text: str) -> bool:
    """Whether ``text`` is in ``log`` after its first ``offset`` bytes."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            return text.encode() in fh.read()
    except FileNotFoundError:
        return False


def _unmount_keeping(path: str) -> None:
    """Unmount the tmpfs at ``path``, its files copied back onto the disk below it first."""
    import shutil
    import subprocess

    saved = path + ".saved"
    shutil.copytree(path, saved, dirs_exist_ok=True)
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], capture_output=True)  # still busy: detach it now
    shutil.rmtree(path, ignore_errors=True)
    os.replace(saved, path)


def _pg_refuses(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return False
    except psycopg.Error:
        return True


class FaultKit:
    """What a chaos run needs to inject its faults (each ``Need`` of the kinds drawn), set up before its
    first run and torn down after its last: a broker of its own (with a proxy in front when Kafka's
    connections are cut or stalled), a proxy in front of Postgres, a standalone cluster for ``slow-task``;
    ``bootstrap``, ``job_dsn``, ``master`` and ``conf`` are what the job's runs then use."""

    def __init__(
        self,
        weights: Mapping[str, int],
        *,
        bootstrap: str,
        dsn: str,
        postgres: Any = None,
        env: Mapping[str, str] | None = None,
        workdir: str = ".",
        master: str = "local[2,2]",
    ) -> None:
        self.weights = dict(weights)
        self.needs = needed(self.weights)
        self.bootstrap = bootstrap
        self.dsn = dsn
        self.job_dsn = dsn
        self.postgres = postgres
        self.env = dict(env or {})
        self.workdir = workdir
        self.fault_log = os.path.join(workdir, "faults.jsonl")
        self.broker: Any = None
        self.kafka_proxy: Any = None
        self.pg_proxy: Any = None
        self.cluster: Any = None
        self.master = master
        self.conf: dict[str, str] = {}
        self._stops: list[Callable[[], None]] = []

    def __enter__(self) -> FaultKit:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        while self._stops:
            with contextlib.suppress(Exception):
                self._stops.pop()()

    def _setup(self) -> None:
        from connectors.toolkit.chaos.proxy import TcpProxy

        if "own-broker" in self.needs:
            from connectors.services._proc import free_port
            from connectors.services.apache_kafka import ApacheKafka

            if "kafka-proxy" in self.needs:
                port = free_port()
                self.kafka_proxy = TcpProxy("127.0.0.1", port).start()
                self._stops.append(self.kafka_proxy.close)
                self.broker = ApacheKafka(port=port, advertised_port=self.kafka_proxy.port, heap="384m")
            else:
                self.broker = ApacheKafka(heap="384m")
            self._stops.append(self.broker.stop)
            self.bootstrap = self.broker.bootstrap
        if "pg-server" in self.needs and (self.postgres is None or getattr(self.postgres, "kind", "env") == "env"):
            server = next(k for k in self.weights if "pg-server" in KINDS[k].needs)
            raise ConfigError(
                f"--faults {server}: needs the Postgres service spark-eos runs (an embedded or container one), "
                "to stop and start it"
            )
        if "pg-proxy" in self.needs:
            address = tcp_address(self.dsn)
            assert address is not None, "refuse() lets no such DSN through"
            self.pg_proxy = TcpProxy(*address).start()
            self._stops.append(self.pg_proxy.close)
            self.job_dsn = with_address(self.dsn, "127.0.0.1", self.pg_proxy.port)
        if "two-hosts" in self.needs:
            from connectors.toolkit.chaos.cluster import StandaloneCluster

            self.cluster = StandaloneCluster(os.path.join(self.workdir, "cluster"), env=self.env).start()
            self._stops.append(self.cluster.stop)
            self.master = self.cluster.url
            self.conf = dict(SPECULATION_CONF)
        elif "local-cluster" in self.needs:
            self.master = LOCAL_CLUSTER
            self.conf = {"spark.executor.memory": "768m"}
        if "small-disk" in self.needs:
            self._mount_small_disk()

    @property
    def checkpoint(self) -> str:
        """The job's checkpoint (the fault loop's ``workdir/checkpoint``)."""
        return os.path.join(self.workdir, "checkpoint")

    def _mount_small_disk(self) -> None:
        """The job's checkpoint on a tmpfs of ``DISK_MB`` (disk-full); at the end its files are copied back
        onto the workdir's disk, so the run leaves its checkpoint as every run does."""
        import subprocess

        path = self.checkpoint
        os.makedirs(path, exist_ok=True)
        if os.listdir(path):
            raise ConfigError(f"--faults disk-full: {path} is not empty; give the chaos run a fresh --workdir")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0755", "eos-disk-full", path],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ConfigError(
                f"--faults disk-full: cannot mount a tmpfs on {path} ({done.stderr.strip()}); run where root may "
                "mount (CAP_SYS_ADMIN), or drop disk-full"
            )
        self._stops.append(lambda: _unmount_keeping(path))

    # ---- faults from outside ------------------------------------------------------------------
    def disturb(self, name: str, feed: Callable[[], None] = lambda: None) -> dict[str, Any]:
        """Inject the ``outside`` kind ``name`` now (``feed``: what gives the job records while it is on) and
        wait until it has healed; what it saw (the proof)."""
        kind = KINDS[name]
        if kind.inject is None:
            raise ValueError(f"{name} is not a fault injected from outside")
        began = time.time()
        proof = kind.inject(self, feed)
        proof.update(began=round(began, 3), healed=round(time.time(), 3))
        return proof

    def pg_server(self, kind: str) -> dict[str, Any]:
        pg = self.postgres
        before = _pg_started(self.dsn)
        refused = False
        if kind == "pg-restart":
            pg.restart()
        elif kind == "pg-stop":
            refused = self._down(lambda: pg.restart(down=PG_STOP_DOWN), PG_STOP_DOWN)
        else:
            pg.crash()
            refused = _pg_refuses(self.dsn)
            time.sleep(PG_CRASH_DOWN)
            pg.start()
        after = _pg_started(self.dsn)
        ok = before is not None and after is not None and before != after and (kind == "pg-restart" or refused)
        return {
            "started_before": before,
            "started_after": after,
            "refused_while_down": refused,
            "ok": ok,
            "proof": f"postmaster started {before} -> {after}"
            + ("" if kind == "pg-restart" else f"; a connection while down {'was' if refused else 'was NOT'} refused"),
        }

    def _down(self, action: Callable[[], None], seconds: float) -> bool:
        """Run ``action`` (stop, stay down ``seconds``, start) while probing that the server refuses."""
        seen: list[bool] = []

        def probe() -> None:
            time.sleep(min(2.0, seconds / 2))
            seen.append(_pg_refuses(self.dsn))

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        action()
        t.join(10)
        return bool(seen and seen[0])

    def net(self, proxy: Any, kind: str) -> dict[str, Any]:
        stats = proxy.stats
        if kind.endswith("-cut"):
            before = stats.resets + stats.refused
            open_now = proxy.open_connections
            proxy.cut()
            time.sleep(CUT_SECONDS)
            proxy.heal()
            hit = stats.resets + stats.refused - before
            return {
                "connections_open": open_now,
                "reset_or_refused": hit,
                "ok": hit > 0,
                "proof": f"{hit} connections reset or refused in {CUT_SECONDS:.0f} s",
            }
        before = stats.stalled
        proxy.stall()
        time.sleep(STALL_SECONDS)
        proxy.heal()
        held = stats.stalled - before
        return {
            "connections_held": held,
            "ok": held > 0,
            "proof": f"{held} connections held without a byte for {STALL_SECONDS:.0f} s",
        }

    def fill_disk(self, feed: Callable[[], None]) -> dict[str, Any]:
        """Fill the checkpoint's filesystem to its last byte, feed the job records, keep it full until the job
        meets it (its log says so) for ``DISK_FULL_SECONDS``, then free it; a write while full must fail."""
        import errno

        path = self.checkpoint
        filler, probe = os.path.join(path, ".eos-disk-full"), os.path.join(path, ".eos-disk-probe")
        log = os.path.join(self.workdir, "pipeline.log")
        seen_from = os.path.getsize(log) if os.path.exists(log) else 0
        free_before = _free_bytes(path)
        with open(filler, "wb", buffering=0) as fh:
            with contextlib.suppress(OSError):
                os.posix_fallocate(fh.fileno(), 0, max(1, free_before))
            with contextlib.suppress(OSError):  # the last pages fallocate may have left
                while fh.write(b"\0" * 4096):
                    pass
        free_full = _free_bytes(path)
        refused = False
        try:
            with open(probe, "wb", buffering=0) as fh:
                fh.write(b"x" * 4096)
                os.fsync(fh.fileno())
        except OSError as exc:
            refused = exc.errno == errno.ENOSPC
        feed()
        shortest, longest = DISK_FULL_SECONDS
        started = time.monotonic()
        met = False
        while time.monotonic() - started < longest:
            met = met or _logged_since(log, seen_from, NO_SPACE)
            if met and time.monotonic() - started >= shortest:
                break
            time.sleep(0.2)
        full_for = time.monotonic() - started
        for f in (filler, probe):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f)
        return {
            "free_before": free_before,
            "free_while_full": free_full,
            "write_refused": refused,
            "job_met_it": met,
            "full_seconds": round(full_for, 1),
            "ok": refused and met,
            "proof": f"{free_before} bytes filled ({free_full} left); a write {'was' if refused else 'was NOT'} "
            f"refused (ENOSPC) for {full_for:.0f} s; the job {'met' if met else 'did NOT meet'} it ({NO_SPACE!r} "
            "in its log)",
        }

    def broker_fault(self, kind: str) -> dict[str, Any]:
        from connectors.services.embedded_kafka import kafka_reachable

        broker = self.broker
        old = broker.pid
        if kind == "broker-crash":
            broker.crash()
            gone = not _pid_alive(old)
            down_ok, _, _ = kafka_reachable(broker.bootstrap, 1.0)  # nobody answers while it is down
            time.sleep(BROKER_DOWN)
            broker.start()
        else:
            broker.restart()
            gone = not _pid_alive(old)
            down_ok = False
        new = broker.pid
        ok = gone and new != old and broker.running() and not down_ok
        return {
            "pid_before": old,
            "pid_after": new,
            "old_jvm_gone": gone,
            "ok": ok,
            "proof": f"broker JVM {old} {'SIGKILLed' if kind == 'broker-crash' else 'stopped'} "
            f"({'gone' if gone else 'STILL ALIVE'}), started again as {new}",
        }


# ---- faults inside the job's processes ------------------------------------------------------------


def executor_of(pid: int) -> int | None:
    """The executor JVM (CoarseGrainedExecutorBackend) that is an ancestor of process ``pid``."""
    from connectors.toolkit.harness import cmdline, parent_pid

    p = pid
    with contextlib.suppress(OSError, ValueError, IndexError):
        while p > 1:
            p = parent_pid(p)
            if "CoarseGrainedExecutorBackend" in cmdline(p):
                return p
    return None


def kill_executor(held_pid: int) -> dict[str, Any]:
    """SIGKILL the executor JVM running the task in process ``held_pid``, with its Python workers
    (found before any is killed, as a lost host loses them at once); the proof."""
    from connectors.services._proc import descendants

    executor = executor_of(held_pid)
    if executor is None:
        return {"ok": False, "proof": f"process {held_pid} (the held task) runs under no executor JVM"}
    doomed = [executor, *descendants(executor)]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_pid_alive(p) for p in doomed):
        time.sleep(0.1)
    left = [p for p in doomed if _pid_alive(p)]
    return {
        "executor": executor,
        "killed": doomed,
        "left": left,
        "ok": not left,
        "proof": f"executor JVM {executor} and {len(doomed) - 1} processes under it SIGKILLed"
        + (f"; STILL ALIVE: {left}" if left else ", all gone"),
    }


def firings(log: str, rule: str) -> list[dict[str, Any]]:
    from eos_core import faults

    return [e for e in faults.fired(log) if e.get("rule") == rule]


def speculative_copy(log: str, held: Mapping[str, Any], others_rule: str) -> dict[str, Any] | None:
    """Another attempt of the held task (same point, batch, partition, topic; another process) that
    passed the point while it was held: Spark's speculative copy."""
    t0 = float(held.get("time", 0))
    same = ("batch", "partition", "topic")
    for e in firings(log, others_rule):
        if (
            all(e.get(k) == held.get(k) for k in same)
            and e.get("pid") != held.get("pid")
            and t0 <= float(e.get("time", 0)) <= t0 + HOLD_SECONDS + 1
        ):
            return e
    return None


def iter_chaos_entries(log: str) -> Iterator[dict[str, Any]]:
    from eos_core import faults

    for e in faults.fired(log):
        if str(e.get("point", "")).startswith("chaos."):
            yield e
