"""The reference pipelines on a Spark standalone cluster, submitted as users submit them: crash matrix F17-F19.

A master and two one-core workers (each its own loopback "host") run from the pip-installed Spark
(``integration/fixtures/cluster.py``). The pipeline is submitted with ``spark-submit --master
spark://... --archives environment.zip#environment`` in client mode: executors run the packed venv's
interpreter (``PYSPARK_PYTHON=./environment/bin/python``) and import the package from it, never
from the driver's venv (the workers' environment has no trace of it). In one query's life:

- F17 a worker host lost mid-batch: a write task of batch 1 holds after its write (2PC: after
  PREPARE); the worker JVM, its executor and their Python workers are SIGKILLed; a replacement worker
  starts on that host. The query goes on: the task is redone on the other host, exactly once.
- F18 the master SIGKILLed and restarted (recovery from its FILESYSTEM state) while batch 3 is in
  flight; the application and the workers re-register and the query goes on.
- F19 the driver SIGKILLed (spark-submit, its JVM and the Python driver) while batch 5's tasks hold
  after their write; the same submit command, run again, drains the topic from the checkpoint.

The exact checker then proves every record is in the table exactly once (ledger; for balances every
account's sum and count), no prepared transaction is left, and each fault is proven to have happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.launch import spark_submit
from connectors.pipelines.events import generate, produce
from connectors.toolkit import checker
from eos_core import faults
from integration.fixtures.cluster import StandaloneCluster, clean_env, spark_home, unpack_env, wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

RECORDS, PER_TRIGGER = 800, 100  # batches 0..7


def _config(path: Path, pipeline: str, kafka: Any, pg: Any, topic: str, table: str, spec: str, spark: dict) -> Path:
    """The user's YAML, faults as a sink option; ``spark`` adds master and conf for ``spark-eos run``."""
    path.write_text(
        json.dumps(
            {  # JSON is YAML
                "pipeline": pipeline,
                "source": {
                    "bootstrap": kafka.bootstrap,
                    "topic": topic,
                    "max_offsets_per_trigger": PER_TRIGGER,
                    # the suite's app principal on a secured broker (granted what the pipeline declares)
                    "kafka_config": getattr(kafka, "app_config", None) or "",
                },
                "sink": {"dsn": pg.dsn, "table": table, "options": {"faults": spec}},
                "spark": {
                    "checkpoint": str(path.parent / "checkpoint"),
                    "trigger": "available-now",
                    "shuffle_partitions": 2,
                    **spark,
                },
                "log": {"format": "json", "progress": False},
            }
        )
    )
    from connectors.pipelines import load_config
    from connectors.pipelines.privileges import pipeline_acls

    getattr(kafka, "grant_acls", lambda acls: None)(pipeline_acls(load_config(str(path))))
    return path


def _cluster_conf(env_zip: Path, work: Path) -> dict[str, str]:
    """What a client-mode driver on this machine tells the cluster; the archive is the environment."""
    return {
        "spark.archives": f"{env_zip}#environment",
        "spark.driver.host": "127.0.0.1",  # this test's driver host; on a real cluster, the edge node's address
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.cores": "1",
        "spark.executor.memory": "768m",
        "spark.executorEnv.EOS_FAULTS_LOG": str(work / "faults.jsonl"),
        "spark.executorEnv.EOS_FAULTS_STATE": str(work / "fault-state"),
    }


def _launch(how: str, cluster: StandaloneCluster, env_zip: Path, pipeline: str, config: Path, work: Path) -> Any:
    """The driver, in client mode, in its own process group: ``spark-submit`` (master and conf on its
    command line) or ``spark-eos run`` (master and conf in the config), as docs/deployment.md shows."""
    if how == "spark-submit":
        conf = [
            a for k, v in _cluster_conf(env_zip, work).items() if k != "spark.archives" for a in ("--conf", f"{k}={v}")
        ]
        argv = [
            f"{spark_home()}/bin/spark-submit",
            "--master",
            cluster.url,
            "--deploy-mode",
            "client",
            "--archives",
            f"{env_zip}#environment",
            *conf,
            spark_submit.__file__,
            "run",
            pipeline,
            "--config",
            str(config),
        ]
    else:
        argv = [sys.executable, "-m", "connectors.cli", "run", pipeline, "--config", str(config)]
    env = clean_env(
        SPARK_HOME=spark_home(),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_DRIVER_PYTHON=sys.executable,  # the driver: the user's own environment
        PYSPARK_PYTHON="./environment/bin/python",  # executors: the unpacked archive
        EOS_FAULTS_LOG=str(work / "faults.jsonl"),
        EOS_FAULTS_STATE=str(work / "fault-state"),
        SPARK_LOCAL_DIRS=str(work / "local"),  # a driver SIGKILLed (F19) leaves its copies of the archive behind:
    )  # here, and in the JVM's temp dir (spark-submit's own copy), both under the test's directory
    (work / "tmp").mkdir(exist_ok=True)
    env["JDK_JAVA_OPTIONS"] = f"{env.get('JDK_JAVA_OPTIONS', '')} -Djava.io.tmpdir={work / 'tmp'}".strip()
    if not (work / "environment").exists():  # the driver's Python data source planner runs it too
        unpack_env(env_zip, work / "environment")
    with open(work / f"driver-{len(list(work.glob('driver-*.log')))}.log", "w") as out:  # the child keeps its copy
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=work
        )


def _kill_group(p: subprocess.Popen[str]) -> None:
    try:
        os.killpg(p.pid, 9)
    except ProcessLookupError:
        pass


def _executor_python(pid: int) -> tuple[str, str]:
    """The interpreter a task's process runs (its command line) and the PYTHONPATH it was given."""
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    env = dict(
        kv.split("=", 1)
        for kv in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        if "=" in kv
    )
    return cmd, env.get("PYTHONPATH", "")


@pytest.mark.parametrize(("pipeline", "how"), [("ledger", "spark-submit"), ("balances", "run")])
def test_f17_f18_f19_worker_lost_master_restarted_driver_killed_on_a_standalone_cluster(
    pipeline: str,
    how: str,
    standalone_cluster: StandaloneCluster,
    shipped_env: Path,
    kafka_service: Any,
    postgres_service: Any,
    new_topic: Any,
    new_table: Any,
    tmp_path: Path,
) -> None:
    cluster = standalone_cluster
    topic, table = new_topic(partitions=2, prefix=f"cl{pipeline[0]}"), new_table(pipeline)
    produce(kafka_service.bootstrap, topic, generate(RECORDS, seed=17), partitions=2)
    after_write = "sink.after_prepare" if pipeline == "ledger" else "sink.after_write"
    spec = ";".join(
        f"{after_write}:batch={b}:partition=0:action=sleep:seconds={s}:once" for b, s in ((1, 300), (3, 25), (5, 300))
    )
    spark = {} if how == "spark-submit" else {"master": cluster.url, "conf": _cluster_conf(shipped_env, tmp_path)}
    config = _config(tmp_path / "pipeline.yaml", pipeline, kafka_service, postgres_service, topic, table, spec, spark)
    driver = _launch(how, cluster, shipped_env, pipeline, config, tmp_path)
    proof: dict[str, Any] = {}
    try:
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 900
        while len(seen) < 3:
            assert driver.poll() is None, f"the driver ended early ({driver.returncode}):\n{_tail(tmp_path)}"
            assert time.monotonic() < deadline, f"fault points fired: {seen}\n{_tail(tmp_path)}"
            new = faults.fired(str(tmp_path / "faults.jsonl"))[len(seen) :]
            for event in new:
                seen.append(event)
                pid = int(event["pid"])  # type: ignore[arg-type]
                if str(event["batch"]) == "1":  # F17: the host running this task is lost
                    proof["python"] = _executor_python(pid)
                    host = cluster.worker_of(pid)
                    assert host is not None, f"the task's process {pid} is on no worker's host"
                    proof["lost_host"], proof["killed"] = host, cluster.lose_host(host)
                    cluster.start_worker(host)  # a replacement machine joins
                elif str(event["batch"]) == "3":  # F18: the master goes down and comes back mid-batch
                    proof["old_master"] = cluster.kill_master()
                    proof["master_down_after"] = time.time() - float(event["time"])  # type: ignore[arg-type]
                    cluster.start_master()
                    wait_for_text(cluster.master_log, "Recovery complete", 1, 120)
                elif str(event["batch"]) == "5":  # F19: the driver is lost with the batch's tasks mid-write
                    _kill_group(driver)
                    proof["driver_exit"] = driver.wait(60)
            time.sleep(0.3)
        rerun = _launch(how, cluster, shipped_env, pipeline, config, tmp_path)
        assert rerun.wait(900) == 0, f"the resubmitted driver failed:\n{_tail(tmp_path)}"
    finally:
        _kill_group(driver)

    # each fault happened, where and when it should
    assert [str(e["batch"]) for e in seen] == ["1", "3", "5"] and all(e["point"] == after_write for e in seen), seen
    cmd, pythonpath = proof["python"]
    assert cmd.endswith("environment/bin/python"), f"executors did not run the shipped interpreter: {cmd}"
    # the package came from the archive: the PYTHONPATH Spark gives its workers holds only Spark's own
    # files (pyspark.zip, py4j, spark-core), no directory of the driver's
    entries = [p for p in pythonpath.split(os.pathsep) if p]
    assert entries and all(p.startswith(spark_home()) and p.endswith((".zip", ".jar")) for p in entries), entries
    assert int(seen[0]["pid"]) in proof["killed"] and len(proof["killed"]) >= 3, proof  # worker, executor, task
    restarted = cluster.master_log.read_text()
    assert "Application has been re-registered" in restarted, "the running application never reached the new master"
    assert proof["master_down_after"] < 25, proof  # the master went down while batch 3's task slept (25 s)
    assert proof["driver_exit"] == -9, proof
    events = [json.loads(line) for line in _driver_log(tmp_path, 0).splitlines() if line.startswith("{")]
    assert sum(e["event"] == "query.started" for e in events) == 1, (
        "run 1 restarted its query: a fault was not survived"
    )
    assert events[0]["master"] == cluster.url, events[0]

    checkpoint = str(tmp_path / "checkpoint")
    if pipeline == "ledger":
        report = checker.verify(
            bootstrap=kafka_service.bootstrap,
            topic=topic,
            dsn=postgres_service.dsn,
            table=table,
            payload_fields=("account", "amount"),
            sink_id=table,
            checkpoint=checkpoint,
        )
    else:
        report = checker.verify(
            bootstrap=kafka_service.bootstrap,
            topic=topic,
            dsn=postgres_service.dsn,
            table="",
            decisions=False,
            aggregates={
                "table": table,
                "key": "account",
                "value": "amount",
                "columns": {"balance": "sum", "events": "count"},
            },
        )
    assert report.ok, report.table()
    assert report.info["source_records"] == RECORDS


def _driver_log(work: Path, i: int) -> str:
    return (work / f"driver-{i}.log").read_text(errors="replace")


def _tail(work: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(work.glob("driver-*.log"))
    )
