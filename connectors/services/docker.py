"""The Docker engine spark-eos runs containers on: the user's (``DOCKER_HOST`` or the default socket).

spark-eos never starts a Docker daemon itself. Its own test suite does (``EOS_START_DOCKERD=1``, on
a machine with no engine and no image registry): that machinery lives outside the wheel, in
``integration/harness/dockerd.py``, and plugs in here through :func:`use_private_engine`, which
gives :func:`get_engine` a way to start a daemon and :func:`local_image` a way to build images.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eos_core.errors import ServiceError

__all__ = [
    "DEFAULT_SOCKET",
    "LABEL",
    "Engine",
    "engine_log",
    "get_engine",
    "local_image",
    "ping",
    "shutdown",
    "use_private_engine",
    "want_private_engine",
]

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
LABEL = "spark-eos"  # every container we create carries it (value: the session id)


def ping(host: str, timeout: float = 3.0) -> bool:
    """True when a Docker engine answers at ``host`` (a DOCKER_HOST URL)."""
    if host.startswith("unix://") and not os.path.exists(host[len("unix://") :]):
        return False  # no socket, no engine (and no half-open client socket left to the GC)
    import docker

    try:
        client = docker.APIClient(base_url=host, timeout=timeout, version="auto")  # type: ignore[attr-defined]
    except Exception:  # unreachable socket, refused, bad URL: all mean "no engine here"
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@dataclass
class Engine:
    """A Docker engine: ``host`` is its DOCKER_HOST URL; ``owned`` when this process started it
    (then every container on it is ours; on a user's engine ours carry ``LABEL`` = ``session``)."""

    host: str
    owned: bool = False
    start_seconds: float = 0.0
    session: str = field(default_factory=lambda: f"{os.getpid()}-{os.urandom(3).hex()}")
    _client: Any = field(default=None, repr=False)

    def client(self) -> Any:
        """A docker SDK client for this engine (API version negotiated: our CLI/SDK are newer than 20.10)."""
        import docker

        if self._client is None:
            self._client = docker.DockerClient(base_url=self.host, version="auto", timeout=120)  # type: ignore[attr-defined]
        return self._client

    def env(self) -> dict[str, str]:
        """Environment for the docker CLI and testcontainers: DOCKER_HOST pointing at this engine."""
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.host
        return env

    def cli(self, *args: str, timeout: float = 600, input: bytes | None = None) -> str:
        """Run the docker CLI against this engine; raise ServiceError with its output on failure."""
        docker_bin = shutil.which("docker")
        if docker_bin is None:
            raise ServiceError("the docker CLI is not on PATH (Debian: apt-get install docker.io)")
        proc = subprocess.run([docker_bin, *args], env=self.env(), input=input, capture_output=True, timeout=timeout)
        if proc.returncode != 0:
            raise ServiceError(
                f"docker {' '.join(args[:3])} failed (rc={proc.returncode}): {proc.stderr.decode(errors='replace')[-2000:]}",
                args=list(args),
            )
        return proc.stdout.decode(errors="replace")

    def our_containers(self) -> list[Any]:
        """Containers spark-eos created on this engine (all of them on an engine it started)."""
        flt = {} if self.owned else {"label": f"{LABEL}={self.session}"}
        return list(self.client().containers.list(all=True, filters=flt))

    def remove_containers(self) -> list[str]:
        """Force-remove our containers (with their anonymous volumes); returns their names."""
        removed = []
        for c in self.our_containers():
            try:
                c.remove(force=True, v=True)
                removed.append(c.name)
            except Exception as exc:  # keep going: one stuck container must not leave the others
                log.warning("could not remove container %s: %s", c.name, exc)
        return removed

    def stop(self) -> None:
        """Remove our containers and close the client (an engine we started also stops its daemon)."""
        try:
            self.remove_containers()
        except Exception as exc:  # the engine may already be gone
            log.warning("removing containers failed: %s", exc)
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    @property
    def roots(self) -> list[str]:
        """Private directories of an engine we started (its processes and mounts name them)."""
        return []

    @property
    def pid(self) -> int | None:
        """The daemon's pid for an engine we started; None for a user's engine."""
        return None


# -- a private engine and local images: only where the repo's test machinery plugs them in ----------


@dataclass(frozen=True)
class _Private:
    start: Callable[[], Engine]
    image: Callable[[Engine, str], str]


_private: _Private | None = None


def use_private_engine(start: Callable[[], Engine], image: Callable[[Engine, str], str]) -> None:
    """Let :func:`get_engine` start a daemon (``start``) when ``EOS_START_DOCKERD=1`` and none
    answers, and :func:`local_image` build ``"kafka"``/``"postgres"`` images (``image``)."""
    global _private
    _private = _Private(start, image)


def want_private_engine() -> bool:
    """True when EOS_START_DOCKERD asks for a private dockerd (started only where no engine answers)."""
    return os.environ.get("EOS_START_DOCKERD", "").strip().lower() in ("1", "true", "yes", "on")


def local_image(engine: Engine, name: str) -> str:
    """The reference of spark-eos's locally built ``name`` image on ``engine`` (built on first use)."""
    if _private is None:
        raise ServiceError(
            f"no local {name!r} image: local images (EOS_DOCKER_IMAGES=local) are built by spark-eos's own "
            "test suite (python -m integration.harness.dockerd images, from a checkout); "
            "use EOS_DOCKER_IMAGES=upstream to pull apache/kafka and postgres"
        )
    return _private.image(engine, name)


# -- the engine of this process ----------------------------------------------------------------

_engine: Engine | None = None
_engine_checked = False
engine_log: list[dict[str, Any]] = []  # {"host", "owned", "seconds"} per engine found or started
_engine_lock = threading.Lock()


def get_engine() -> Engine | None:
    """The engine of this process, found or started once: the user's (DOCKER_HOST or the default
    socket) when it answers; else, with EOS_START_DOCKERD=1 and the repo's machinery plugged in, a
    private dockerd (ServiceError when it cannot be started); else None. ``EOS_DOCKER=0`` turns
    containers off altogether."""
    global _engine, _engine_checked
    with _engine_lock:
        if _engine_checked:
            return _engine
        if os.environ.get("EOS_DOCKER", "").strip().lower() in ("0", "false", "no", "off"):
            _engine_checked = True
            return None
        host = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
        if ping(host):
            _engine = Engine(host=host, owned=False)
        elif want_private_engine():
            if _private is None:
                raise ServiceError(
                    "EOS_START_DOCKERD=1, but no Docker engine answers and spark-eos starts none itself (only its "
                    "own test suite does, from a checkout): start Docker and set DOCKER_HOST, or unset EOS_START_DOCKERD"
                )
            _engine = _private.start()
        _engine_checked = True
        if _engine is not None:
            engine_log.append(
                {"host": _engine.host, "owned": _engine.owned, "seconds": round(_engine.start_seconds, 2)}
            )
            # testcontainers reads DOCKER_HOST; without it, it may guess a bridge network to join.
            os.environ["DOCKER_HOST"] = _engine.host
            atexit.register(shutdown)
        return _engine


def shutdown() -> None:
    """Stop what this process started (containers; a private dockerd). Safe to call twice."""
    global _engine, _engine_checked
    with _engine_lock:
        engine, _engine = _engine, None
        _engine_checked = False
        if engine is None:
            return
        if engine.owned and os.environ.get("DOCKER_HOST") == engine.host:
            del os.environ["DOCKER_HOST"]
        engine.stop()
