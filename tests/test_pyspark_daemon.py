"""connectors.launch.pyspark_daemon: PySpark's daemon with our modules loaded before it forks, or PySpark's own."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from connectors.launch import pyspark_daemon
from connectors.toolkit import app_runner


class _Served(Exception):
    pass


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """main()'s effects recorded: what it preloads, whether it serves, what it execs."""
    seen: list[tuple[str, object]] = []

    def execv(path: str, argv: list[str]) -> None:
        seen.append(("execv", argv[1:]))
        raise _Served  # execv does not return

    monkeypatch.setattr(pyspark_daemon, "preload", lambda modules=(): seen.append(("preload", modules)) or [])
    monkeypatch.setattr(os, "execv", execv)
    import pyspark.daemon

    monkeypatch.setattr(pyspark.daemon, "manager", lambda: seen.append(("manager", None)))
    monkeypatch.setattr(pyspark_daemon.gc, "freeze", lambda: seen.append(("freeze", None)))
    return seen


def test_a_single_threaded_daemon_preloads_the_worker_module_first_then_serves(calls, monkeypatch) -> None:
    monkeypatch.setattr(pyspark_daemon, "threads", lambda: 1)
    pyspark_daemon.main(["pyspark.worker"])
    # the preloaded heap frozen before the first fork: out of the collection PySpark runs after each task
    assert [c[0] for c in calls] == ["preload", "freeze", "manager"]
    modules = calls[0][1]
    assert modules[0] == "pyspark.worker" and list(modules).count("pyspark.worker") == 1
    assert {"sources.kafka.readers", "sinks.postgres.twophase.spark", "pyarrow"} <= set(modules)


def test_a_thread_started_by_the_preload_hands_over_to_pysparks_own_daemon(calls, monkeypatch) -> None:
    counts = iter([1, 2])  # one thread before the imports, two after
    monkeypatch.setattr(pyspark_daemon, "threads", lambda: next(counts))
    with pytest.raises(_Served):
        pyspark_daemon.main(["pyspark.worker"])
    assert [c[0] for c in calls] == ["preload", "execv"]
    assert calls[1][1] == ["-m", "pyspark.daemon", "pyspark.worker"]


def test_without_proc_nothing_is_preloaded(calls, monkeypatch) -> None:
    monkeypatch.setattr(pyspark_daemon, "threads", lambda: None)
    with pytest.raises(_Served):
        pyspark_daemon.main(["pyspark.worker"])
    assert calls == [("execv", ["-m", "pyspark.daemon", "pyspark.worker"])]


def test_preload_keeps_stdout_for_the_port_and_leaves_a_broken_module_to_the_worker(tmp_path, monkeypatch, capfd):
    (tmp_path / "noisy_mod.py").write_text("print('hello from an import')\n")
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    done = pyspark_daemon.preload(("noisy_mod", "broken_mod", "json"))
    out, err = capfd.readouterr()
    assert done == ["noisy_mod", "json"]
    assert out == "" and "hello from an import" in err


def _daemon(env: dict[str, str], stderr: IO[bytes] | None = None) -> tuple[subprocess.Popen[bytes], str, int, str]:
    """The module run as Spark runs it; its command line, threads and mapped libraries once it told its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "connectors.launch.pyspark_daemon", "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
    )
    assert proc.stdout is not None
    (port,) = struct.unpack("!i", proc.stdout.read(4))  # the only bytes it writes: its port, as Spark reads it
    assert 0 < port < 65536
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    return proc, cmdline, threads, maps


def _stop(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()  # Spark's way to stop its daemon: it exits (1, as PySpark's own does at EOF)
    proc.wait(30)
    proc.stdout.close()


def test_the_real_daemon_loads_pyarrow_and_our_modules_and_stays_single_threaded() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JE_ARROW_MALLOC_CONF"}
    env["OMP_NUM_THREADS"] = "1"  # what Spark gives its Python workers (spark.task.cpus)
    proc, cmdline, threads, maps = _daemon(env)
    try:
        assert "connectors.launch.pyspark_daemon" in cmdline, cmdline
        assert threads == 1  # a fork copies one thread: any other would be lost in every worker
        assert "pyarrow" in maps and "confluent_kafka" in maps  # loaded before the fork
    finally:
        _stop(proc)


def test_a_run_past_its_limit_gets_the_python_stacks_of_the_daemon_and_its_workers_who_go_on(tmp_path: Path) -> None:
    """A query that outlived its limit (``app_runner.serve``) asks each process of this daemon for its Python
    stacks: the daemon registers the dump signal with faulthandler before it serves (its forks inherit it), writes
    every thread's stack to stderr (under Spark: the run's log) and goes on serving. Other processes are left alone."""
    # as the JVM: it catches the signal (HotSpot's own use of it) and names the daemon in a setting; never asked
    jvm_like = "import signal, time; signal.signal(signal.SIGUSR2, lambda *a: None); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", jvm_like, f"spark.python.daemon.module={pyspark_daemon.MODULE}"])
    err = tmp_path / "daemon.err"
    with open(err, "wb") as fh:
        proc, *_ = _daemon(dict(os.environ, OMP_NUM_THREADS="1"), stderr=fh)  # its preload: the decoy is ready
    try:
        said = app_runner.python_stacks(settle=0.2)
        assert said.startswith("Python workers ["), said
        asked = said[said.index("[") + 1 : said.index("]")].split(", ")
        assert str(proc.pid) in asked and str(other.pid) not in asked, said
        deadline = time.monotonic() + 10
        while "in manager" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        dump = err.read_text()
        assert "(most recent call first)" in dump and "in manager" in dump, dump  # faulthandler's: its serving loop
        assert proc.poll() is None and other.poll() is None  # both go on
    finally:
        other.kill()
        other.wait(10)
        _stop(proc)


def test_an_unchanged_zip_keeps_its_directory_and_a_changed_one_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's first task calls importlib.invalidate_caches(), which before Python 3.13 re-reads the directory
    of each zip on the path once per zipimporter of it (PySpark's zip: 16 times, 0.2 CPU-s per worker)."""
    import importlib
    import zipfile
    import zipimport

    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches)  # restored
    monkeypatch.setattr(pyspark_daemon, "_ZIPS_READ", {})
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("eos_zipped_pkg/__init__.py", "")
        z.writestr("eos_zipped_pkg/a.py", "X = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    for name in ("eos_zipped_pkg", "eos_zipped_pkg.a", "eos_zipped_pkg.b"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert importlib.import_module("eos_zipped_pkg.a").X == 1
    reads: list[str] = []
    read = zipimport._read_directory  # type: ignore[attr-defined]
    monkeypatch.setattr(zipimport, "_read_directory", lambda path: reads.append(path) or read(path))
    if sys.version_info >= (3, 13):  # zipimport re-reads a directory lazily there: nothing to keep
        assert pyspark_daemon.remember_zips() == 0
        return
    assert pyspark_daemon.remember_zips() >= 1
    importlib.invalidate_caches()
    assert str(archive) not in reads  # unchanged: its directory kept
    with zipfile.ZipFile(archive, "a") as z:  # changed: read again, and what it holds now imports
        z.writestr("eos_zipped_pkg/b.py", "Y = 2\n")
    importlib.invalidate_caches()
    assert str(archive) in reads
    assert importlib.import_module("eos_zipped_pkg.b").Y == 2


def test_the_real_daemon_becomes_pysparks_own_when_an_import_starts_a_thread() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", JE_ARROW_MALLOC_CONF="background_thread:true")
    proc, cmdline, threads, maps = _daemon(env)
    try:
        assert "-m pyspark.daemon pyspark.worker" in cmdline, cmdline  # exec'd: same pid, PySpark's daemon
        assert "connectors.launch.pyspark_daemon" not in cmdline
        assert threads == 1 and "libarrow" not in maps
    finally:
        _stop(proc)


def test_spark_planners_import_the_formats_without_arrow() -> None:
    """Spark's planner processes (lookup, create, plan the read, the write, the streaming commits: a few per
    query start) import a DataSource class's module to unpickle it, and none of them reads or writes an Arrow
    batch; pyarrow with numpy cost ~0.35 CPU-s per process. The formats import them where they use them (the
    executors' workers have them preloaded by this daemon)."""
    code = (
        "import sys, sources.kafka, sinks.postgres; print(sorted(m for m in ('numpy', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    assert {"pyarrow.compute", "sources.kafka.reader", "sources.kafka.readers"} <= set(pyspark_daemon.PRELOAD)
    assert {"sinks.postgres.twophase.spark", "sinks.postgres.upsert", "sinks.kafka"} <= set(pyspark_daemon.PRELOAD)


def test_a_planner_unpickling_a_format_imports_no_client_and_no_protocol() -> None:
    """What a planner process that only creates a data source (or looks one up) pays for our formats: their
    classes' modules, with none of the clients (psycopg, confluent-kafka) and none of the readers, writers or
    protocol modules, which the processes that read, write or commit import (from each format's reader() or
    writer()). Measured on 2 cores: importing the classes' modules cost 0.56 CPU-s (postgres-2pc) and 0.23
    (kafka-eos) before, 0.01 and 0.02 now."""
    code = """
import pickle, sys
from sinks.postgres import Postgres2pcDataSource, PostgresUpsertDataSource
from sources.kafka import KafkaEosDataSource
classes = [Postgres2pcDataSource, PostgresUpsertDataSource, KafkaEosDataSource]
print(sorted({c.__module__ for c in classes}))
for c in classes:  # as Spark's planners find them: pickled by reference, by module and name
    assert pickle.loads(pickle.dumps(c)) is c
heavy = ("psycopg", "confluent_kafka", "pyarrow", "numpy", "pandas")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith(
    ("sinks.postgres.twophase.", "sinks.postgres.upsert", "sinks.kafka", "sources.kafka.read", "sources.kafka.planner"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules, loaded = out.stdout.strip().splitlines()
    assert modules == "['sinks.postgres.datasources', 'sources.kafka.datasource']", modules
    assert loaded == "[]", loaded
