"""A Spark standalone cluster on this machine whose workers are two "hosts", for the ``slow-task`` fault.

Spark never starts a speculative copy of a task on the host of the original attempt, and every
executor of ``local[N]`` or ``local-cluster`` shares one host; so the chaos toolkit's ``slow-task``
fault (``spark-eos chaos --faults slow-task:1``) runs the job on a cluster of its own: a master on
127.0.0.1 and one-core workers bound to 127.0.0.2, 127.0.0.3 (each its own host to Spark; Linux
routes all of 127.0.0.0/8 to the loopback), started with ``spark-class`` from the pip-installed
PySpark. Workers pass their environment to the executors they launch: ``env`` gives them what a
job's tasks need (``PGPASSWORD``, the fault log). ``stop()`` leaves no process behind.

The suite's standalone-cluster tests (crash matrix F17-F19: a lost host, the master killed and
restarted with ``recovery``, the driver killed; speculation on another host) run on the same class:
``lose_host``, ``kill_master`` and ``start_master`` are the faults they inject.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from connectors.services._proc import _processes, free_port
from eos_core.errors import ConfigError

__all__ = ["WORKER_HOSTS", "StandaloneCluster", "worker_hosts_usable"]

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def worker_hosts_usable() -> str | None:
    """None when every worker host can be bound here, else why not (one line)."""
    for host in WORKER_HOSTS:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, 0))
            except OSError as exc:
                return f"cannot bind {host} ({exc.strerror}): the two worker hosts need 127.0.0.2 and 127.0.0.3 on the loopback (Linux)"
    if not os.path.exists(os.path.join(spark_home(), "bin", "spark-class")):
        return f"no bin/spark-class in the PySpark at {spark_home()}"
    return None


class StandaloneCluster:
    """A master and ``workers`` one-core workers (``WORKER_HOSTS``); ``url`` is the master's. ``recovery``:
    the master keeps its state in the cluster's directory (FILESYSTEM recovery), so a master started again
    after ``kill_master`` takes its workers and applications back."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        workers: int = 2,
        env: Mapping[str, str] | None = None,
        memory: str = "1g",
        recovery: bool = False,
    ) -> None:
        if not 1 <= workers <= len(WORKER_HOSTS):
            raise ConfigError(f"workers={workers}: 1 to {len(WORKER_HOSTS)}")
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="eos-cluster-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.memory = memory
        self.recovery = recovery
        self.env = dict(os.environ if env is None else env)
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.master_starts = 0  # the master's log of its n-th start is master-<n>.log
        self._killed: set[str] = set()  # daemons killed on purpose (kill_master, lose_host)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    @property
    def master_log(self) -> Path:
        """The log of the master running now (its latest start)."""
        return self.log(f"master-{self.master_starts}")

    def work_dir(self, i: int) -> Path:
        return self.root / f"work-{i}"

    def _start(self, name: str, cls: str, host: str, *args: str, **extra: str) -> None:
        home = spark_home()
        env = {k: v for k, v in self.env.items() if not k.startswith("EOS_FAULTS")}  # per run: spark.executorEnv
        env.update(
            SPARK_HOME=home,
            SPARK_LOCAL_IP=host,
            SPARK_PUBLIC_DNS=host,
            SPARK_LOG_DIR=str(self.root),
            SPARK_NO_DAEMONIZE="1",
            **extra,
        )
        if self.env.get("EOS_FAULTS_LOG"):  # fixed for a chaos run: the executors' firings go there
            env["EOS_FAULTS_LOG"] = self.env["EOS_FAULTS_LOG"]
        with open(self.log(name), "ab") as fh:
            self.procs[name] = subprocess.Popen(
                [
                    f"{home}/bin/spark-class",
                    cls,
                    "--host",
                    host,
                    "--webui-port",
                    str(free_port()),
                    "--properties-file",
                    str(self.root / "spark-cluster.conf"),
                    *args,
                ],
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        conf = "spark.ui.enabled false\nspark.worker.timeout 15\n"  # a lost worker is noticed within 15 s
        if self.recovery:
            (self.root / "recovery").mkdir(exist_ok=True)
            conf += f"spark.deploy.recoveryMode FILESYSTEM\nspark.deploy.recoveryDirectory {self.root / 'recovery'}\n"
        (self.root / "spark-cluster.conf").write_text(conf)
        try:
            self.start_master(timeout)
            for i in range(self.workers):
                self.start_worker(i)
            self._wait(self.master_log, "Registering worker", self.workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_master(self, timeout: float = 180.0) -> None:
        """Start the master (again, after ``kill_master``: with ``recovery`` it takes the cluster back)."""
        self.master_starts += 1
        name = f"master-{self.master_starts}"
        self._start(name, "org.apache.spark.deploy.master.Master", "127.0.0.1", "--port", str(self.port))
        self._wait(self.log(name), "I have been elected leader", 1, timeout)

    def start_worker(self, i: int) -> None:
        """Start worker ``i`` on ``WORKER_HOSTS[i]`` (again, after ``lose_host``: a replacement machine)."""
        self.work_dir(i).mkdir(exist_ok=True)
        self._killed.discard(f"worker-{i}")
        # executors' local dirs (where each unpacks a shipped environment) under the root: an executor
        # SIGKILLed with its host never removes its own
        self._start(
            f"worker-{i}",
            "org.apache.spark.deploy.worker.Worker",
            WORKER_HOSTS[i],
            "--cores",
            "1",
            "--memory",
            self.memory,
            "--work-dir",
            str(self.work_dir(i)),
            self.url,
            SPARK_LOCAL_DIRS=str(self.root / f"local-{i}"),
        )

    def _wait(self, path: Path, text: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.read_text(errors="replace").count(text) >= count:
                return
            if any(p.poll() is not None for n, p in self.procs.items() if n not in self._killed):
                break  # a daemon died on its own: it will not log it
            time.sleep(0.3)
        tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:]) if path.exists() else ""
        raise RuntimeError(f"the standalone cluster's {path.stem} did not log {text!r} within {timeout:.0f}s:\n{tail}")

    def kill_master(self) -> int:
        """SIGKILL the running master; its pid."""
        return self._kill_group(f"master-{self.master_starts}")

    def lose_host(self, i: int) -> list[int]:
        """SIGKILL everything worker ``i`` runs, as if its machine died: the worker JVM, its executors and
        their Python workers (PySpark's daemon moves those into a group of their own; they are found by
        their working directory, the executor's dir under the worker's work dir). All are found before any
        is killed: killed one by one, an executor's death would let its daemon end the Python workers
        first, and the list would miss them. The pids, the worker's first."""
        group = self.procs[f"worker-{i}"].pid
        doomed = {pid for pid, _, pgid in _processes() if pgid == group} | set(_running_in(self.work_dir(i)))
        self._kill_group(f"worker-{i}")
        _kill_all(doomed)
        return [group, *sorted(doomed - {group})]

    def worker_of(self, pid: int) -> int | None:
        """Which worker's host runs process ``pid`` (by its working directory), if any."""
        cwd = _cwd(pid)
        for i in range(self.workers):
            if cwd is not None and cwd.startswith(str(self.work_dir(i))):
                return i
        return None

    def _kill_group(self, name: str) -> int:
        self._killed.add(name)
        p = self.procs[name]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        return p.pid

    def stop(self) -> None:
        """SIGKILL the master, the workers, their executors and Python workers; remove a temp root."""
        for name in list(self.procs):
            self._kill_group(name)
        _kill_all(self.leftovers())  # executors' Python workers leave their JVM's group
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Processes of the cluster still alive: in a daemon's group, or working under its directory."""
        groups = {p.pid for p in self.procs.values()}
        in_group = {pid for pid, _, pgid in _processes() if pgid in groups and pid != os.getpid()}
        return sorted(in_group | set(_running_in(self.root)))

    def alive(self, wait: float = 10.0) -> list[int]:
        """``leftovers`` after up to ``wait`` seconds for killed ones to go: [] after ``stop()``."""
        deadline = time.monotonic() + wait
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone, or a zombie
        return None


def _running_in(directory: Path) -> list[int]:
    """Live processes (not this one) whose working directory is under ``directory``."""
    prefix = str(directory)
    return [pid for pid, _, _ in _processes() if pid != os.getpid() and (_cwd(pid) or "").startswith(prefix)]


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
