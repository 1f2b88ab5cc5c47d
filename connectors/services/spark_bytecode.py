"""PySpark's zipped modules with their bytecode, so that Spark's Python workers stop compiling PySpark.

Spark starts its Python workers (and the daemons it forks them from, and the planners of Python data
sources) with ``$SPARK_HOME/python/lib/pyspark.zip`` first on their path. A pip-installed PySpark ships
that zip with sources only, and Python cannot write bytecode into a zip: every worker compiles each
PySpark module it imports, again. Measured here (2 cores), ``import pyspark.sql`` costs a worker 0.9 s of
CPU from the zip and 0.25 s from the same zip with bytecode; a spark-eos pipeline run starts some
fifteen such processes.

``precompile()`` rewrites the zip once with a ``.pyc`` beside each ``.py`` (checked-hash bytecode, PEP
552: a worker still compares each source's hash, so bytecode that does not match its source is never
used; an interpreter of another version skips it by its magic number and compiles the source as
before). The modules are the same files; only their bytecode is added. It is the test suite's
(``conftest.py``, before the session starts any Spark: a worker importing from the zip while it is
replaced would read the new file at the old one's offsets): the zip belongs to the PySpark
installation, which a user may not want rewritten.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path

from connectors.services import _proc, spark_cds
from eos_core.errors import ServiceError

__all__ = ["BYTECODE_ENV", "precompile", "precompiled"]

log = logging.getLogger(__name__)

BYTECODE_ENV = "EOS_SPARK_BYTECODE"  # =0: leave PySpark's zips as they are
_MAGIC = importlib.util.MAGIC_NUMBER


def _zips(spark_home: Path) -> list[Path]:
    lib = spark_home / "python" / "lib"
    return sorted(lib.glob("pyspark.zip")) + sorted(lib.glob("py4j-*.zip"))


def precompiled(zip_path: Path) -> bool:
    """Whether ``zip_path`` holds bytecode of this interpreter for each of its modules."""
    with zipfile.ZipFile(zip_path) as zf:
        names = set(zf.namelist())
        sources = [n for n in names if n.endswith(".py") and "/tests/" not in n]
        if not sources or any(n[:-3] + ".pyc" not in names for n in sources):
            return False
        with zf.open(sources[0][:-3] + ".pyc") as fh:
            return fh.read(4) == _MAGIC


def _rewrite(zip_path: Path) -> None:
    partial = zip_path.with_name(f".{zip_path.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(zip_path) as zin, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if info.filename.endswith(".pyc"):
                    continue  # another interpreter's: replaced by this one's
                data = zin.read(info)
                zout.writestr(info, data)
                if info.filename.endswith(".py") and "/tests/" not in info.filename:
                    with warnings.catch_warnings():  # a module's SyntaxWarning is the module's, not ours
                        warnings.simplefilter("ignore")
                        # named as zipimport names a module it compiles: tracebacks show the same path
                        code = compile(data, f"{zip_path}{os.sep}{info.filename}", "exec", dont_inherit=True)
                    pyc = _code_to_hash_pyc(code, importlib.util.source_hash(data), checked=True)
                    zout.writestr(zipfile.ZipInfo(info.filename[:-3] + ".pyc", date_time=info.date_time), bytes(pyc))
        # atomic: no reader sees half a zip. But a Python process already importing from the old zip reopens
        # it by name at the offsets it read before: run this before any Spark starts (conftest.py does)
        os.replace(partial, zip_path)
    finally:
        partial.unlink(missing_ok=True)


def precompile(spark_home: Path | None = None) -> list[Path]:
    """Add this interpreter's bytecode to PySpark's zips (``pyspark.zip``, ``py4j-*.zip``) under
    ``spark_home`` (the pip-installed PySpark's by default); the zips rewritten (none: already done, or
    ``EOS_SPARK_BYTECODE=0``, or not writable, which is logged)."""
    if os.environ.get(BYTECODE_ENV, "1").strip() == "0":
        return []
    done = []
    for zip_path in _zips(spark_cds.spark_home() if spark_home is None else spark_home):
        try:
            if precompiled(zip_path):
                continue
            with _proc.locked(zip_path.with_name(f"{zip_path.name}.lock"), 300, "adding bytecode to PySpark's zip"):
                if not precompiled(zip_path):  # another process did it while this one waited
                    _rewrite(zip_path)
                    done.append(zip_path)
        except (OSError, zipfile.BadZipFile, SyntaxError, ValueError, ServiceError) as exc:
            log.info("%s left as it is: %s", zip_path, exc)
    return done
