"""Driver-side check that Spark's Python workers can import kafka-eos, before any query starts.

Spark runs a Python data source in Python worker processes started with ``PYSPARK_PYTHON`` (or the
``spark.pyspark.python`` setting), else ``python3`` on PATH, not with the driver's interpreter. A
script started as ``.venv/bin/python app.py`` without an activated virtualenv therefore has workers
that cannot import ``confluent_kafka`` or this package, and the query fails deep in a worker with
``ModuleNotFoundError``. The check runs that interpreter once (per interpreter and working directory)
when kafka-eos is registered and fails with what to do instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import Any

from eos_core.errors import ConfigError

__all__ = ["check_python_workers", "worker_python"]

log = logging.getLogger(__name__)

# What a Python worker imports to run kafka-eos (the package is looked up, not imported: that needs pyspark).
_PROBE = """
import importlib, importlib.util, sys
missing = []
for name in ("confluent_kafka", "pyarrow"):
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
except Exception:
    found = False
if not found:
    missing.append(f"{sys.argv[1]} (ModuleNotFoundError: No module named {sys.argv[1].split('.')[0]!r})")
print("\\n".join(missing))
"""
_CHECKED: dict[tuple[str, str, str], str] = {}
PROBE_TIMEOUT_S = 60.0


def worker_python(sc: Any) -> str:
    """The interpreter Spark starts its Python workers with (``SparkContext.pythonExec``)."""
    return str(getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON") or "python3")


def _pythonpath(sc: Any) -> str:
    """PYTHONPATH as a local worker gets it: the executor environment's, the driver's, and files added with
    addPyFile / --py-files (Spark's PythonWorkerFactory merges these; pyspark itself is not probed)."""
    parts = []
    env = getattr(sc, "environment", None) or {}
    for value in (env.get("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")):
        parts += [p for p in value.split(os.pathsep) if p]
    includes = list(getattr(sc, "_python_includes", None) or [])
    if includes:
        try:
            from pyspark import SparkFiles

            root = SparkFiles.getRootDirectory()
            parts += [os.path.join(root, name) for name in includes]
        except Exception:  # no SparkFiles root (not started): nothing shipped yet
            log.debug("kafka-eos: no SparkFiles root to probe", exc_info=True)
    return os.pathsep.join(parts)


def check_python_workers(sc: Any, package: str = "sources.kafka") -> None:
    """Raise ConfigError when the workers' interpreter cannot import what kafka-eos needs.

    Only local masters are probed (elsewhere the workers' interpreter lives on other hosts); a probe
    that cannot finish is logged and skipped, never a false error.
    """
    master = str(getattr(sc, "master", "") or "")
    if not master.startswith("local"):
        return
    exe = worker_python(sc)
    path = _pythonpath(sc)
    key = (exe, os.getcwd(), path)
    if key not in _CHECKED:
        _CHECKED[key] = _probe(exe, path, package)
    problem = _CHECKED[key]
    if problem:
        raise ConfigError(problem, option="PYSPARK_PYTHON")


def _probe(exe: str, path: str, package: str) -> str:
    where = shutil.which(exe) or exe
    if os.environ.get("PYSPARK_PYTHON") == exe:
        origin = "PYSPARK_PYTHON"
    elif exe == "python3":
        origin = "the default: PYSPARK_PYTHON is not set, so python3 on PATH"
    else:
        origin = "PYSPARK_PYTHON / spark.pyspark.python when the SparkContext started"
    env = {**os.environ}
    if path:
        env["PYTHONPATH"] = path
    else:
        env.pop("PYTHONPATH", None)
    try:
        done = subprocess.run(
            [exe, "-c", _PROBE, package],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        return _message(exe, where, origin, f"the interpreter {exe!r} does not exist")
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("kafka-eos: could not check the Python workers' interpreter %s (%s); not checked", exe, exc)
        return ""
    missing = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 and not missing:
        tail = (done.stderr.strip().splitlines() or ["exit status " + str(done.returncode)])[-1]
        return _message(exe, where, origin, f"it fails to start: {tail}")
    if missing:
        return _message(exe, where, origin, "it cannot import " + "; ".join(missing))
    return ""


def _message(exe: str, where: str, origin: str, what: str) -> str:
    shown = exe if where == exe else f"{exe} = {where}"
    return (
        f"kafka-eos: Spark's Python workers run {shown} ({origin}), and {what}. kafka-eos runs inside those "
        f"workers, so every query would fail there. Fix: set PYSPARK_PYTHON to the interpreter that has spark-eos "
        f"installed before the SparkSession starts (e.g. export PYSPARK_PYTHON={sys.executable}), or activate "
        "its virtualenv (source .venv/bin/activate) so that python3 is that interpreter."
    )
