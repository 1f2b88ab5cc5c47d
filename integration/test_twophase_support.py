"""Helpers of the two-phase sink tests: the Postgres they use, input files, app runs and the checks.

No test functions: the test modules import the fixtures and helpers from here. ``twophase_pg`` is
the shared ``postgres_service`` fixture when the harness provides one; otherwise a throwaway
embedded cluster (it must support ``crash()``/``start()`` and prepared transactions).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors.services._proc import free_port
from connectors.toolkit.harness import password_apart
from eos_core.faults import fired
from sinks.postgres.twophase.decisions import ProtocolTables, list_prepared

__all__ = ["AppRun", "EmbeddedPg", "Scenario", "start_cluster", "twophase_pg"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class EmbeddedPg:
    """A throwaway cluster from the system binaries, run as the unprivileged ``postgres`` user."""

    data: str
    port: int
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.data}"
        for k, v in self.settings.items():
            opts += f" -c {k}={v}"
        cmd = ["pg_ctl", "-D", self.data, "-o", opts, "-l", os.path.join(self.data, "log"), "-w", *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        self._pg_ctl("start")

    def crash(self) -> None:
        self._pg_ctl("stop", "-m", "immediate")

    def stop(self) -> None:
        try:
            self._pg_ctl("stop", "-m", "fast")
        except subprocess.CalledProcessError:
            pass


def start_cluster(**settings: str) -> EmbeddedPg:
    base = tempfile.mkdtemp(prefix="eos-2pc-pg-")
    os.chmod(base, 0o755)
    data = os.path.join(base, "data")
    cmd = ["initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync"]
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pg = EmbeddedPg(data, free_port(), {"max_prepared_transactions": "64", "fsync": "off", **settings})
    pg.start()
    return pg


@pytest.fixture(scope="session")
def twophase_pg(request: pytest.FixtureRequest) -> Iterator[Any]:
    try:
        service = request.getfixturevalue("postgres_service")
    except pytest.FixtureLookupError:
        service = None
    if service is not None and getattr(service, "kind", "env") != "env":  # a server we run: crash()/start() work
        yield service
        return
    pg = start_cluster()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(os.path.dirname(pg.data), ignore_errors=True)


@dataclass
class AppRun:
    returncode: int
    stderr: str
    tag: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


@dataclass
class Scenario:
    """One sink (table + sink id + checkpoint + input files) that tests run, kill and check."""

    dsn: str
    root: Path
    batches: int
    rows: int  # per batch
    mode: str = "append"
    name: str = field(default_factory=lambda: "tp_" + uuid.uuid4().hex[:10])
    runs: int = 0

    def __post_init__(self) -> None:
        self.input = self.root / "input"
        self.checkpoint = self.root / "checkpoint"
        self.fault_log = str(self.root / "faults.jsonl")
        self.input.mkdir(parents=True)
        now = time.time() - 1000
        for b in range(self.batches):
            path = self.input / f"part-{b:04d}.json"
            path.write_text("".join(json.dumps({"id": b * self.rows + i, "batch": b}) + "\n" for i in range(self.rows)))
            os.utime(path, (now + b, now + b))  # the file source orders by modification time
        key = " PRIMARY KEY" if self.mode == "upsert" else ""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {self.name} (id bigint{key}, batch bigint, tag text)")  # type: ignore[arg-type]

    @property
    def sink_id(self) -> str:
        return f"sink-{self.name}"

    def run(
        self, faults: str | None = None, *, dsn: str | None = None, extra: tuple[str, ...] = (), timeout: float = 400
    ) -> AppRun:
        """Run the app to its end (or its death); the fault spec goes in through EOS_FAULTS."""
        self.runs += 1
        tag = f"run{self.runs}"
        env = dict(os.environ)
        env.pop("EOS_FAULTS", None)
        env["EOS_FAULTS_LOG"] = self.fault_log
        env["EOS_FAULTS_STATE"] = str(self.root / f"faults-state-{tag}")
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYSPARK_PYTHON"] = sys.executable
        if faults:
            env["EOS_FAULTS"] = faults
        run_dsn, password = password_apart(dsn or self.dsn)
        env.update(password)  # not on the command line, which ps shows to every user
        cmd = [
            sys.executable,
            "-m",
            "integration.test_twophase_app",
            "--dsn",
            run_dsn,
            "--table",
            self.name,
            "--sink-id",
            self.sink_id,
            "--checkpoint",
            str(self.checkpoint),
            "--input",
            str(self.input),
            "--tag",
            tag,
            "--mode",
            self.mode,
        ]
        for kv in extra:
            cmd += ["--extra", kv]
        # Its own process group: kill-group takes the driver JVM and every Python worker at once,
        # and nothing of the app can outlive the test.
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"app run {tag} did not finish within {timeout}s") from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of a killed group (none expected)
            except ProcessLookupError:
                pass
        return AppRun(proc.returncode, err, tag)

    def fired(self, point: str) -> list[dict[str, Any]]:
        return [e for e in fired(self.fault_log) if e["point"] == point]

    # -- checks --------------------------------------------------------------------------------

    def rows_by_batch(self, conn: psycopg.Connection) -> dict[int, list[tuple[int, str]]]:
        out: dict[int, list[tuple[int, str]]] = {}
        for id_, batch, tag in conn.execute(f"SELECT id, batch, tag FROM {self.name}").fetchall():  # type: ignore[arg-type]
            out.setdefault(int(batch), []).append((int(id_), tag))
        return out

    def spark_last_commit(self) -> int | None:
        commits = self.checkpoint / "commits"
        names = [int(n) for n in os.listdir(commits) if n.isdigit()] if commits.exists() else []
        return max(names) if names else None

    def check(self, *, complete: bool) -> dict[int, str]:
        """Whole batches only, each from one attempt, no duplicate; returns batch -> winning tag.

        ``complete``: every input record is there exactly once, no prepared gid of the sink is
        left, and the decision log's last batch equals Spark's last commits/n.
        """
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            by_batch = self.rows_by_batch(conn)
            ids = Counter(i for rows in by_batch.values() for i, _ in rows)
            dups = {i: n for i, n in ids.items() if n > 1}
            assert not dups, f"duplicates: {sorted(dups.items())[:10]}"
            tags = {}
            for b, rows in by_batch.items():
                expected = set(range(b * self.rows, (b + 1) * self.rows))
                got = {i for i, _ in rows}
                assert got == expected, (
                    f"batch {b}: partial or wrong rows: missing {sorted(expected - got)[:5]}, extra {sorted(got - expected)[:5]}"
                )
                batch_tags = {t for _, t in rows}
                assert len(batch_tags) == 1, f"batch {b}: rows of several attempts are visible: {batch_tags}"
                tags[b] = batch_tags.pop()
            if complete:
                assert sorted(by_batch) == list(range(self.batches)), f"batches visible: {sorted(by_batch)}"
                assert list_prepared(conn, self.sink_id) == [], "prepared transactions of the sink remain"
                last = ProtocolTables().last_batch(conn, self.sink_id)
                assert last == self.spark_last_commit(), (
                    f"decision log last batch {last} != Spark commits {self.spark_last_commit()}"
                )
        return tags


@pytest.fixture(scope="session")
def twophase_spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The shared ``spark`` fixture when the harness provides one, else a local[2,2] session."""
    try:
        yield request.getfixturevalue("spark")
        return
    except pytest.FixtureLookupError:
        pass
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import connectors

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName("twophase-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    connectors.register(spark)
    try:
        yield spark
    finally:
        spark.stop()
