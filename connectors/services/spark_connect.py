"""A Spark Connect server on loopback, from the installed PySpark's own jars: what a Connect client
(``SparkSession.builder.remote("sc://...")``, the Databricks-serverless way of reaching Spark) talks to.

The server is the driver: a query a client starts runs in it, with its Python data sources, planner
processes and ``foreachBatch`` functions in Python processes the server starts (``PYSPARK_PYTHON``: this
interpreter, so they see spark-eos). It runs as the leader of its own process group, which fault points fired
inside it kill (``EOS_FAULTS_PGID``: the driver and its Python processes at once, as a lost driver node), and
dies with the process that started it; ``start()`` after such a kill brings up a new server on the same port,
so a client reconnects to the same address and restarts its query from its checkpoint::

    with ConnectServer(workdir) as server:
        spark = SparkSession.builder.remote(server.remote).getOrCreate()
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from connectors.services import _proc, spark_cds
from connectors.services.spark import DEFAULT_CONF
from eos_core.errors import ServiceError
from eos_core.faults import ENV_PGID

__all__ = ["SERVER_CLASS", "ConnectServer"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_READY = "Spark Connect server started at"


class ConnectServer:
    """One Spark Connect server (``master``, Spark settings ``conf``, extra environment ``env``), its log in
    ``workdir/connect-server.log`` (appended across restarts)."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        master: str = "local[2,2]",
        conf: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        faults_group: int | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.master, self.conf, self.env = master, {**DEFAULT_CONF, **(conf or {})}, dict(env or {})
        # the process group fault points inside the server kill: its own (None), or its starter's (a job run under
        # the chaos toolkit: a kill of the job's group must take the server, and the server's kills the job)
        self.faults_group = faults_group
        self.port = _proc.free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log: IO[bytes] | None = None

    @property
    def remote(self) -> str:
        """The address a client gives ``SparkSession.builder.remote``."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "connect-server.log"

    def argv(self) -> list[str]:
        settings = {
            **self.conf,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
        }
        submit = str(spark_cds.spark_home() / "bin" / "spark-submit")
        confs = [part for k, v in settings.items() for part in ("--conf", f"{k}={v}")]
        return [submit, "--master", self.master, "--class", SERVER_CLASS, *confs, "spark-internal"]

    def start(self, timeout: float = 180.0) -> ConnectServer:
        """Start the server and wait until it serves (ServiceError, with its log's tail, if it exits or does not
        serve within ``timeout`` seconds)."""
        if self.running():
            return self
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_cds.spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            **self.env,
        }
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)  # a client's marker: the server is a classic driver
        before = self._ready_lines()
        self._closed()  # a server a fault point killed from inside: its log file was left open
        self._log = open(self.log_path, "ab")  # kept open while the server runs
        if self.faults_group is None:
            # the shell's pid is the group's (a new session): fault points in the server's processes kill that group
            argv = ["sh", "-c", f'export {ENV_PGID}=$$; exec "$@"', "sh", *self.argv()]
        else:
            argv, env[ENV_PGID] = self.argv(), str(self.faults_group)
        self.proc = _proc.spawn(argv, log=self._log, env=env, cwd=str(self.workdir))
        self.starts += 1
        _proc.register_cleanup(id(self), self.stop)
        deadline = time.monotonic() + timeout
        while self._ready_lines() <= before:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                state = f"exited with code {code}" if code is not None else f"did not serve within {timeout:.0f} s"
                raise ServiceError(
                    f"Spark Connect server {state}: {' '.join(self.argv()[:5])} ...\n{_proc.tail(self.log_path, 30)}"
                )
            time.sleep(0.2)
        return self

    def _ready_lines(self) -> int:
        try:
            return self.log_path.read_text(errors="replace").count(_READY)
        except FileNotFoundError:
            return 0

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL what is left after 20 s); a no-op when it is not running."""
        if self.proc is not None:
            _proc.stop_group(self.proc, self.proc.pid, grace=20.0)
        self._closed()

    def _closed(self) -> None:
        _proc.unregister_cleanup(id(self))
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ConnectServer({self.remote!r}, master={self.master!r}, starts={self.starts})"
