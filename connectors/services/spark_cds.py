"""A class-data-sharing archive of Spark's JVM classes, so that every Spark JVM on this machine starts faster.

Each Spark JVM (a driver, a local-cluster executor, a standalone master or worker) loads and verifies
thousands of classes from Spark's jars before it runs anything: on 2 cores, about 4 of the 9 seconds a
local session takes to start and run its first query. Java's application class-data sharing (a
dynamic AppCDS archive, JDK 13 and later) keeps those classes parsed and verified in one file that
later JVMs map: measured here, a local session's start and first query went from 8.9 s to 4.8 s.

The archive is built once per JDK and Spark installation, by one short Spark run with
``-XX:ArchiveClassesAtExit``, into the user's cache directory (``~/.cache/spark-eos/cds/``), and then
named in ``JDK_JAVA_OPTIONS`` for every JVM the process's children start. A JVM whose class path is not
Spark's (Ivy, Kafka's storage tool; the broker drops it: it has its own), or an archive gone stale (the
JVM checks every jar's size and time; Spark upgraded or reinstalled), is simply not used: the JVM starts
as it would have without it (its CDS messages are turned off). The archive's name holds a digest of the
JDK's version and of Spark's jars, so a new installation gets a new archive rather than a stale one.
Building takes about 40 s on 2 cores; a build that fails leaves JVMs as they were, and says why in the
log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path

from connectors.services import _proc
from connectors.services.maven import cache_root
from eos_core.errors import ServiceError

__all__ = ["CDS_ENV", "archive_options", "build_archive", "enable", "spark_home"]

log = logging.getLogger(__name__)

ENV = "JDK_JAVA_OPTIONS"
CDS_ENV = "EOS_SPARK_CDS"  # =0: no archive (as EOS_KAFKA_CDS=0 for the broker's)
# the archive's own messages (a class path that differs, a stale archive) are not errors of the JVM's user
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# One local session doing what a spark-eos pipeline does (a Python data source read, a shuffle, a
# streaming query with state in RocksDB): the classes they load are the ones archived. It stops the
# session and waits for its JVM, which writes the archive as it exits.
_WORKLOAD = r"""
import sys
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider").getOrCreate())

class _Reader(DataSourceReader):
    def read(self, partition):
        yield (1, "a")

class _Source(DataSource):
    @classmethod
    def name(cls):
        return "eos_archive_workload"
    def schema(self):
        return "id int, v string"
    def reader(self, schema):
        return _Reader()

spark.dataSource.register(_Source)
spark.read.format("eos_archive_workload").load().groupBy("v").count().collect()
query = (spark.readStream.format("rate").option("rowsPerSecond", "10").load()
         .selectExpr("value % 3 AS k").groupBy("k").count()
         .writeStream.format("noop").outputMode("update")
         .option("checkpointLocation", sys.argv[1]).start())
query.processAllAvailable()
query.stop()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.shutdown()
gateway.proc.stdin.close()  # the JVM ends when its stdin does, and writes the archive on its way out
gateway.proc.wait(timeout=300)
"""


def spark_home() -> Path:
    """The Spark installation this process's Spark runs: ``SPARK_HOME``, else the pip-installed PySpark's."""
    import pyspark

    return Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)


def _java_version() -> str:
    out = subprocess.run(
        ["java", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != ENV},
    )
    return out.stderr.strip()


def _digest(spark_home: Path) -> str:
    """The JDK, Spark's home and every jar's name, size and time: what the JVM checks before it maps."""
    h = hashlib.sha256(_java_version().encode())
    h.update(str(spark_home.resolve()).encode())
    jars = spark_home / "jars"
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _cache_dir() -> Path:
    return cache_root() / "cds"  # beside the Kafka broker's archive (apache_kafka._CdsArchive)


def build_archive(base_options: str = "", *, timeout: float = 600.0) -> Path | None:
    """The archive for this JDK and Spark, built now if there is none; ``None`` when it could not be built.

    ``base_options`` are the JVM options the archive's users run with (the dump runs with them too)."""
    try:
        home = spark_home()
        path = _cache_dir() / f"spark-{_digest(home)}.jsa"
    except (OSError, subprocess.SubprocessError, ImportError) as exc:
        log.info("no class archive: %s", exc)
        return None
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _proc.locked(Path(f"{path}.lock"), timeout + 60, "building Spark's class archive"):
            return path if path.exists() else _build(path, base_options, timeout)  # exists: built meanwhile
    except (OSError, ServiceError) as exc:
        log.info("no class archive: %s", exc)
        return None


def _build(path: Path, base_options: str, timeout: float) -> Path | None:
    """One short Spark run that records the archive as its JVM exits; renamed into place when complete."""
    partial = path.with_suffix(f".{os.getpid()}.partial")
    work = path.with_suffix(f".{os.getpid()}.checkpoint")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env[ENV] = f"{base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}".strip()
    try:
        out = subprocess.run(
            [sys.executable, "-c", _WORKLOAD, str(work)], capture_output=True, text=True, env=env, timeout=timeout
        )
        if out.returncode != 0 or not partial.exists():
            log.info("no class archive: the build run ended with %s: %s", out.returncode, out.stderr[-2000:])
            return None
        os.replace(partial, path)
        return path
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("no class archive: %s", exc)
        return None
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def archive_options(archive: Path) -> str:
    """The JVM options that map ``archive`` (and say nothing when a JVM cannot use it)."""
    return f"-XX:SharedArchiveFile={archive} {QUIET}"


def enable(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Build the archive if needed and name it in ``environ``'s ``JDK_JAVA_OPTIONS`` (``os.environ`` by
    default), for every JVM started from here on; kept as it is when it already names an archive, or
    when ``EOS_SPARK_CDS=0``."""
    environ = os.environ if environ is None else environ
    current = environ.get(ENV, "")
    if environ.get(CDS_ENV, "1").strip() == "0" or "SharedArchiveFile" in current or "ArchiveClassesAtExit" in current:
        return None
    archive = build_archive(current)
    if archive is not None:
        environ[ENV] = f"{current} {archive_options(archive)}".strip()
    return archive
