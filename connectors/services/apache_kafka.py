"""Embedded Apache Kafka: a single-node KRaft broker (broker and controller in one JVM) from Maven Central jars.

The jars of ``org.apache.kafka:kafka_2.13`` and their runtime dependencies are fetched once with the
Apache Ivy that PySpark ships (``pyspark/jars/ivy-*.jar``), so no Maven or Kafka install is needed,
and cached in ``${XDG_CACHE_HOME:-~/.cache}/spark-eos/kafka-<version>/``. ``EOS_KAFKA_JARS`` names a
directory of jars instead (a Kafka distribution's ``libs/`` works), ``EOS_KAFKA_VERSION`` another
version, ``EOS_MAVEN_REPO`` a Maven mirror.

The broker keeps its log segments on disk in a temp dir, so ``crash()`` (SIGKILL) and ``start()``
keep what was written, like a real broker after a process crash.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from connectors.services import _proc
from connectors.services.base import KafkaService
from connectors.services.embedded_kafka import _silent_logger, kafka_reachable
from connectors.services.kafka_security import SECURITY, Principal, Secured
from connectors.services.maven import (
    CACHE_ENV,
    MARKER,
    REPO_ENV,
    RESOLVE_TIMEOUT,
    cache_root,
    java_binary,
    resolve_module,
)
from eos_core.errors import ServiceError
from eos_core.kafka_config import render_properties

__all__ = [
    "CACHE_ENV",
    "CDS_ENV",
    "JARS_ENV",
    "KAFKA_VERSION",
    "MANAGED_KEYS",
    "REPO_ENV",
    "VERSION_ENV",
    "ApacheKafka",
    "Principal",
    "broker_properties",
    "cache_root",
    "coordinators_ready",
    "ivy_module",
    "java_binary",
    "jvm_options",
    "kafka_jars",
    "kafka_version",
    "log4j2_properties",
    "render_properties",
    "resolve_jars",
    "without_class_archives",
]

KAFKA_VERSION = "4.4.0"  # the newest 4.x on Maven Central when this was written (2026-11)
SCALA_VERSION = "2.13"
# Kafka's own dependencies bring log4j-api/core but no SLF4J binding (its distribution adds one):
# without it the broker would log nothing. Ivy's conflict manager keeps one log4j version for all three.
LOG4J_VERSION = "2.25.5"
VERSION_ENV = "EOS_KAFKA_VERSION"
JARS_ENV = "EOS_KAFKA_JARS"
CDS_ENV = "EOS_KAFKA_CDS"

START_TIMEOUT = 90.0
STOP_GRACE = 20.0
_PORT_ATTEMPTS = 3
_TMP_PREFIX = "eos-apache-kafka-"
_HEALTH_PREFIX = "spark-eos-health-"

# Set by ApacheKafka from its ports and temp dir; a ``config`` entry naming one is refused.
MANAGED_KEYS = frozenset(
    {
        "process.roles",
        "node.id",
        "broker.id",
        "listeners",
        "advertised.listeners",
        "listener.security.protocol.map",
        "controller.listener.names",
        "inter.broker.listener.name",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
        "log.dirs",
        "log.dir",
        "metadata.log.dir",
        # with security="sasl_ssl": the listeners' security, the principals and the authorizer
        "sasl.enabled.mechanisms",
        "sasl.mechanism.inter.broker.protocol",
        "sasl.mechanism.controller.protocol",
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "authorizer.class.name",
        "allow.everyone.if.no.acl.found",
        "super.users",
    }
)

# A single node on a small machine: internal topics with one replica and few partitions, no rebalance
# delay, and a short broker session so that a broker started again after a crash is not refused for
# the 9 s default while the controller still holds its old registration.
DEFAULT_CONFIG: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
}

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)([.-][A-Za-z0-9]+)*$")
_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR")
_HEAP_RE = re.compile(r"^\d+[kmgKMG]?$")


# ---- versions, places, programs -----------------------------------------------------------------
def kafka_version(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The Kafka version to run: ``explicit``, ``EOS_KAFKA_VERSION``, else KAFKA_VERSION; 4.x or later."""
    env = os.environ if environ is None else environ
    version = (explicit or env.get(VERSION_ENV) or KAFKA_VERSION).strip()
    source = "version" if explicit else VERSION_ENV if env.get(VERSION_ENV) else "KAFKA_VERSION"
    m = _VERSION_RE.match(version)
    if not m:
        raise ServiceError(f"{source}={version!r} is not a Kafka version like {KAFKA_VERSION}", version=version)
    if int(m.group(1)) < 4:
        raise ServiceError(
            f"{source}={version!r}: the embedded Apache Kafka needs Kafka 4.x or later (KRaft only, log4j2); "
            f"use e.g. {KAFKA_VERSION}, or run an older broker yourself and point EOS_KAFKA_BOOTSTRAP at it",
            version=version,
        )
    return version


def without_class_archives(options: str) -> str:
    """JVM ``options`` (``JDK_JAVA_OPTIONS``) without a class-data archive named or recorded, and without the
    flags that silence an archive's messages: for a JVM that maps or records an archive of its own."""
    archives = ("-XX:SharedArchiveFile=", "-XX:ArchiveClassesAtExit=", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")
    return " ".join(o for o in options.split() if not o.startswith(archives))


def _broker_env() -> dict[str, str]:
    """The broker's environment. An archive inherited through JDK_JAVA_OPTIONS (Spark's, which the test suite names
    there: connectors/services/spark_cds.py) would be taken as the base of the broker's own recording, and the JVM
    refuses to start ("DynamicDumpSharedSpaces is unsupported when base CDS archive is not loaded"): the broker
    names its own archive on its command line instead."""
    env = dict(os.environ)
    if env.get("JDK_JAVA_OPTIONS"):
        env["JDK_JAVA_OPTIONS"] = without_class_archives(env["JDK_JAVA_OPTIONS"])
    return env


# ---- jar resolution -----------------------------------------------------------------------------
def ivy_module(version: str) -> str:
    """The ivy.xml of the resolution: Kafka's broker and an SLF4J binding for its log4j2."""
    return f"""<ivy-module version="2.0">
  <info organisation="spark-eos" module="embedded-kafka"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
    <dependency org="org.apache.kafka" name="kafka_{SCALA_VERSION}" rev="{version}" conf="default->default"/>
    <dependency org="org.apache.logging.log4j" name="log4j-slf4j-impl" rev="{LOG4J_VERSION}" conf="default->default"/>
  </dependencies>
</ivy-module>
"""


def _check_jars(jars: Path, version: str | None, source: str) -> str:
    """The Kafka version of the broker jar in ``jars``; ServiceError when the directory cannot run a broker."""
    brokers = sorted(jars.glob(f"kafka_{SCALA_VERSION}-*.jar")) if jars.is_dir() else []
    brokers = [b for b in brokers if not re.search(r"-(sources|javadoc|test)\.jar$", b.name)]
    if not brokers or not list(jars.glob("kafka-clients-*.jar")):
        raise ServiceError(
            f"{source}={str(jars)!r} does not hold the Kafka broker jars (kafka_{SCALA_VERSION}-<version>.jar and "
            "kafka-clients-<version>.jar); point it at a Kafka distribution's libs/ directory or unset it",
            jars=str(jars),
        )
    found = brokers[0].name[len(f"kafka_{SCALA_VERSION}-") : -len(".jar")]
    if version is not None and found != version:
        raise ServiceError(f"{source}={str(jars)!r} holds Kafka {found}, not {version}", jars=str(jars))
    return found


def resolve_jars(
    version: str | None = None, *, cache: Path | None = None, timeout: float = RESOLVE_TIMEOUT, java: str | None = None
) -> Path:
    """The directory of the Kafka ``version`` jars, fetched with Ivy the first time (then cached).

    The cache entry is complete when its marker file exists; it is built in a temp dir and renamed
    into place under a lock, so concurrent callers (pytest workers) fetch once and never see half a directory.
    """
    version = kafka_version(version)
    root = cache or cache_root()
    target = root / f"kafka-{version}"
    if (target / MARKER).is_file():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ServiceError(
            f"cannot create the Kafka jar cache {root}: {e}. Set {CACHE_ENV} to a writable directory, or "
            f"{JARS_ENV} to a directory of Kafka jars."
        ) from e

    def check(jars: Path) -> None:
        _check_jars(jars, version, "the Ivy resolution")
        names = [p.name for p in jars.glob("*.jar")]
        missing = [a for a in ("log4j-core-", "log4j-slf4j-impl-") if not any(n.startswith(a) for n in names)]
        if missing:
            raise ServiceError(f"the Ivy resolution of Kafka {version} lacks {', '.join(missing)}*.jar")

    hint = (
        f"Alternatively set {JARS_ENV} to a directory of Kafka jars (a Kafka distribution's libs/), or "
        "EOS_KAFKA_BOOTSTRAP to a running broker."
    )
    return resolve_module(
        ivy_module(version), root, f"kafka-{version}", version, timeout, java=java, check=check, hint=hint
    )


def kafka_jars(version: str | None = None, environ: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """(jar directory, Kafka version): ``EOS_KAFKA_JARS`` when set, else the cached (or fetched) ``version``."""
    env = os.environ if environ is None else environ
    named = (env.get(JARS_ENV) or "").strip()
    if named:
        path = Path(named).expanduser()
        return path, _check_jars(path, version, JARS_ENV)
    path = resolve_jars(version)
    return path, _check_jars(path, None, "the jar cache")


# ---- configuration files ------------------------------------------------------------------------
def _config_value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        text = str(value)
        if "\0" in text:
            raise ServiceError(f"config[{key!r}] holds a NUL character", key=key)
        return text
    raise ServiceError(
        f"config[{key!r}]={value!r}: a broker setting is a string (or a number or bool), not {type(value).__name__}",
        key=key,
    )


def validate_config(config: Mapping[str, object] | None) -> dict[str, str]:
    """``config`` as broker settings (str -> str); ServiceError for a bad key or a key ApacheKafka sets itself."""
    out: dict[str, str] = {}
    for key, value in (config or {}).items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ServiceError(f"config key {key!r} is not a Kafka broker setting name (like log.segment.bytes)")
        if key in MANAGED_KEYS:
            raise ServiceError(
                f"config[{key!r}] is set by the embedded Apache Kafka itself (ports, roles and directories); "
                f"it cannot be overridden. Settings it manages: {', '.join(sorted(MANAGED_KEYS))}",
                key=key,
            )
        out[key] = _config_value(key, value)
    return out


def _check_advertised(advertised_port: int | None, controller_port: int | None) -> None:
    if advertised_port is None:
        return
    if isinstance(advertised_port, bool) or not isinstance(advertised_port, int) or not 0 < advertised_port < 65536:
        raise ServiceError(f"advertised_port={advertised_port!r} is not a TCP port")
    if advertised_port == controller_port:
        raise ServiceError(
            f"advertised_port and controller_port are both {advertised_port}; clients must be sent to the broker's "
            "listener (or a proxy in front of it), not to the controller"
        )


def broker_properties(
    *,
    port: int,
    controller_port: int,
    data_dir: Path,
    config: Mapping[str, object] | None = None,
    advertised_port: int | None = None,
    security: str = "plaintext",
    secured: Secured | None = None,
    node_id: int = 1,
    voters: str | None = None,
) -> dict[str, str]:
    """server.properties of a combined broker+controller (node ``node_id``, 1 by default) on 127.0.0.1 with
    ``config`` on top. ``voters`` is the controller quorum (``controller.quorum.voters``: ``id@host:port`` of
    every node, a cluster's); a single node is a quorum of one by default.

    ``advertised_port``: the port clients are told to connect to (default ``port``), e.g. a proxy in front of it.
    ``security="sasl_ssl"`` (with ``secured``: the certificate and the principals' passwords): the client
    listener is SASL_SSL with SCRAM-SHA-512, the broker talks to itself there as the super user ``broker``, the
    controller listener (loopback) takes SASL/PLAIN from the super user ``controller``, and ACLs are enforced.
    """
    if security not in SECURITY:
        raise ServiceError(f"security={security!r}: one of {', '.join(SECURITY)}")
    for name, value in (("port", port), ("controller_port", controller_port)):
        if not 0 < value < 65536:
            raise ServiceError(f"{name}={value} is not a TCP port")
    if port == controller_port:
        raise ServiceError(f"port and controller_port are both {port}; the broker needs two ports")
    _check_advertised(advertised_port, controller_port)
    client = "SASL_SSL" if security == "sasl_ssl" else "PLAINTEXT"
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "listeners": f"{client}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"{client}://127.0.0.1:{advertised_port or port}",
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": client,
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "log.dirs": str(data_dir),
    }
    if security == "sasl_ssl":
        if secured is None:
            raise ServiceError("security='sasl_ssl' needs the broker's certificate and principals (secured=)")
        props.update(secured.properties())
    props.update(DEFAULT_CONFIG)
    props.update(validate_config(config))
    return props


def log4j2_properties(log_path: Path, level: str = "INFO") -> str:
    """A log4j2 configuration writing the broker's log to ``log_path`` (nothing to stdout)."""
    level = level.upper()
    if level not in _LEVELS:
        raise ServiceError(f"log_level={level!r} is not one of {', '.join(_LEVELS)}")
    quiet = "WARN" if level in ("INFO", "DEBUG", "TRACE") else level
    props = {
        "status": "warn",
        "name": "spark-eos-kafka",
        "appender.file.type": "File",
        "appender.file.name": "FILE",
        "appender.file.fileName": str(log_path),
        "appender.file.layout.type": "PatternLayout",
        "appender.file.layout.pattern": "[%d] %p %m (%c)%n",
        "rootLogger.level": level,
        "rootLogger.appenderRef.file.ref": "FILE",
        # every client and config object dumps all its settings at INFO: hundreds of lines per start
        "logger.config.name": "org.apache.kafka.common.config",
        "logger.config.level": quiet,
        "logger.request.name": "kafka.request.logger",
        "logger.request.level": "WARN",
    }
    return render_properties(props)


def jvm_options(*, heap: str = "512m", log4j_config: Path, base: Path) -> list[str]:
    """Flags for a small broker on a small machine: C1 only and the serial GC start it ~25% faster."""
    if not _HEAP_RE.match(heap):
        raise ServiceError(f"heap={heap!r} is not a JVM memory size like 512m")
    return [
        f"-Xmx{heap}",
        f"-Xms{min(_mib(heap), 256)}m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j_config}",
        f"-Dkafka.logs.dir={base}",
    ]


def _mib(size: str) -> int:
    unit = size[-1].lower() if size[-1].isalpha() else ""
    n = int(size[:-1] if unit else size)
    return {"": n // (1 << 20), "k": n // 1024, "m": n, "g": n * 1024}[unit]


def cluster_id() -> str:
    """A random KRaft cluster id (Kafka's Uuid: 16 bytes, URL-safe base64 without padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka's own generator avoids these: they read as CLI flags
            return text


# ---- readiness ----------------------------------------------------------------------------------
def coordinators_ready(bootstrap: str, timeout: float, settings: Mapping[str, Any] | None = None) -> tuple[bool, str]:
    """(ready, last error): a transactional producer initialises and a group commits an offset.

    Metadata alone answers before the transaction and group coordinators have created and loaded
    their topics; tests use both at once. The probe's group is deleted afterwards.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    quiet: dict[str, Any] = {
        **(settings or {}),
        "bootstrap.servers": bootstrap,
        "log_level": 0,
        "logger": _silent_logger(),
    }
    name = f"{_HEALTH_PREFIX}{uuid.uuid4().hex[:12]}"
    last = ""
    producer = Producer({**quiet, "transactional.id": name})
    while True:
        try:
            producer.init_transactions(max(1.0, deadline - time.monotonic()))
            break
        except KafkaException as e:
            last = f"init_transactions: {e}"
            err = e.args[0] if e.args else None
            if time.monotonic() >= deadline or (err is not None and not err.retriable()):
                return False, last
            time.sleep(0.1)
    del producer
    consumer = Consumer({**quiet, "group.id": name, "enable.auto.commit": False})
    try:
        # any existing partition will do; the group's offsets topic exists once the group coordinator was asked
        offsets = [TopicPartition("__consumer_offsets", 0, 0)]
        while True:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
                break
            except KafkaException as e:
                last = f"offset commit: {e}"
                if time.monotonic() >= deadline:
                    return False, last
                time.sleep(0.1)
    finally:
        consumer.close()
    admin = AdminClient(quiet)
    with contextlib.suppress(Exception):  # only tidiness: a leftover probe group harms nothing
        admin.delete_consumer_groups([name], request_timeout=5)[name].result(5)
    return True, ""


# ---- the broker ---------------------------------------------------------------------------------
class ApacheKafka(KafkaService):
    """An Apache Kafka KRaft broker (broker + controller, node 1) on 127.0.0.1, our child in its own process group.

    Its records live on disk in ``log_dir`` (Kafka's ``log.dirs``, in a temp dir); the broker's own
    log is ``log_path``. ``crash()`` SIGKILLs the JVM and keeps the data; ``start()`` runs it again on the
    same directory and ports and waits until it is healthy (metadata, a transactional producer, a
    group offset commit); ``stop()`` stops it cleanly and deletes the temp dir unless ``keep=True``
    (a named ``base_dir`` is always kept). ``config`` overrides broker settings
    (``{"log.segment.bytes": "1048576"}``), except those in MANAGED_KEYS. ``port=None`` picks free ports
    (and retries on a lost race); ``detached=True`` (``spark-eos services up``) lets the broker outlive us.
    ``advertised_port`` makes the broker tell clients to connect to 127.0.0.1:``advertised_port`` (a TCP
    proxy in front of ``port``, as the crash matrix's F9 uses): ``bootstrap`` then names that address, so
    every connection goes through it, the broker's own ones to its listener too (transaction markers),
    and the broker is healthy only while something there forwards to ``port``.
    """

    kind = "embedded"
    is_tansu = False

    def __init__(
        self,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        config: Mapping[str, object] | None = None,
        version: str | None = None,
        jars_dir: str | None = None,
        java: str | None = None,
        heap: str = "512m",
        log_level: str = "INFO",
        start_timeout: float = START_TIMEOUT,
        base_dir: str | None = None,
        detached: bool = False,
        keep: bool = False,
        advertised_port: int | None = None,
        security: str = "plaintext",
        node_id: int = 1,
        voters: str | None = None,
        cluster: str | None = None,
        secured: Secured | None = None,
        wait: bool = True,
    ) -> None:
        _check_arguments(port, controller_port, advertised_port, security)
        if (voters is not None or not wait) and (port is None or controller_port is None):
            raise ServiceError("a node of a quorum (voters=, wait=False) needs its port and controller_port named")
        self.security = security
        self.node_id = node_id
        self.voters = voters
        self.cluster = cluster or cluster_id()  # a cluster's nodes are formatted with the same id
        self.config = validate_config(config)
        self.advertised_port = advertised_port
        self.java = java_binary(java)
        if jars_dir:
            self.jars_dir = Path(jars_dir)
            self.version = _check_jars(self.jars_dir, version, "jars_dir")
        else:
            self.jars_dir, self.version = kafka_jars(version)
        self.heap = heap
        self.log_level = log_level
        self.start_timeout = start_timeout
        self._detached = detached
        self._keep = keep or base_dir is not None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self._returncode: int | None = None
        self.start_seconds = 0.0
        self._spawned_at = 0.0
        self.start_phases: dict[str, float] = {}  # seconds from the JVM's launch to metadata / coordinators
        self.port = port or 0
        self.controller_port = controller_port or 0
        self.bootstrap = ""
        if not base_dir:
            _proc.sweep_stale(_TMP_PREFIX)
        self.base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
        self.base.mkdir(parents=True, exist_ok=True)
        if not detached and not base_dir:
            _proc.claim_dir(self.base)
        self.log_path = self.base / "server.log"
        self.stdout_path = self.base / "stdout.log"
        self.properties_path = self.base / "server.properties"
        self.log4j_path = self.base / "log4j2.properties"
        self.log_dir = self.base / "data"
        # its certificate and super users: a cluster's nodes share them (secured=)
        self.tls = (secured or Secured(self.base)) if security == "sasl_ssl" else None
        # a detached broker is stopped by another process (services down): it uses an archive, records none
        self._cds = _CdsArchive.for_broker(self.java, self._classpath(), record=not detached)
        if not detached:
            _proc.register_cleanup(id(self), self.stop)
        try:
            self.log4j_path.write_text(log4j2_properties(self.log_path, log_level))
            self._first_start(port, controller_port, wait=wait)
        except BaseException:
            # the error names the log: keep it to read (swept once we are gone); a detached one has no owner
            self._keep = self._keep or (self.log_path.exists() and not detached)
            self.stop()
            raise

    def _first_start(self, port: int | None, controller_port: int | None, *, wait: bool) -> None:
        """Format and start on the named ports, or on free ones (again on others when one was taken meanwhile)."""
        named = port is not None and controller_port is not None
        for attempt in range(1 if named else _PORT_ATTEMPTS):
            self.port = port if port is not None else _free_port(avoid=controller_port)
            self.controller_port = controller_port if controller_port is not None else _free_port(avoid=self.port)
            self.bootstrap = f"127.0.0.1:{self.advertised_port or self.port}"
            self._configure(retry=attempt > 0)
            if not wait:  # a quorum's node: its cluster waits for all of them at once (await_start)
                self._spawn()
                return
            if self._launch(last_attempt=named or attempt == _PORT_ATTEMPTS - 1):
                return

    # ---- files and commands ----------------------------------------------------------------------
    def _classpath(self) -> str:
        # the jars by name, in a fixed order: a class-data archive is valid only for the classpath it was made with
        return ":".join(str(p) for p in sorted(self.jars_dir.glob("*.jar")))

    def _java(self, main: str, *args: str, cds: Sequence[str] = ()) -> list[str]:
        opts = jvm_options(heap=self.heap, log4j_config=self.log4j_path, base=self.base)
        return [self.java, *opts, *cds, "-cp", self._classpath(), main, *args]

    def _configure(self, *, retry: bool) -> None:
        """Write server.properties for the current ports and format a fresh data directory.

        A retry (the last ports were taken) formats again what the failed attempt formatted.
        """
        props = broker_properties(
            port=self.port,
            controller_port=self.controller_port,
            data_dir=self.log_dir,
            config=self.config,
            advertised_port=self.advertised_port,
            security=self.security,
            secured=self.tls,
            node_id=self.node_id,
            voters=self.voters,
        )
        header = f"spark-eos embedded Apache Kafka {self.version}\nstarted by pid {os.getpid()}"
        self.properties_path.write_text(render_properties(props, header))
        os.chmod(self.properties_path, 0o600)  # with security: the principals' JAAS lines
        if retry:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        elif self.log_dir.exists() and any(self.log_dir.iterdir()):
            raise ServiceError(
                f"{self.log_dir} already holds data; the embedded Apache Kafka formats a new broker and will not "
                "overwrite it: name an empty base_dir",
                log_dir=str(self.log_dir),
            )
        scram = self.tls.scram_arguments() if self.tls is not None else []
        argv = self._java(
            "kafka.tools.StorageTool", "format", "-t", self.cluster, "-c", str(self.properties_path), *scram
        )
        try:
            _proc.run(argv, timeout=120)
        except ServiceError as e:
            raise ServiceError(f"formatting the Kafka storage in {self.log_dir} failed: {e}") from e

    # ---- lifecycle -------------------------------------------------------------------------------
    def _spawn(self) -> None:
        """Run the broker JVM (not waiting for it). The kernel ends it when the calling *thread* ends (the
        parent-death signal follows the thread that forked): spawn from a thread that outlives the broker."""
        self._spawned_at = time.monotonic()
        argv = self._java("kafka.Kafka", str(self.properties_path), cds=self._cds.options())
        with open(self.stdout_path, "ab") as out:
            try:
                self.proc = _proc.spawn(
                    argv, log=out, tie_to_parent=not self._detached, cwd=str(self.base), env=_broker_env()
                )
            except OSError as e:
                raise ServiceError(f"cannot run {self.java!r}: {e}", java=self.java) from e
        self.pid = self.proc.pid

    def await_start(self) -> None:
        """Wait until a broker spawned without waiting (``wait=False``, ``start(wait=False)``) is healthy; the
        error of a start that fails. Any thread may wait: a cluster waits for its nodes at once."""
        self._ready(last_attempt=True)

    def _launch(self, *, last_attempt: bool) -> bool:
        self._spawn()
        return self._ready(last_attempt=last_attempt)

    def _ready(self, *, last_attempt: bool) -> bool:
        assert self.proc is not None
        ok, last = self._wait_ready(self.start_timeout)
        if ok:
            self.start_seconds = time.monotonic() - self._spawned_at
            return True
        exited = self.proc.poll() is not None
        self._kill()
        logs = _proc.tail(self.log_path, 25)
        output = _proc.tail(self.stdout_path, 10)
        both = (logs + "\n" + output).lower()
        if exited and "address already in use" in both and not last_attempt:
            return False  # another process took a free port between our probe and the bind
        hint = ""
        if "unsupportedclassversionerror" in both:
            hint = " Kafka 4.x needs Java 17 or later: set JAVA_HOME to one."
        what = (
            f"exited during start (exit code {self._returncode})"
            if exited
            else f"was not healthy within {self.start_timeout:.0f}s"
        )
        raise ServiceError(
            f"embedded Apache Kafka {self.version} on {self.bootstrap} {what}; last client error: {last or '-'}.{hint}"
            f"\nbroker log {self.log_path}:\n{logs}\nJVM output {self.stdout_path}:\n{output}",
            bootstrap=self.bootstrap,
        )

    def _wait_ready(self, timeout: float) -> tuple[bool, str]:
        begun = time.monotonic()
        deadline = begun + timeout
        last = ""
        self.start_phases = {}

        def alive() -> bool:
            assert self.proc is not None
            self._returncode = self.proc.poll()
            return self._returncode is None

        while time.monotonic() < deadline:
            if not alive():
                return False, last
            wait = min(2.0, max(0.1, deadline - time.monotonic()))
            ok, last, _cluster = kafka_reachable(self.bootstrap, wait, self.client_config())
            if ok:
                self.start_phases["metadata"] = round(time.monotonic() - begun, 2)
                break
        else:
            return False, last
        while time.monotonic() < deadline:
            if not alive():
                return False, last
            wait = min(10.0, max(1.0, deadline - time.monotonic()))
            ok, last = coordinators_ready(self.bootstrap, wait, self.client_config())
            if ok:
                self.start_phases["coordinators"] = round(time.monotonic() - begun, 2)
                return True, ""
        return False, last

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- clients ---------------------------------------------------------------------------------
    def client_config(self) -> dict[str, str]:
        """librdkafka's settings of a client of this broker beside ``bootstrap.servers``: the super user's
        login with ``security="sasl_ssl"`` (setting up and checking; apps get principals of their own,
        ``add_principal``), none without."""
        return {} if self.tls is None else self.tls.client_config()

    def java_config(self) -> dict[str, str]:
        """The Java client's settings of ``client_config`` (a ``kafka.*`` option each, prefix left out)."""
        return {} if self.tls is None else self.tls.java_config()

    def reissue_certificate(self, timeout: float = 30.0) -> None:
        """A new server certificate of the same CA (same names), written over the listener's PEM key store and
        taken up by a dynamic reconfiguration of the listener while the broker runs: open connections go on,
        new ones see the new certificate (a rotation clients that trust the CA survive)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        if self.tls is None:
            raise ServiceError("reissue_certificate(): this embedded Kafka runs without TLS (security='plaintext')")
        before = self.certificate_serial()
        self.tls.cert = self.tls.ca.issue(self.tls.dir / "tls")
        entry = ConfigEntry(
            "listener.name.sasl_ssl.ssl.keystore.location",
            str(self.tls.cert.chain),  # the same file, modified: Kafka loads it again
            incremental_operation=AlterConfigOpType.SET,
        )
        resource = ConfigResource(ResourceType.BROKER, str(self.node_id), incremental_configs=[entry])
        admin = self._admin()  # held until the answer: a client let go of ends its requests
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout)
        # the listener's network threads take it up one by one a moment after the answer: done when a run of
        # new connections all see the new certificate
        deadline, seen_new = time.monotonic() + timeout, 0
        while seen_new < 10:
            seen_new = seen_new + 1 if self.certificate_serial() != before else 0
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"the broker at {self.bootstrap} still presents its old certificate after {timeout}s"
                )
            time.sleep(0.05 if seen_new else 0.2)

    def certificate_serial(self) -> int:
        """The serial number of the certificate the client listener presents now (a TLS handshake's)."""
        import socket
        import ssl

        from cryptography import x509

        if self.tls is None:
            raise ServiceError("certificate_serial(): this embedded Kafka runs without TLS (security='plaintext')")
        context = ssl.create_default_context(cafile=str(self.tls.cert.ca))
        with socket.create_connection(("127.0.0.1", self.port), 10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return int(x509.load_der_x509_certificate(der).serial_number)

    def client_properties(self) -> Path | None:
        """A Java client properties file (mode 0600) of ``java_config`` for tools and ``EOS_KAFKA_CONFIG``
        (``spark-eos --kafka-config``); None without security."""
        if self.tls is None:
            return None
        path = self.base / "client.properties"
        if not path.exists():
            path.write_text(render_properties(self.java_config(), "spark-eos embedded Apache Kafka: its admin"))
            os.chmod(path, 0o600)
        return path

    def _kill(self) -> None:
        if self.proc is not None:
            _proc.stop_group(self.proc, self.pid, grace=0.0, sig=signal.SIGKILL)
            self._returncode = self.proc.returncode
            self._cds.after_exit(None)
        self.proc = None

    def _terminate(self) -> None:
        """SIGTERM (Kafka's clean shutdown: a controlled shutdown, then a clean-shutdown file), SIGKILL after a bound."""
        if self.proc is not None:
            _proc.stop_group(self.proc, self.pid, grace=STOP_GRACE)
            self._returncode = self.proc.returncode
            self._cds.after_exit(self._returncode)
        self.proc = None

    def crash(self) -> None:
        """SIGKILL the broker JVM, as a process crash would: no clean shutdown; ``log_dir`` is kept."""
        if not self.running():
            raise ServiceError(f"embedded Apache Kafka on {self.bootstrap} is not running; nothing to crash")
        self._kill()

    def start(self, *, wait: bool = True) -> None:
        """Start again on the same data directory and ports and wait until healthy (``wait=False``: later, with
        ``await_start``); a no-op when running."""
        if self.running():
            return
        if not (self.log_dir / "meta.properties").is_file():
            raise ServiceError(f"embedded Apache Kafka data directory {self.log_dir} is gone (stopped for good)")
        for p in (self.port, self.controller_port):
            if _proc.port_in_use(p):
                raise ServiceError(
                    f"cannot start the embedded Apache Kafka again: port {p} is now taken by another process"
                )
        if not self._detached:
            _proc.register_cleanup(id(self), self.stop)
        if wait:
            self._launch(last_attempt=True)
        else:
            self._spawn()

    def restart(self) -> None:
        """A clean stop (SIGTERM), keeping the data directory, then ``start()``."""
        self._terminate()
        self.start()

    def stop(self) -> None:
        """Stop cleanly (SIGTERM; SIGKILL after STOP_GRACE seconds) and delete the temp dir unless kept; idempotent."""
        _proc.unregister_cleanup(id(self))
        self._terminate()
        if not self._keep:
            shutil.rmtree(self.base, ignore_errors=True)

    def __repr__(self) -> str:
        return f"ApacheKafka(bootstrap={self.bootstrap!r}, version={self.version!r}, log_dir={str(self.log_dir)!r})"


def _check_arguments(port: int | None, controller_port: int | None, advertised_port: int | None, security: str) -> None:
    if security not in SECURITY:
        raise ServiceError(f"security={security!r}: one of {', '.join(SECURITY)}")
    _check_advertised(advertised_port, controller_port)
    for name, value in (("port", port), ("controller_port", controller_port)):
        if value is not None and _proc.port_in_use(value):
            raise ServiceError(
                f"cannot start the embedded Kafka on 127.0.0.1:{value}: the port is in use. "
                f"Stop what holds it, pick another {name}, or leave it unset to get a free one.",
                port=value,
            )
    if port is not None and port == controller_port:
        raise ServiceError(f"port and controller_port are both {port}; the broker needs two ports")


def _free_port(avoid: int | None) -> int:
    while True:
        p = _proc.free_port()
        if p != avoid:
            return p


# ---- class-data sharing -------------------------------------------------------------------------
class _CdsArchive:
    """A dynamic AppCDS archive of the broker's classes: the JVM maps them instead of loading ~8000 classes
    from jars, which cuts a start by about 0.6 s (of 2.6 s). The first broker run records it at its clean
    exit (under a name of its own, renamed into place), later runs use it; a JVM that cannot use it
    (another JDK, another classpath) just loads classes as usual. ``EOS_KAFKA_CDS=0`` turns it off."""

    def __init__(self, path: Path | None, *, record: bool = True) -> None:
        self.path = path
        self.record = record
        self._recording: Path | None = None

    @classmethod
    def for_broker(cls, java: str, classpath: str, *, record: bool = True) -> _CdsArchive:
        if os.environ.get(CDS_ENV, "1").strip() == "0":
            return cls(None)
        real = Path(java).resolve()
        try:
            st = real.stat()
        except OSError:
            return cls(None)
        key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{classpath}".encode()).hexdigest()[:16]
        return cls(cache_root() / "cds" / f"kafka-{key}.jsa", record=record)

    def options(self) -> list[str]:
        if self.path is None:
            return []
        if self.path.is_file():
            self._recording = None
            return [f"-XX:SharedArchiveFile={self.path}"]
        if not self.record:
            return []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return []
        self._recording = self.path.with_name(f"{self.path.stem}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp")
        return [f"-XX:ArchiveClassesAtExit={self._recording}"]

    def after_exit(self, returncode: int | None) -> None:
        """Keep a recorded archive if the JVM exited on its own terms (143: SIGTERM handled), else drop it."""
        recording, self._recording = self._recording, None
        if recording is None or self.path is None:
            return
        if returncode in (0, 143) and recording.is_file() and recording.stat().st_size > 0:
            with contextlib.suppress(OSError):
                os.replace(recording, self.path)
        with contextlib.suppress(OSError):
            recording.unlink()
