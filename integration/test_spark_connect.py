"""Spark Connect (issue 50): the connectors through a Connect session, the server killed and a new one restarting
the query from its checkpoint, then the exact checker.

The crash matrix's pipeline (``integration.harness.runner``) runs as a Connect client (``--remote``): the query runs
in a Spark Connect server from PySpark's own jars (``connectors.services.spark_connect``), which is the query's
driver, with the kafka-eos source and the sink in Python processes the server starts. The client registers the
formats over the session (``spark.dataSource.register``), and gives the connectors the run's fault spec and the
Postgres password as options (the server sees none of the client's environment). Each test:

1. starts a server and the client; a fault point inside the server at a step of the sink's protocol SIGKILLs the
   server's process group (the driver and its Python processes: a lost driver node); the test proves the fault
   fired in the server and the server died of SIGKILL, then stops the client;
2. starts a new server on the same address and runs the client again: it restarts the query from the checkpoint,
   the sink's recovery finishes or redoes the dead batch;
3. the exact checker: the sink equals the topic as a multiset, no prepared transaction or open Kafka transaction
   left, the sink's last decision or marker equals Spark's last ``commits/n``.

As users deploy: the SASL_SSL broker with an app principal holding the pipeline's ACLs, the TLS Postgres as the
session's app role.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from connectors.services.spark_connect import ConnectServer
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from connectors.toolkit.harness import wait_until
from eos_core import faults
from integration.harness.matrix import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.crash]

RECORDS = 600  # 2 partitions, 200 per trigger: 3 batches
PER_TRIGGER = 200

# case -> (the runner's sink, sink options, the fault that kills the server, the point whose firing proves it).
# One case per sink (the driver's own steps where the sink has them: over Connect the driver is the server). Each
# sink's recovery from a kill at every step of its protocol, in both visibility modes, is the crash matrix's
# (F1-F8, F26); what this module adds is the server's death and a new server resuming the client's query.
CASES = {
    # the driver dies with the batch decided, before its COMMIT PREPAREDs: the restart commits the killed run's rows
    "2pc": ("2pc", (), "sink.commit.after_decision:batch=1:action=kill-group:once", "sink.commit.after_decision"),
    # a task of the upsert sink killed with its rows written, its transaction open: the server goes with it
    "upsert": ("upsert", (), "sink.after_write:batch=1:partition=1:action=kill-group:once", "sink.after_write"),
    # the foreachBatch helper (connectors.upsert_batch) of a keyed aggregation, killed before the batch's write
    "stateful": ("stateful", (), "pipeline.batch:batch=1:action=kill-group:once", "pipeline.batch"),
    # the Kafka sink, visibility=batch: half the batch sent in the driver's publish, its transaction open
    "kafka-batch": ("kafka", (), "sink.publish.mid:batch=1:k=100:action=kill-group:once", "sink.publish.mid"),
}


def _pipeline(sink: str, options: tuple[str, ...], kafka_service: Any, postgres_service: Any, tmp: Path) -> Pipeline:
    name = f"sc_{sink}_{uuid.uuid4().hex[:8]}"
    kafka_service.grant_topic(name)
    create_topic(kafka_service.bootstrap, name, 2)
    produce_records(kafka_service.bootstrap, name, make_records(RECORDS, seed=50, prefix=f"{name}-"), partitions=2)
    pipe = Pipeline(
        sink,
        kafka_service.bootstrap,
        name,
        postgres_service.dsn,
        postgres_service.dsn,
        f"{name}_out" if sink == "kafka" else name,
        str(tmp / name),
        PER_TRIGGER,
        options=options,
        kafka_config=kafka_service.app_config,
    )
    kafka_service.grant_acls(pipe.kafka_acls())
    if sink == "kafka":
        kafka_service.grant_topic(pipe.table)
    return pipe


@pytest.mark.parametrize("case", list(CASES))
def test_query_over_spark_connect_survives_the_server_killed_and_restarted(
    case: str, kafka_service: Any, postgres_service: Any, tmp_path: Path
) -> None:
    sink, options, spec, point = CASES[case]
    pipe = _pipeline(sink, options, kafka_service, postgres_service, tmp_path)
    # the server's processes log their faults where the pipeline's checker reads them
    env = {faults.ENV_LOG: pipe.fault_log, faults.ENV_STATE: os.path.join(pipe.workdir, "fault-state")}
    server = ConnectServer(os.path.join(pipe.workdir, "server"), env=env)
    pipe.remote = server.remote
    client = pipe.process(spec, state="killed")
    try:
        server.start()
        first = server.proc
        assert first is not None
        client.start()
        wait_until(
            lambda: first.poll() is not None or not client.alive(),
            timeout=300,
            what="the server killed by its fault point",
        )
        if first.poll() is None:  # the query failed before its fault: only Spark's own start-up limit is retried,
            # once: a Python process the server starts must connect back within 10 s (hard-coded in Spark's
            # PythonWorkerFactory), which a loaded 2-core machine can miss (seen in CI: the source's runner)
            assert client.logged("Python worker failed to connect back"), pipe.describe()
            pipe.outcomes.append(client.wait(30))
            client = pipe.process(spec, state="killed-again").start()
            wait_until(lambda: first.poll() is not None, timeout=300, what="the server killed by its fault point")
        assert first.returncode == -signal.SIGKILL, f"server: exit {first.returncode}\n{pipe.describe()}"
        fired = pipe.fired(point, action="kill-group")
        assert len(fired) == 1 and int(fired[0]["batch"]) == 1, f"{point}: {fired}"
        assert fired[0]["pid"] not in (client.pid, os.getpid())  # it fired in the server, not in the client
        server.start()  # a new driver on the same address
        assert server.proc is not None and server.proc.pid != first.pid and server.starts == 2
        # the client retried its awaitTermination while no server answered (PySpark's Connect client retries an
        # unavailable server for 10 minutes); the new server knows neither its session nor its query
        pipe.outcomes.append(client.wait(120))
        assert pipe.outcomes[-1].returncode == 2, pipe.describe()
        out = pipe.run()
        assert out.returncode == 0, pipe.describe()
    finally:
        client.stop()
        server.stop()
    aggregates = {"table": pipe.table, "key": "key", "value": "amount"} if sink == "stateful" else None
    report = pipe.report(expect_faults=[point], aggregates=aggregates)
    assert report.ok, f"{report.table()}\n{pipe.describe()}"


PROBE = r"""
import contextlib, io, json, os, sys, time
remote, table, topic, out_topic, work, kafka_config = sys.argv[1:7]
dsn = os.environ["PROBE_DSN"]  # not on the command line, where ps (and a failed test's report) shows it
import connectors
from connectors import metrics
from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(remote).getOrCreate()
connectors.register(spark)
exporter = metrics.install(spark, dsn=dsn, sink_id=table)  # the listener runs in this client
kafka = connectors.kafka_options(os.environ["EOS_KAFKA_BOOTSTRAP"], kafka_config)
out = {}

def source():
    return (spark.readStream.format("kafka-eos").options(**kafka).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
            .selectExpr("concat(cast(partition as string), '-', cast(offset as string)) AS id", "cast(value as string) AS v"))

def run(name, writer):
    query = writer.option("checkpointLocation", os.path.join(work, name)).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    except Exception as exc:
        out[name + ".exception"] = str(exc)
        out[name + ".cause"] = connectors.error_cause(exc)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        query.explain(True)
    out[name + ".explain"] = buf.getvalue()
    out[name + ".progress"] = [p.json for p in query.recentProgress]
    return query

ck = os.path.join(work, "twopc")
run("twopc", source().writeStream.foreachBatch(
    connectors.twopc_batch(dsn=dsn, table=table, checkpoint_location=ck, **{"sink.id": table})))
kk = os.path.join(work, "kafka")
run("kafka", source().selectExpr("id AS key", "v AS value").writeStream.foreachBatch(
    connectors.kafka_batch(topic=out_topic, checkpoint_location=kk, **{"sink.id": out_topic}, **kafka)))
run("broken", source().writeStream.format("postgres-2pc").option("dsn", dsn).option("table", "no_such_table_here")
    .option("sink.id", table + "_broken"))
time.sleep(2)  # the listener's last events reach the client
out["metrics"] = exporter.text()
exporter.close()  # the listener's thread in this client: left registered, this process would never exit
print("PROBE " + json.dumps(out), flush=True)
"""


def test_foreach_batch_helpers_metrics_error_cause_and_redaction_over_spark_connect(
    kafka_service: Any, postgres_service: Any, tmp_path: Path
) -> None:
    """``twopc_batch`` and ``kafka_batch`` (their functions run in a Python process the server starts), the metrics
    listener (in the client), ``error_cause`` of a query failure as the client sees it, and the Postgres password,
    given inside the DSN: in no plan, progress or exception the client gets."""
    import json
    import re
    import subprocess
    import sys

    import psycopg

    from connectors.toolkit.checker import read_topic_settled
    from connectors.toolkit.harness import password_apart

    pipe = _pipeline("2pc", (), kafka_service, postgres_service, tmp_path)
    out_topic = f"{pipe.topic}_out"
    kafka_service.grant_topic(out_topic)
    create_topic(kafka_service.bootstrap, out_topic, 2)
    with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pipe.table} (id text PRIMARY KEY, v text)")
    password = password_apart(postgres_service.dsn)[1]["PGPASSWORD"]
    assert password in postgres_service.dsn
    with ConnectServer(os.path.join(pipe.workdir, "server")) as server:
        argv = [sys.executable, "-c", PROBE, server.remote, pipe.table, pipe.topic, out_topic, pipe.workdir]
        argv += [kafka_service.app_config]
        env = {**os.environ, "EOS_KAFKA_BOOTSTRAP": kafka_service.bootstrap, "PROBE_DSN": postgres_service.dsn}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    got = json.loads(lines[-1][len("PROBE ") :])

    with psycopg.connect(postgres_service.dsn) as conn:
        rows = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {pipe.table}").fetchone()
    assert rows == (RECORDS, RECORDS), rows
    assert len(read_topic_settled(kafka_service.bootstrap, out_topic, RECORDS)) == RECORDS
    assert len(got["twopc.progress"]) >= RECORDS // 100 and len(got["kafka.progress"]) >= RECORDS // 100

    assert got["broken.cause"].startswith("ConfigError: ") and "no_such_table_here" in got["broken.cause"], got
    # the listener in the client saw the foreachBatch query's batches: every row the sink wrote
    total = re.compile(rf'^spark_eos_sink_rows_total{{[^}}]*sink_id="{pipe.table}"}} {RECORDS}$', re.M)
    assert total.search(got["metrics"]), got["metrics"][:3000]
    # the failure names the option's value (the options reached the text the client sees), never the password
    assert "no_such_table_here" in got["broken.exception"], got["broken.exception"][:3000]
    leaked = [k for k, v in got.items() if password in json.dumps(v)]
    assert not leaked, f"the password is in {leaked}"
    assert password not in done.stdout + done.stderr


def test_chaos_toolkit_runs_a_users_job_through_a_connect_session(
    kafka_service: Any, postgres_service: Any, tmp_path: Path
) -> None:
    """``spark-eos chaos --app orders_job:build --connect``: each run of the example job is a Connect client of a
    server the run starts (its driver); a kill of the job's group takes the server too (it dies with its starter),
    and a fault point inside the server kills the job's group. Exactly once, every fault proven."""
    import json
    import subprocess
    import sys

    from connectors.toolkit import chaos

    work = tmp_path / "chaos"
    faults_given = "kill:1,fault-point:1"
    planned = chaos.plan_kills("2pc", 2, 3, faults=faults_given)
    assert sorted(p.kind for p in planned) == ["fault-point", "kill"], planned
    argv = [sys.executable, "-m", "connectors.toolkit.chaos", "--app", "orders_job:build", "--connect"]
    argv += ["--kills", "2", "--seed", "3", "--faults", faults_given, "--records", "400", "--max-offsets", "80"]
    argv += ["--payload", "key,amount", "--bootstrap", kafka_service.bootstrap, "--dsn", postgres_service.dsn]
    argv += ["--workdir", str(work), "--json", "--quiet"]
    orders = Path(__file__).resolve().parents[1] / "examples" / "orders"
    out = subprocess.run(argv, cwd=orders, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["ok"] is True, json.dumps(report["checks"], indent=1)
    events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    assert [e["exit"] for e in events] == ["killed by SIGKILL"] * 2, events
    # the job ran as a Connect client: each run started a server and named it in its log
    log = (work / "pipeline.log").read_text(errors="replace")
    assert log.count("RUNNER CONNECT sc://127.0.0.1:") >= 3, log[-3000:]
    assert "SparkConnectServer" in "".join(p.read_text(errors="replace") for p in work.rglob("connect-server.log"))
