"""The fault kit of a chaos run: what the fault kinds drawn need (``kinds.NEEDS``), set up before the run's
first run of the job and torn down after its last, and the injectors of the kinds (``kinds.KINDS``).

A broker of the run's own (with a TCP proxy in front, which it advertises, when Kafka's connections are
cut or stalled: clients connect where the broker tells them), a proxy in front of Postgres, a standalone
cluster of two worker hosts for ``slow-task``, ``local-cluster`` for ``executor-loss``, a tmpfs under the
job's checkpoint for ``disk-full``. Each injector waits until its fault has healed and returns its proof,
which the fault loop appends to the run's fault log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from connectors.toolkit.chaos.kinds import DISK_MB, HOLD_SECONDS, KINDS, needed, tcp_address
from eos_core.errors import ConfigError

__all__ = [
    "LOCAL_CLUSTER",
    "SPECULATION_CONF",
    "FaultKit",
    "executor_of",
    "firings",
    "iter_chaos_entries",
    "kill_executor",
    "speculative_copy",
    "with_address",
]

CUT_SECONDS = 4.0
STALL_SECONDS = 6.0
PG_CRASH_DOWN = 3.0
PG_STOP_DOWN = 6.0
BROKER_DOWN = 3.0
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
        self.kafka_config: str | None = None  # a broker of its own: its client properties ("" plaintext)
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
            from connectors.services import embedded_kafka_security
            from connectors.services._proc import free_port
            from connectors.services.apache_kafka import ApacheKafka

            security = embedded_kafka_security()  # as the embedded services: EOS_KAFKA_SECURITY
            if "kafka-proxy" in self.needs:
                port = free_port()
                self.kafka_proxy = TcpProxy("127.0.0.1", port).start()
                self._stops.append(self.kafka_proxy.close)
                self.broker = ApacheKafka(
                    port=port, advertised_port=self.kafka_proxy.port, heap="384m", security=security
                )
            else:
                self.broker = ApacheKafka(heap="384m", security=security)
            self._stops.append(self.broker.stop)
            self.bootstrap = self.broker.bootstrap
            self._name_kafka_config(self.broker.client_properties() if self.broker.secured else None)
        elif "kafka-cluster" in self.needs:  # refuse() lets no single broker's kind beside it
            from connectors.services import embedded_kafka_security
            from connectors.services.kafka_cluster import KafkaCluster

            self.broker = KafkaCluster(heap="320m", security=embedded_kafka_security())
            self._stops.append(self.broker.stop)
            self.bootstrap = self.broker.bootstrap
            self._name_kafka_config(self.broker.client_properties() if self.broker.secured else None)
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

    def _name_kafka_config(self, path: Any) -> None:
        """While the kit is up its own broker is the run's: ``EOS_KAFKA_CONFIG`` names that broker's admin
        properties (none on a plaintext one) in this process, for the toolkit's producers and checkers, and
        ``kafka_config`` for the jobs' runs; the variable is restored at ``close``."""
        from eos_core.kafka_config import CONFIG_ENV

        before = os.environ.get(CONFIG_ENV)
        self.kafka_config = str(path) if path is not None else ""
        if self.kafka_config:
            os.environ[CONFIG_ENV] = self.kafka_config
        else:
            os.environ.pop(CONFIG_ENV, None)

        def restore() -> None:
            if before is None:
                os.environ.pop(CONFIG_ENV, None)
            else:
                os.environ[CONFIG_ENV] = before

        self._stops.append(restore)

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

    def lose_executor(self, held: Mapping[str, Any]) -> dict[str, Any]:
        """executor-loss: SIGKILL the executor running the held task, with its Python workers."""
        return kill_executor(int(held["pid"]))

    def speculate(self, held: Mapping[str, Any], others_rule: str) -> dict[str, Any]:
        """slow-task: wait out the hold, then find Spark's copy of the held task in the fault log."""
        time.sleep(max(0.0, float(held["time"]) + HOLD_SECONDS + 1 - time.time()))
        copy = speculative_copy(self.fault_log, held, others_rule)
        fields = ("pid", "partition", "attempt", "time")
        return {
            "held": {k: held.get(k) for k in fields},
            "copy": None if copy is None else {k: copy.get(k) for k in fields},
            "ok": copy is not None,
            "proof": (
                f"held {HOLD_SECONDS:.0f} s; a copy ran meanwhile (pid {copy.get('pid')}, "
                f"attempt {copy.get('attempt', '?')})"
                if copy
                else f"held {HOLD_SECONDS:.0f} s; Spark ran NO copy of it meanwhile (speculation did not start)"
            ),
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

    def cluster_fault(self, kind: str, feed: Callable[[], None]) -> dict[str, Any]:
        """``leader-kill``: the node leading most of the run's partitions SIGKILLed, down BROKER_DOWN seconds
        (the producer writes meanwhile), started again; ``rolling-restart``: every node restarted in turn,
        replicas in sync before the next (the producer writes after the first). The proof: the JVMs gone and
        their successors, the leaderships that moved."""
        cluster = self.broker
        if kind == "leader-kill":
            led = _leaders(cluster)
            node_id = max(led, key=lambda n: (len(led[n]), -n))
            node = cluster.node(node_id)
            old = node.pid
            node.crash()
            gone = not _pid_alive(old)
            wait_until_led = time.monotonic() + 30
            moved: dict[str, int] = {}
            while time.monotonic() < wait_until_led and len(moved) < len(led[node_id]):
                now = cluster.partitions(sorted({t for t, _ in led[node_id]}))
                moved = {
                    f"{t}-{p}": int(now[(t, p)].leader)
                    for t, p in led[node_id]
                    if now[(t, p)].leader not in (-1, node_id)
                }
                time.sleep(0.2)
            feed()
            time.sleep(BROKER_DOWN)
            node.start()
            cluster.wait_in_sync(120)
            ok = gone and len(moved) == len(led[node_id]) and node.pid != old and node.running()
            return {
                "node": node_id,
                "pid_before": old,
                "pid_after": node.pid,
                "moved": moved,
                "ok": ok,
                "proof": f"node {node_id} (leader of {len(led[node_id])} partitions) JVM {old} SIGKILLed "
                f"({'gone' if gone else 'STILL ALIVE'}); {len(moved)} leaderships moved: {moved}; started as {node.pid}",
            }
        restarts = []
        for i, node in enumerate(cluster.nodes):
            cluster.wait_in_sync(120)
            old = node.pid
            node.restart()
            restarts.append(
                {"node": node.node_id, "pid_before": old, "pid_after": node.pid, "gone": not _pid_alive(old)}
            )
            if i == 0:
                feed()
        cluster.wait_in_sync(120)
        ok = all(r["gone"] and r["pid_after"] != r["pid_before"] for r in restarts) and cluster.running()
        return {
            "restarts": restarts,
            "ok": ok,
            "proof": "nodes restarted in turn: "
            + ", ".join(f"{r['node']} ({r['pid_before']} -> {r['pid_after']})" for r in restarts),
        }


def _leaders(cluster: Any) -> dict[int, list[tuple[str, int]]]:
    """Node -> the partitions of the cluster's own topics (not the internal ones) it leads now."""
    led: dict[int, list[tuple[str, int]]] = {n.node_id: [] for n in cluster.nodes}
    for (topic, partition), p in cluster.partitions().items():
        if not topic.startswith("__") and p.leader in led:
            led[p.leader].append((topic, partition))
    return led


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
