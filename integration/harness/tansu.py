"""A dedicated tansu broker that advertises another address (a proxy in front of it) for F9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Any

from connectors.services._proc import free_port
from connectors.services.embedded_kafka import tansu_args, tansu_binary

__all__ = ["Broker", "free_port", "tansu_binary"]


class Broker:
    """tansu on 127.0.0.1:``port`` advertising 127.0.0.1:``advertised`` (memory storage)."""

    def __init__(self, *, port: int | None = None, advertised: int | None = None, log_path: str | None = None) -> None:
        self.port = port or free_port()
        self.advertised = advertised or self.port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised}"

    def start(self, timeout: float = 30.0) -> Broker:
        self._close_log()  # a restart after the broker died on its own
        self._log = out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [tansu_binary(), *tansu_args(f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.advertised}")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"tansu did not listen on {self.port} within {timeout}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self._log = None

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
