"""PySpark's worker daemon with spark-eos loaded once, before it forks: ``spark.python.daemon.module``.

Spark starts one Python daemon per executor (``python -m pyspark.daemon pyspark.worker``) and forks
a worker from it for each task slot; every worker then imports what its tasks need. For the
``kafka-eos`` source and the Postgres sinks that is PySpark's worker, pyarrow, pandas, psycopg and
our modules: about one second of CPU per worker, paid again by every executor and after every
restart (measured on 2 cores: 1.4 CPU-s per worker of the crash matrix, 0.5 with this daemon). With
``spark.python.daemon.module=connectors.launch.pyspark_daemon`` the daemon imports them once and
each fork inherits them. ``connectors.services.spark.local_session``, the toolkit's app runner and
the crash harness set it; any other job can (docs/deployment.md).

Fork safety. PySpark's own daemon imports nothing heavy before forking, because a fork copies only
the calling thread and pyarrow starts a thread when it is imported (its jemalloc's background
thread), as OpenBLAS may (numpy, under pandas). Here that thread is switched off before the import
(``JE_ARROW_MALLOC_CONF``, unless the user set it) and the daemon checks, once the imports are done,
that it is still its only thread. If it is not (another library or version started one, or the
platform has no ``/proc`` to tell), it replaces itself with PySpark's own daemon: slower, never unsafe.
Nothing of the preload may write to stdout, where the daemon tells Spark its port: Python-level
output goes to stderr meanwhile. A module that fails to import is left for the worker, whose error
then reaches the task as it would without this daemon.

Zip directories read once. A worker's first task adds Spark's files directory to ``sys.path`` and calls
``importlib.invalidate_caches()``, and Python before 3.13 answers that by re-reading the whole directory
of each zip on the path once per ``zipimporter`` of it: one per package imported from it, 16 of PySpark's
zip (about 1,850 entries) in a worker with the preload, 0.2 CPU-s per worker. The daemon keeps, for each
zip it imported from, the size and time the directory was read at (``remember_zips``); a zip whose size
and time are unchanged keeps its directory, any other is re-read as before.

Collections. PySpark's daemon runs a full ``gc.collect()`` in a reused worker after every task, and a full
collection visits every object that can be in a cycle: with the preload, about 100,000 of them, 50 ms a task on
these 2-core machines (py-spy of ``bench.microbatch``: two thirds of the Python workers' busy samples, 4-5 s per
worker over 40 micro-batches). The daemon freezes its heap (``gc.freeze()``) once the imports are done, as
Python's documentation advises before a fork without exec: what it loaded is left out of every worker's
collections (it is module state, never garbage) and its pages are not written by them, so they stay shared with
the daemon. A worker's own objects are collected as before.

Where a hung worker waits. The daemon registers ``SIGUSR2`` with ``faulthandler`` before it serves, so
it and every worker it forks write the Python stack of each of their threads to stderr (Spark copies it
into the driver's or the executor's log) when they get that signal, and go on. The runners send it to
the workers of a query that outlived its time limit (``connectors.toolkit.app_runner.serve``): the
JVM's stacks show only that a task waits on its Python worker, these show on what.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import os
import signal
import sys
from typing import Any

__all__ = ["CONF", "DUMP_SIGNAL", "MODULE", "PRELOAD", "main", "preload", "remember_zips", "threads"]

MODULE = "connectors.launch.pyspark_daemon"
# the setting that makes Spark start this daemon instead of its own
CONF = {"spark.python.daemon.module": MODULE}
# the daemon and its workers write their Python stacks to stderr on this signal (and go on)
DUMP_SIGNAL = signal.SIGUSR2

# what a worker of the source or the sinks imports: PySpark's Arrow path, then ours
PRELOAD = (
    "pyspark.worker",
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "pyspark.sql.pandas.serializers",
    # the formats' readers and writers, which their data sources import on demand (planners never do), and
    # the modules those import where they use them: Arrow, the task-side reader
    "sources.kafka.readers",
    "sources.kafka.reader",
    "sinks.postgres.twophase.spark",
    "sinks.postgres.upsert",
    "sinks.kafka",
)


def threads() -> int | None:
    """How many threads this process runs (``None`` where ``/proc`` cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import ``modules`` that import cleanly, output to stderr; the names imported."""
    done = []
    with contextlib.redirect_stdout(sys.stderr):
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:
                continue
            done.append(name)
    return done


# each zip whose directory zipimport holds: (its size, its time) when that directory was read
_ZIPS_READ: dict[str, tuple[int, int]] = {}


def _stat(archive: str) -> tuple[int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def remember_zips() -> int:
    """Let ``importlib.invalidate_caches()`` keep the directory of each zip imported from so far while that zip
    is unchanged (its size and time); what Python does for it otherwise is left as it is. How many zips."""
    if sys.version_info >= (3, 13):  # zipimport re-reads a directory only when it is next used
        return 0
    import zipimport

    cache = getattr(zipimport, "_zip_directory_cache", None)
    if not isinstance(cache, dict):
        return 0
    for archive in cache:
        stat = _stat(archive)
        if stat is not None:
            _ZIPS_READ[archive] = stat
    reread = zipimport.zipimporter.invalidate_caches
    if getattr(reread, "_eos_kept", False):
        return len(_ZIPS_READ)

    def invalidate_caches(self: Any) -> None:
        stat = _stat(self.archive)
        if stat is not None and _ZIPS_READ.get(self.archive) == stat and self.archive in cache:
            # unchanged since its directory was last read (here, or by another importer of the zip that saw it change)
            self._files = cache[self.archive]
            return
        reread(self)
        if stat is not None:
            _ZIPS_READ[self.archive] = stat

    invalidate_caches._eos_kept = True  # type: ignore[attr-defined]
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    return len(_ZIPS_READ)


def main(argv: list[str] | None = None) -> None:
    """Preload, then serve as PySpark's daemon; PySpark's own daemon when a thread was started or cannot be seen."""
    argv = sys.argv[1:] if argv is None else argv
    if threads() == 1:
        worker = argv[0] if argv else "pyspark.worker"
        os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")  # before pyarrow loads
        # the worker module is imported after the fork by PySpark's daemon; here once, before it
        preload(tuple(dict.fromkeys((worker, *PRELOAD))) if worker.startswith("pyspark") else PRELOAD)
        if threads() == 1:
            from pyspark.daemon import manager

            faulthandler.register(DUMP_SIGNAL, all_threads=True)  # inherited by every fork: no thread started
            remember_zips()
            gc.freeze()  # the preloaded heap: out of every worker's collections (see "Collections" above)
            manager()
            return
    os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *argv])


if __name__ == "__main__":
    main()
