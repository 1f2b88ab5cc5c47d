"""Kafka and Postgres in containers (testcontainers, host network, 127.0.0.1), with container faults.

Kafka is Apache Kafka in KRaft mode either way: on a user's engine the upstream ``apache/kafka``
image (tag in ``services/images.py``), on the suite's private engine spark-eos/kafka, the embedded
broker (``services/apache_kafka.py``: the same jars and rendered configuration) built locally with its
log segments on a host volume, so a SIGKILLed container starts again on what it had written.
``ContainerKafka(broker="tansu")`` runs the local tansu image instead (memory storage)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from connectors.services import docker as engines
from connectors.services import images
from connectors.services._proc import free_port
from connectors.services.apache_kafka import cluster_id, coordinators_ready, kafka_version
from connectors.services.base import KafkaService, PostgresService
from connectors.services.embedded_kafka import tansu_args
from eos_core.errors import ServiceError

__all__ = [
    "BROKERS",
    "LOCAL_KAFKA_VOLUME",
    "UPSTREAM_KAFKA",
    "UPSTREAM_POSTGRES",
    "ContainerKafka",
    "ContainerPostgres",
    "engine_available",
    "image_mode",
    "kafka_container",
    "postgres_container",
]

log = logging.getLogger(__name__)

# Upstream images for a machine whose Docker can pull (the pinned tags live in services/images.py).
UPSTREAM_KAFKA = images.KAFKA_IMAGE
UPSTREAM_POSTGRES = images.POSTGRES_IMAGE
# The local spark-eos/kafka image keeps server.properties and the log segments (data/) here: the
# container's volume, a host directory bind-mounted at this path (docker/kafka/entrypoint.sh).
LOCAL_KAFKA_VOLUME = "/var/lib/eos-kafka"

READY_TIMEOUT = 120.0
LOOPBACK = "127.0.0.1"
BROKERS = ("apache", "tansu")


def engine_available() -> bool:
    """True when containers can run: the user's engine answers, or EOS_START_DOCKERD=1 started one.

    With EOS_START_DOCKERD=1 a failure to start the engine raises ServiceError (asked for, so never
    silently replaced by embedded services)."""
    return engines.get_engine() is not None


def _engine() -> engines.Engine:
    engine = engines.get_engine()
    if engine is None:
        raise ServiceError(
            "no Docker engine answers: start Docker (or set DOCKER_HOST), or set EOS_START_DOCKERD=1 as root"
        )
    return engine


def image_mode(engine: engines.Engine | None = None) -> str:
    """``local`` (spark-eos/* images built here) or ``upstream`` (apache/kafka, postgres).

    ``EOS_DOCKER_IMAGES`` chooses; by default an engine spark-eos started itself (no registry
    here) uses local images and a user's engine uses upstream ones."""
    mode = os.environ.get("EOS_DOCKER_IMAGES", "").strip().lower()
    if mode in ("local", "upstream"):
        return mode
    if mode:
        raise ServiceError(f"EOS_DOCKER_IMAGES={mode!r} is not valid: use 'local' or 'upstream'")
    engine = engine or _engine()
    return "local" if engine.owned else "upstream"


class _Container:
    """One container of ours: created through testcontainers on the host network, never a bridge."""

    kind: Any = "container"
    last_exit_code: int | None = None
    role = "service"
    volume: str | None = None  # a host directory of this container's, bind-mounted; removed by stop()

    def __init__(
        self,
        engine: engines.Engine,
        image: str,
        *,
        command: list[str] | None,
        env: dict[str, str],
        volumes: tuple[tuple[str, str], ...] = (),
        stop_signal: str = "SIGTERM",
    ) -> None:
        # testcontainers' reaper (ryuk) cannot be pulled here; we remove our containers ourselves.
        os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
        from testcontainers.core.config import testcontainers_config
        from testcontainers.core.container import DockerContainer

        testcontainers_config.ryuk_disabled = True
        self.engine = engine
        self.image = image
        name = f"eos-{self.role}-{engine.session}-{os.urandom(2).hex()}"
        tc = DockerContainer(image, docker_client_kw={"environment": engine.env()}, env=env)
        if command:
            tc = tc.with_command(command)
        for host, target in volumes:
            tc = tc.with_volume_mapping(host, target, "rw")
        self._tc = tc.with_name(name).with_kwargs(
            network_mode="host", labels={engines.LABEL: engine.session}, stop_signal=stop_signal
        )
        self.name = name
        self._started = False

    def _create(self) -> None:
        try:
            self._tc.start()
        except Exception as exc:
            self._remove()
            raise ServiceError(
                f"could not start container {self.name} from {self.image}: {exc}", image=self.image
            ) from exc
        self._started = True
        mode = self.network_mode()
        if mode != "host":  # the default bridge is off-limits: refuse anything but the host network
            self._remove()
            raise ServiceError(f"container {self.name} got network mode {mode!r}, expected 'host'")

    @property
    def container(self) -> Any:
        return self._tc.get_wrapped_container()

    @property
    def container_id(self) -> str:
        return str(self.container.id)

    def inspect(self) -> dict[str, Any]:
        return dict(self.engine.client().api.inspect_container(self.name))

    def network_mode(self) -> str:
        return str(self.inspect()["HostConfig"]["NetworkMode"])

    def status(self) -> str:
        return str(self.inspect()["State"]["Status"])

    def running(self) -> bool:
        """The container runs and is not frozen (the harness restarts a crashed shared Postgres)."""
        try:
            return self.status() == "running"
        except Exception:  # removed or engine gone: not running
            return False

    def logs(self, tail: int = 60) -> str:
        with contextlib.suppress(Exception):
            return self.container.logs(tail=tail).decode(errors="replace")  # type: ignore[no-any-return]
        return ""

    def kill(self, sig: str = "SIGKILL") -> int:
        """Send ``sig`` to the container's PID 1 (the server itself) and wait until it has exited."""
        self.container.kill(signal=sig)
        deadline = time.monotonic() + 30
        while self.status() not in ("exited", "dead"):
            if time.monotonic() > deadline:
                raise ServiceError(f"container {self.name} still {self.status()} 30s after {sig}")
            time.sleep(0.1)
        self.last_exit_code = int(self.inspect()["State"]["ExitCode"])
        return self.last_exit_code

    def pause(self) -> None:
        """Freeze every process of the container (cgroup freezer): sockets stay open, nothing answers."""
        self.container.pause()

    def unpause(self) -> None:
        self.container.unpause()

    def _wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until the service in the container answers (each service says how)."""
        raise NotImplementedError

    def _launch(self) -> None:
        """Create and start the container, wait until the subclass's ``_wait_ready`` passes (the
        container is removed again if it does not) and record how long that took."""
        t0 = time.monotonic()
        try:
            self._create()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0

    def _start_again(self) -> None:
        self.container.start()

    def _remove(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.client().containers.get(self.name).remove(force=True, v=True)

    def stop(self) -> None:
        """Remove the container and its host volume directory. Safe to call twice."""
        self._remove()
        self._started = False
        if self.volume and os.path.isdir(self.volume):
            shutil.rmtree(self.volume, ignore_errors=True)

    def addresses(self) -> list[str]:
        """Every address this service hands out (to check that traffic stays on loopback)."""
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ContainerKafka(_Container, KafkaService):
    """A Kafka broker in a container, Apache Kafka in KRaft mode (one node, broker and controller):
    the local spark-eos/kafka image (the embedded broker's jars and configuration, data on a host
    volume) or the upstream apache/kafka one, by ``mode``. ``broker="tansu"`` runs the local tansu
    image instead, in either mode (memory storage: a restarted tansu has lost everything)."""

    role = "kafka"

    def __init__(
        self, engine: engines.Engine | None = None, *, mode: str | None = None, broker: str = "apache"
    ) -> None:
        if broker not in BROKERS:
            raise ServiceError(f"broker={broker!r} is not one of {', '.join(BROKERS)}")
        engine = engine or _engine()
        self.mode = mode or image_mode(engine)
        self.is_tansu = broker == "tansu"
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.bootstrap = f"{LOOPBACK}:{self.port}"
        self.version = ""  # the Apache Kafka version this image runs ("" for tansu)
        volumes: tuple[tuple[str, str], ...] = ()
        command: list[str] | None = None
        env: dict[str, str] = {}
        if self.is_tansu:
            image = engines.local_image(engine, "tansu")
            command = tansu_args(f"tcp://{LOOPBACK}:{self.port}")
        elif self.mode == "local":
            image = engines.local_image(engine, "kafka")
            self.version = kafka_version()
            self.volume = tempfile.mkdtemp(prefix="eos-kafka-volume-")
            os.chmod(self.volume, 0o755)
            volumes = ((self.volume, LOCAL_KAFKA_VOLUME),)
            env = {
                "KAFKA_PORT": str(self.port),
                "KAFKA_CONTROLLER_PORT": str(self.controller_port),
                "KAFKA_CLUSTER_ID": cluster_id(),
            }
        else:
            image = UPSTREAM_KAFKA
            self.version = UPSTREAM_KAFKA.rpartition(":")[2]
            ctl = self.controller_port
            env = {
                "KAFKA_NODE_ID": "1",
                "KAFKA_PROCESS_ROLES": "broker,controller",
                "KAFKA_LISTENERS": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{ctl}",
                "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{LOOPBACK}:{self.port}",
                "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@{LOOPBACK}:{ctl}",
                "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
                "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
                # as the embedded broker: a broker started again after a crash is not refused for 9 s
                "KAFKA_BROKER_HEARTBEAT_INTERVAL_MS": "500",
                "KAFKA_BROKER_SESSION_TIMEOUT_MS": "3000",
            }
        super().__init__(engine, image, command=command, env=env, volumes=volumes)
        self._launch()

    def addresses(self) -> list[str]:
        return [self.bootstrap]

    @property
    def data_dir(self) -> Path | None:
        """The broker's log segments on the host (the local Apache Kafka image only)."""
        return Path(self.volume) / "data" if self.volume else None

    def _wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Metadata answers; for Apache Kafka also the transaction and group coordinators (as the
        embedded broker's health check: metadata alone answers before they have loaded their topics)."""
        from confluent_kafka.admin import AdminClient

        # log_level 0: no "Connection refused" line every 50 ms on stderr while the JVM boots
        conf: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.bootstrap,
            "socket.connection.setup.timeout.ms": 2000,
            "log_level": 0,
        }
        admin = AdminClient(conf)
        deadline = time.monotonic() + timeout
        while True:
            last: object
            try:
                if not admin.list_topics(timeout=2).brokers:
                    last = "no brokers in metadata"
                elif self.is_tansu:
                    return
                else:
                    ok, last = coordinators_ready(self.bootstrap, min(10.0, max(1.0, deadline - time.monotonic())))
                    if ok:
                        return
            except Exception as exc:  # KafkaException while the broker boots: retried until the deadline
                last = exc
            if self.status() in ("exited", "dead"):
                raise ServiceError(f"Kafka container {self.name} exited while starting: {self.logs()}")
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"Kafka container {self.name} did not answer on {self.bootstrap} within {timeout:.0f}s: {last}; logs: {self.logs()}"
                )
            time.sleep(0.3)

    def start(self) -> None:
        """Start the (killed or stopped) container again on the same ports and volume and wait until
        it is healthy. Apache Kafka serves what it had written; tansu comes back empty."""
        self._start_again()
        self._wait_ready()

    def restart(self) -> None:
        """A clean stop (SIGTERM: Kafka's controlled shutdown), then ``start()``."""
        self.kill("SIGTERM")
        self.start()


class ContainerPostgres(_Container, PostgresService):
    """PostgreSQL in a container with its data directory on a host bind mount, so a SIGKILLed server
    starts again on the same data (prepared transactions and all)."""

    role = "postgres"

    def __init__(
        self, engine: engines.Engine | None = None, *, mode: str | None = None, settings: dict[str, str] | None = None
    ) -> None:
        engine = engine or _engine()
        self.mode = mode or image_mode(engine)
        self.port = free_port()
        # trust authentication, and only on 127.0.0.1 inside the host's network namespace
        self.dsn = f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres"
        self.volume = tempfile.mkdtemp(prefix="eos-pg-volume-")
        os.chmod(self.volume, 0o755)
        extra: list[str] = []
        for k, v in (settings or {}).items():
            extra += ["-c", f"{k}={v}"]
        if self.mode == "local":
            image = engines.local_image(engine, "postgres")
            target = "/var/lib/eos-postgres"
            env = {"PG_PORT": str(self.port), "PGDATA": f"{target}/data"}
            command = extra or None
        else:
            image = UPSTREAM_POSTGRES
            target = "/var/lib/postgresql/data"
            env = {"POSTGRES_HOST_AUTH_METHOD": "trust", "PGDATA": f"{target}/pgdata"}
            command = [
                "postgres",
                "-p",
                str(self.port),
                "-c",
                f"listen_addresses={LOOPBACK}",
                "-c",
                "max_prepared_transactions=64",
                *extra,
            ]
        # SIGINT = fast shutdown for `docker stop`; SIGTERM (smart) would wait for every client.
        super().__init__(
            engine, image, command=command, env=env, volumes=((self.volume, target),), stop_signal="SIGINT"
        )
        self._launch()

    def addresses(self) -> list[str]:
        return [f"{LOOPBACK}:{self.port}"]

    def _wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:  # refused/starting up/in recovery: retried
                last = exc
            if self.status() in ("exited", "dead"):
                raise ServiceError(f"Postgres container {self.name} exited while starting: {self.logs()}")
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"Postgres container {self.name} not ready on {self.dsn} within {timeout:.0f}s: {last}; logs: {self.logs()}"
                )
            time.sleep(0.2)

    def crash(self) -> None:
        """SIGKILL the postmaster (the container's PID 1): no shutdown checkpoint, like a power cut
        of the server process. ``last_exit_code`` then holds the container's exit code (137)."""
        self.kill("SIGKILL")

    def start(self) -> None:
        """Start the container again on the same data volume and wait until it accepts queries."""
        self._start_again()
        self._wait_ready()

    def restart(self, down: float = 0.0) -> None:
        """Clean stop (SIGINT: fast shutdown), ``down`` seconds stopped, and start on the same data."""
        self.container.stop(timeout=30)
        time.sleep(down)
        self.start()

    @property
    def data_dir(self) -> Path:
        assert self.volume is not None
        return Path(self.volume)


def kafka_container() -> ContainerKafka:
    """A started Kafka container (``kind == "container"``); ``stop()`` removes it."""
    return ContainerKafka()


def postgres_container() -> ContainerPostgres:
    """A started Postgres container with a data volume (``crash``/``start``/``restart``/``stop``)."""
    return ContainerPostgres()
