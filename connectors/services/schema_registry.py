"""A Schema Registry on loopback: Apicurio Registry, which serves Confluent's REST API at ``/apis/ccompat/v7``.

Fetched once from Maven Central (``io.apicurio:apicurio-registry-app:VERSION:tar.gz:all``, the tarball its
container image is made of), checked against the SHA-1 Maven publishes beside it, unpacked into
``${XDG_CACHE_HOME:-~/.cache}/spark-eos/apicurio-registry-VERSION``. It needs Java 21 or later: Spark and Kafka
stay on the default Java (17); the registry's is ``EOS_REGISTRY_JAVA`` (a ``java`` or a JDK directory), else
the newest JDK 21+ found (``JAVA_HOME``, ``java`` on PATH, ``/usr/lib/jvm/*``). Schemas live in memory, or with
``persistent=True`` in an H2 file of the registry's directory, kept across its restarts. ``EOS_SCHEMA_REGISTRY_URL`` names a
registry of the user's own instead (Confluent, Apicurio, Karapace, Redpanda); ``EOS_MAVEN_REPO`` a mirror.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connectors.services import _proc
from connectors.services.maven import DEFAULT_REPO, MARKER, REPO_ENV, cache_root
from eos_core.errors import ServiceError

__all__ = [
    "API_PATH",
    "JAVA_ENV",
    "MIN_JAVA",
    "URL_ENV",
    "VERSION",
    "ApicurioRegistry",
    "registry_answers",
    "registry_home",
    "registry_java",
]

VERSION = "3.3.3"
URL_ENV = "EOS_SCHEMA_REGISTRY_URL"
JAVA_ENV = "EOS_REGISTRY_JAVA"
MIN_JAVA = 21
API_PATH = "/apis/ccompat/v7"  # Confluent's Schema Registry API, as Apicurio serves it
FETCH_TIMEOUT = 600.0
START_TIMEOUT = 180.0  # measured: 35-39 s to answer on a 2-core machine running the suite beside it
_TMP_PREFIX = "eos-registry-"
_GROUP = "io/apicurio/apicurio-registry-app"


def _artifact_url(version: str, environ: Mapping[str, str]) -> str:
    repo = (environ.get(REPO_ENV) or DEFAULT_REPO).rstrip("/")
    return f"{repo}/{_GROUP}/{version}/apicurio-registry-app-{version}-all.tar.gz"


def _download(url: str, to: Path, timeout: float) -> None:
    try:
        with urllib.request.urlopen(url, timeout=min(timeout, 60.0)) as answer, open(to, "wb") as out:
            shutil.copyfileobj(answer, out, 1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceError(
            f"cannot fetch Apicurio Registry from {url}: {exc}. Is the Maven repository reachable (a proxy: "
            f"https_proxy; a mirror: {REPO_ENV})? Or set {URL_ENV} to a running Schema Registry.",
            url=url,
        ) from None


def registry_home(version: str = VERSION, environ: Mapping[str, str] | None = None) -> Path:
    """The unpacked registry (``quarkus-run.jar`` and its ``lib/``), fetched and checked once, then cached.

    Built in a temp dir beside it and renamed into place under a lock, so concurrent callers (pytest workers)
    fetch once and never see half a directory."""
    env = os.environ if environ is None else environ
    root = cache_root(env)
    root.mkdir(parents=True, exist_ok=True)
    stem = f"apicurio-registry-{version}"
    target = root / stem
    if (target / MARKER).is_file():
        return target
    with _proc.locked(root / f"{stem}.lock", FETCH_TIMEOUT + 60, f"fetching {stem}"):
        if (target / MARKER).is_file():
            return target
        for stale in root.glob(f".{stem}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=root))
        try:
            url = _artifact_url(version, env)
            tarball = work / "app.tar.gz"
            _download(url, tarball, FETCH_TIMEOUT)
            _download(url + ".sha1", work / "app.sha1", FETCH_TIMEOUT)
            expected = (
                (work / "app.sha1").read_text().split()[0].strip().lower() if (work / "app.sha1").stat().st_size else ""
            )
            digest = hashlib.sha1(tarball.read_bytes(), usedforsecurity=False).hexdigest()
            if digest != expected:
                raise ServiceError(
                    f"Apicurio Registry fetched from {url} does not match the SHA-1 published beside it "
                    f"({digest} != {expected or 'none'}): a broken download or mirror; fetch again, or set {REPO_ENV}",
                    url=url,
                )
            unpacked = work / "app"
            with tarfile.open(tarball) as tar:
                tar.extractall(unpacked, filter="data")
            if not (unpacked / "quarkus-run.jar").is_file():
                raise ServiceError(f"{url} holds no quarkus-run.jar: not Apicurio Registry's app tarball", url=url)
            (unpacked / MARKER).write_text(url + "\n")
            if target.exists():
                shutil.rmtree(target)
            unpacked.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


_VERSION_LINE = re.compile(r'version "(\d+)(?:[.\-+"]|$)')


def _java_major(java: Path) -> int:
    """The feature version of a ``java`` binary: its JDK's ``release`` file, else ``java -version``; 0 if unknown."""
    release = java.resolve().parent.parent / "release"
    try:
        found = re.search(r'^JAVA_VERSION="(\d+)', release.read_text(), re.MULTILINE)
        if found:
            return int(found.group(1))
    except OSError:
        pass
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = _VERSION_LINE.search(out.stderr + out.stdout)
    return int(found.group(1)) if found else 0


def _as_java(path: str) -> Path:
    p = Path(path)
    return p / "bin" / "java" if p.is_dir() else p


def registry_java(environ: Mapping[str, str] | None = None, jvm_root: Path = Path("/usr/lib/jvm")) -> Path:
    """The ``java`` (21 or later) the registry runs on: ``EOS_REGISTRY_JAVA`` when set (refused if older),
    else the newest of ``JAVA_HOME``'s, the one on PATH and ``/usr/lib/jvm/*``."""
    env = os.environ if environ is None else environ
    named = env.get(JAVA_ENV, "").strip()
    if named:
        java = _as_java(named)
        major = _java_major(java) if java.is_file() else 0
        if major < MIN_JAVA:
            raise ServiceError(
                f"{JAVA_ENV}={named}: {'not a java executable or JDK directory' if not java.is_file() else f'Java {major}'}"
                f"; Apicurio Registry needs Java {MIN_JAVA} or later",
                java=named,
            )
        return java
    candidates: list[Path] = []
    if env.get("JAVA_HOME"):
        candidates.append(_as_java(env["JAVA_HOME"]))
    on_path = shutil.which("java", path=env.get("PATH"))
    if on_path:
        candidates.append(Path(on_path))
    candidates += sorted(jvm_root.glob("*/bin/java")) if jvm_root.is_dir() else []
    found = [(major, java) for java in dict.fromkeys(candidates) if java.is_file() for major in [_java_major(java)]]
    usable = sorted((m, j) for m, j in found if m >= MIN_JAVA)
    if not usable:
        seen = ", ".join(f"{j} (Java {m or '?'})" for m, j in found) or "none"
        raise ServiceError(
            f"Apicurio Registry needs Java {MIN_JAVA} or later; found: {seen}. Install one beside the Java Spark "
            f"uses (e.g. 'apt-get install openjdk-21-jre-headless'), set {JAVA_ENV} to its java, or set "
            f"{URL_ENV} to a running Schema Registry.",
        )
    return usable[-1][1]


def registry_answers(url: str, timeout: float = 3.0) -> bool:
    """The Schema Registry at ``url`` (its Confluent API) lists its subjects."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as refused:  # an answer, not the one of a ready registry (it holds the socket)
        refused.close()
        return False
    except (urllib.error.URLError, OSError):
        return False


# Refusals a fresh Apicurio 3.3.3 sends before it is used: the first one of the associations API (which
# confluent-kafka's serializers ask first) is now and then read and never answered, or its connection dropped.
_WARM_UP = ("/associations/resources/-/eos-warm-up?resourceType=topic&associationType=value", "/schemas/ids/2147483647")


def _warm_up(url: str, attempts: int = 5) -> int:
    """Send each ``_WARM_UP`` request until it is refused with an HTTP answer; the number that were not answered."""
    dropped = 0
    for path in _WARM_UP:
        for _ in range(attempts):
            try:
                urllib.request.urlopen(f"{url.rstrip('/')}{path}", timeout=3.0).close()
                break
            except urllib.error.HTTPError as refused:
                refused.close()
                break
            except (urllib.error.URLError, OSError):  # dropped, or no answer within the timeout
                dropped += 1
    return dropped


def confluent_client(url: str, timeout: float = 10.0) -> Any:
    """confluent-kafka's ``SchemaRegistryClient`` for ``url``, with a request timeout: without one it waits for an
    answer without end, and Apicurio 3.3.3 now and then reads a request and never answers it (seen on the first
    refusal a fresh registry sends); with one, the client's retries send it again."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": timeout})


class ApicurioRegistry:
    """Apicurio Registry on 127.0.0.1, our child in its own process group.

    ``url`` is the Confluent-compatible API (``http://127.0.0.1:PORT/apis/ccompat/v7``: what
    ``schema.registry.url`` and confluent-kafka's ``SchemaRegistryClient`` take). ``start()`` waits until it
    answers; ``crash()`` SIGKILLs it; ``stop()`` ends it and deletes its directory; ``start()`` again runs a new
    one on the same port (``restart()`` both). Its schemas live in memory, or with ``persistent=True`` in an H2
    database file that a new one on the same directory reads (H2 writes within about a second: a SIGKILL right
    after a registration may lose it). Quarkus' management interface (port 9000 on every address by default)
    gets a free loopback port: nothing listens beyond loopback, and two registries never collide.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        version: str = VERSION,
        java: str | None = None,
        heap: str = "256m",
        start_timeout: float = START_TIMEOUT,
        detached: bool = False,
        persistent: bool = False,
    ) -> None:
        self.home = registry_home(version)
        self.persistent = persistent
        self.version = version
        self.java = _as_java(java) if java else registry_java()
        self.heap = heap
        self.start_timeout = start_timeout
        self._detached = detached
        self.port = port or 0
        self.management_port = 0
        self._archive_lock: int | None = None  # held while this registry records the class-data archive
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.start_seconds = 0.0
        self.dropped_at_start = 0  # warm-up requests a fresh registry left unanswered (see _WARM_UP)
        if not detached:
            _proc.sweep_stale(_TMP_PREFIX)
        self.base = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
        if not detached:
            _proc.claim_dir(self.base)
            _proc.register_cleanup(id(self), self.stop)
        self.log_path = self.base / "registry.log"
        try:
            self.start()
        except BaseException:
            self.stop(keep_log=True)
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{API_PATH}"

    @property
    def archive(self) -> Path:
        """The class-data archive of this registry and Java (JDK 19+ records it at the first clean exit and maps it
        at every later start: 7.1 s to answer without, 3.1-3.5 s with, on a quiet 2-core machine)."""
        return cache_root() / "cds" / f"apicurio-registry-{self.version}-{self.java.resolve().parent.parent.name}.jsa"

    def _cds_options(self) -> list[str]:
        if self.archive.is_file():
            return [f"-XX:SharedArchiveFile={self.archive}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
        if self._detached:  # its owner exits at once (services up), and could not hold the recorder's lock
            return []
        self.archive.parent.mkdir(parents=True, exist_ok=True)
        if self._archive_lock is None:  # one registry records it; the others run without until it exists
            fd = os.open(self.archive.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return []
            self._archive_lock = fd
        return [f"-XX:SharedArchiveFile={self.archive}", "-XX:+AutoCreateSharedArchive", "-Xlog:cds=off"]

    def _release_archive(self) -> None:
        if self._archive_lock is not None:
            os.close(self._archive_lock)
            self._archive_lock = None

    def argv(self) -> list[str]:
        return [
            str(self.java),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # a short-lived test service: C1 only starts it sooner on 2 cores
            *self._cds_options(),
            f"-Djava.io.tmpdir={self.base}",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={self.port}",
            # its management interface (health, metrics) is built in and listens on 0.0.0.0:9000 unless told
            "-Dquarkus.management.host=127.0.0.1",
            f"-Dquarkus.management.port={self.management_port}",
            # persistent: its H2 database in a file of its directory (in memory by default), kept across restarts
            *([f"-Dapicurio.datasource.url=jdbc:h2:file:{self.base / 'db' / 'registry'}"] if self.persistent else []),
            "-jar",
            str(self.home / "quarkus-run.jar"),
        ]

    def start(self) -> ApicurioRegistry:
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.port = self.port or _proc.free_port()
        while self.management_port in (0, self.port):
            self.management_port = _proc.free_port()
        if _proc.port_in_use(self.port):
            raise ServiceError(f"port {self.port} is taken: cannot start Apicurio Registry there", port=self.port)
        begun = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k not in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS")}
        with open(self.log_path, "ab") as log:  # Spark's class archive and flags are for Java 17, not this JVM
            self.proc = _proc.spawn(self.argv(), log=log, tie_to_parent=not self._detached, env=env, cwd=str(self.base))
        self.pid = self.proc.pid
        deadline = begun + self.start_timeout
        while not registry_answers(self.url, timeout=2.0):
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"Apicurio Registry exited with code {self.proc.returncode} before it answered "
                    f"(log {self.log_path}):\n{_proc.tail(self.log_path)}",
                    command=self.argv(),
                )
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"Apicurio Registry did not answer on {self.url} within {self.start_timeout:.0f}s "
                    f"(log {self.log_path}):\n{_proc.tail(self.log_path)}",
                    command=self.argv(),
                )
            time.sleep(0.25)
        self.dropped_at_start = _warm_up(self.url)
        self.start_seconds = time.monotonic() - begun
        return self

    def crash(self) -> None:
        """SIGKILL the registry's JVM (its schemas are gone with it)."""
        if self.proc is not None:
            _proc.stop_group(self.proc, self.proc.pid, grace=0.0, sig=signal.SIGKILL)
        self._release_archive()  # a killed JVM records nothing

    def pause(self) -> None:
        """SIGSTOP the registry's JVM: the kernel still accepts connections, nothing answers them (a wedged registry,
        a long GC pause, a frozen VM). ``resume`` lets it go on."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> ApicurioRegistry:
        """Stop the registry (SIGTERM) and start a new one on the same port: every schema is forgotten."""
        if self.proc is not None:
            _proc.stop_group(self.proc, self.proc.pid, grace=10.0)
        self._release_archive()
        return self.start()

    def stop(self, keep_log: bool = False) -> None:
        if self.proc is not None:
            _proc.stop_group(self.proc, self.proc.pid, grace=10.0)  # SIGTERM: a clean exit records the archive
        self._release_archive()
        if not self._detached:
            _proc.unregister_cleanup(id(self))
        if not keep_log:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> ApicurioRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
