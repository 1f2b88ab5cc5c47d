"""A Spark standalone cluster on this machine whose workers are two "hosts", for the ``slow-task`` fault.

Spark never starts a speculative copy of a task on the host of the original attempt, and every
executor of ``local[N]`` or ``local-cluster`` shares one host; so the chaos toolkit's ``slow-task``
fault (``spark-eos chaos --faults slow-task:1``) runs the job on a cluster of its own: a master on
127.0.0.1 and one-core workers bound to 127.0.0.2, 127.0.0.3 (each its own host to Spark; Linux
routes all of 127.0.0.0/8 to the loopback), started with ``spark-class`` from the pip-installed
PySpark. Workers pass their environment to the executors they launch: ``env`` gives them what a
job's tasks need (``PGPASSWORD``, the fault log). ``stop()`` leaves no process behind.
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
from collections.abc import Mapping
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
    """A master and ``workers`` one-core workers (``WORKER_HOSTS``); ``url`` is the master's."""

    def __init__(
        self, root: str | None = None, *, workers: int = 2, env: Mapping[str, str] | None = None, memory: str = "1g"
    ) -> None:
        if not 1 <= workers <= len(WORKER_HOSTS):
            raise ConfigError(f"workers={workers}: 1 to {len(WORKER_HOSTS)}")
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="eos-cluster-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.memory = memory
        self.env = dict(os.environ if env is None else env)
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

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
        (self.root / "spark-cluster.conf").write_text("spark.ui.enabled false\nspark.worker.timeout 15\n")
        try:
            self._start("master", "org.apache.spark.deploy.master.Master", "127.0.0.1", "--port", str(self.port))
            self._wait("master", "I have been elected leader", 1, timeout)
            for i in range(self.workers):
                self.work_dir(i).mkdir(exist_ok=True)
                # executors' local dirs under the root: one SIGKILLed (a lost host) never removes its own
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
            self._wait("master", "Registering worker", self.workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, name: str, text: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        path = self.log(name)
        while time.monotonic() < deadline:
            if path.exists() and path.read_text(errors="replace").count(text) >= count:
                return
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:]) if path.exists() else ""
        raise RuntimeError(f"the standalone cluster's {name} did not log {text!r} within {timeout:.0f}s:\n{tail}")

    def stop(self) -> None:
        """SIGKILL the master, the workers, their executors and Python workers; remove a temp root."""
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for pid in self.leftovers():  # executors' Python workers leave their JVM's group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Processes of the cluster still alive: in a daemon's group, or working under its directory."""
        groups = {p.pid for p in self.procs.values()}
        prefix = str(self.root)
        out = []
        for pid, _, pgid in _processes():
            if pid == os.getpid():
                continue
            if pgid in groups:
                out.append(pid)
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/cwd").startswith(prefix):
                    out.append(pid)
        return sorted(out)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
