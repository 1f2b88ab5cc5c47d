"""Maven jars fetched once with the Apache Ivy that PySpark ships (``pyspark/jars/ivy-*.jar``) and cached in
``${XDG_CACHE_HOME:-~/.cache}/spark-eos/``: the embedded Apache Kafka's, Spark's Kafka connector's (the peer
suite), the benchmarks' JDBC driver. No Maven install is needed; ``EOS_MAVEN_REPO`` names a mirror and the
``https_proxy`` of the environment is used."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from connectors.services import _proc
from eos_core.errors import ServiceError

__all__ = [
    "CACHE_ENV",
    "DEFAULT_REPO",
    "MARKER",
    "REPO_ENV",
    "RESOLVE_TIMEOUT",
    "cache_root",
    "ivy_command",
    "ivy_jar",
    "ivy_settings",
    "java_binary",
    "proxy_options",
    "resolve_module",
]

REPO_ENV = "EOS_MAVEN_REPO"
CACHE_ENV = "XDG_CACHE_HOME"
DEFAULT_REPO = "https://repo1.maven.org/maven2/"
MARKER = ".complete"
RESOLVE_TIMEOUT = 600.0
_IVY_PROBLEM = re.compile(r"not found|unresolved|unknown ?host|connect|refused|timed out|error|failed", re.IGNORECASE)


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/spark-eos``: where resolved jars (and class-data archives) are kept."""
    env = os.environ if environ is None else environ
    base = env.get(CACHE_ENV) or ""
    return (Path(base) if base.strip() else Path.home() / ".cache") / "spark-eos"


def java_binary(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` to run: ``explicit``, ``$JAVA_HOME/bin/java``, else the one on PATH."""
    env = os.environ if environ is None else environ
    candidates = [explicit] if explicit else []
    if not explicit and env.get("JAVA_HOME"):
        candidates.append(str(Path(env["JAVA_HOME"]) / "bin" / "java"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    if explicit:
        raise ServiceError(f"java={explicit!r} is not an executable file", java=explicit)
    found = shutil.which("java")
    if found:
        return found
    raise ServiceError(
        "the embedded Apache Kafka needs Java 17 or later and found no 'java' (JAVA_HOME unset or wrong, none on "
        "PATH). Install one (e.g. 'apt-get install openjdk-17-jre-headless'), set JAVA_HOME, or set "
        "EOS_KAFKA_BOOTSTRAP to a running broker (or EOS_KAFKA_EMBEDDED=tansu for the tansu broker)."
    )


def ivy_jar() -> Path:
    """The Apache Ivy jar PySpark ships (``pyspark/jars/ivy-*.jar``)."""
    spec = importlib.util.find_spec("pyspark")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    found = sorted(p for root in roots for p in (root / "jars").glob("ivy-*.jar"))
    if not found:
        raise ServiceError(
            "cannot fetch the Apache Kafka jars: no Apache Ivy jar found (it comes with PySpark as "
            "pyspark/jars/ivy-*.jar; pip install pyspark). Alternatively set EOS_KAFKA_JARS to a directory of "
            "Kafka jars (a Kafka distribution's libs/), or EOS_KAFKA_BOOTSTRAP to a running broker."
        )
    return found[-1]


def ivy_settings(cache: Path, repo: str = DEFAULT_REPO) -> str:
    """ivysettings.xml: Maven Central (or ``repo``), with Ivy's cache in ``cache`` (private to one resolution)."""
    from xml.sax.saxutils import quoteattr

    root = repo if repo.endswith("/") else repo + "/"
    return f"""<ivysettings>
  <settings defaultResolver="central"/>
  <caches defaultCacheDir={quoteattr(str(cache))} useOrigin="false"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root={quoteattr(root)}/>
  </resolvers>
</ivysettings>
"""


def proxy_options(environ: Mapping[str, str] | None = None) -> list[str]:
    """Java system properties for the ``https_proxy``/``http_proxy``/``no_proxy`` of the environment."""
    env = os.environ if environ is None else environ
    out: list[str] = []
    for scheme in ("https", "http"):
        raw = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY") or ""
        if not raw.strip():
            continue
        url = urlsplit(raw.strip() if "://" in raw else "http://" + raw.strip())
        if not url.hostname:
            continue
        port = url.port or (443 if url.scheme == "https" else 80)
        out += [f"-D{scheme}.proxyHost={url.hostname}", f"-D{scheme}.proxyPort={port}"]
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    hosts = [h.strip().lstrip(".") for h in no_proxy.split(",") if h.strip()]
    if out and hosts:
        out.append("-Dhttp.nonProxyHosts=" + "|".join(h if h == "*" else f"*{h}|{h}" for h in hosts))
    return out


def ivy_command(java: str, ivy: Path, settings: Path, module: Path, retrieve_dir: Path) -> list[str]:
    """The Ivy run that downloads the jars and copies them flat into ``retrieve_dir``."""
    return [
        java,
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        *proxy_options(),
        "-jar",
        str(ivy),
        "-settings",
        str(settings),
        "-ivy",
        str(module),
        "-confs",
        "default",
        "-retrieve",
        f"{retrieve_dir}/[artifact]-[revision](-[classifier]).[ext]",
    ]


def _run_ivy(argv: Sequence[str], *, log_path: Path, timeout: float, hint: str = "", what: str = "the jars") -> None:
    """Run Ivy in its own process group (killed with us); ServiceError with its last lines when it fails."""
    with open(log_path, "ab") as log:
        proc = _proc.spawn(argv, log=log, cwd=str(log_path.parent))
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _proc.stop_group(proc, proc.pid, grace=2.0)
        raise ServiceError(
            f"fetching {what} with Ivy took longer than {timeout:.0f}s: {' '.join(argv)}",
            command=list(argv),
        ) from None
    except BaseException:
        _proc.stop_group(proc, proc.pid, grace=2.0)
        raise
    if code != 0:
        text = log_path.read_text(errors="replace")
        problems = [ln.strip() for ln in text.splitlines() if _IVY_PROBLEM.search(ln)]
        raise ServiceError(
            f"fetching {what} with Ivy failed (exit code {code}): {' '.join(argv)}\n"
            + "\n".join(problems[-15:] or text.splitlines()[-15:])
            + f"\nIs {os.environ.get(REPO_ENV) or DEFAULT_REPO} reachable (a proxy: https_proxy; a mirror: "
            f"{REPO_ENV})? {hint}",
            command=list(argv),
            returncode=code,
        )


def resolve_module(
    module: str,
    root: Path,
    stem: str,
    version: str,
    timeout: float,
    *,
    java: str | None = None,
    check: Callable[[Path], None] | None = None,
    hint: str = "",
) -> Path:
    """``root/stem``: the jars of the Ivy ``module``, resolved once (then cached) under a lock.

    The entry is built in a temp dir (``.stem-*``, removed when a resolver died), checked by ``check``,
    marked complete by its marker file and renamed into place, so concurrent callers (pytest workers)
    fetch once and never see half a directory. Used for the broker's jars and for other Maven jars
    (Spark's Kafka connector, the benchmarks' JDBC driver).
    """
    target = root / stem
    with _proc.locked(root / f"{stem}.lock", timeout + 60, f"fetching the jars of {stem}"):
        if (target / MARKER).is_file():
            return target  # another process finished while we waited
        for stale in root.glob(f".{stem}-*"):  # left by a resolver that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=root))
        try:
            (work / "ivy.xml").write_text(module)
            (work / "ivysettings.xml").write_text(
                ivy_settings(work / "ivy-cache", os.environ.get(REPO_ENV) or DEFAULT_REPO)
            )
            jars = work / "jars"
            argv = ivy_command(java_binary(java), ivy_jar(), work / "ivysettings.xml", work / "ivy.xml", jars)
            started = time.monotonic()
            _run_ivy(argv, log_path=work / "ivy.log", timeout=timeout, hint=hint, what=f"the jars of {stem}")
            seconds = time.monotonic() - started
            if check is not None:
                check(jars)
            names = sorted(p.name for p in jars.glob("*.jar"))
            marker = {
                "version": version,
                "command": argv,
                "seconds": round(seconds, 1),
                "jars": names,
                "resolved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (jars / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            if target.exists():  # not ours (no marker): an interrupted copy by hand; replaced
                shutil.rmtree(target)
            os.rename(jars, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target
