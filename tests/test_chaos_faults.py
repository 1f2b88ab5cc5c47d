"""Issue 30 item 3: the fault kinds of ``spark-eos chaos --faults`` without services: parsing, the
seeded schedule (the default draws what every chaos run drew before), refusals of what the setup
cannot inject, the fault specs, and the proofs read back from a fault log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connectors.toolkit import chaos
from connectors.toolkit.chaos import kinds as fault_kinds
from connectors.toolkit.chaos import kit as fault_kit
from connectors.toolkit.harness import PipelineProcess
from eos_core import faults
from eos_core.errors import ConfigError


def test_parse_faults_orders_kinds_and_refuses_bad_entries() -> None:
    assert fault_kinds.parse_faults(None) == {"kill": 1, "fault-point": 1}
    # written in any order, the same weights in KINDS' order (the same schedule)
    assert list(fault_kinds.parse_faults("pg-restart:1,kill:2,broker-crash")) == ["kill", "pg-restart", "broker-crash"]
    assert fault_kinds.parse_faults("kill:0,pg-cut:3") == {"pg-cut": 3}
    for spec, needle in [
        ("kill:2,reboot:1", "--faults 'reboot': unknown fault kind; kinds: kill, fault-point"),
        ("kill:x", "--faults 'kill:x': the weight is a whole number >= 0"),
        ("kill:-1", "the weight is a whole number >= 0"),
        ("kill:1,kill:2", "kill given twice"),
        ("kill:0", "no fault kind with a weight above 0"),
    ]:
        with pytest.raises(ConfigError, match=None) as exc:
            fault_kinds.parse_faults(spec)
        assert needle in str(exc.value), (spec, str(exc.value))
    assert fault_kinds.format_faults(fault_kinds.parse_faults("pg-stop:2,kill:1")) == "kill:1,pg-stop:2"


def test_default_schedule_is_the_one_chaos_runs_always_drew() -> None:
    # the seeds the oracle examples pin (integration/test_chaos_oracle.py) keep their schedules
    (plan,) = chaos.plan_kills("foreachbatch", 1, 19)
    assert plan.kind == "fault-point" and plan.point == "sink.after_commit"
    plans = chaos.plan_kills("foreachbatch", 2, 49)
    assert plans[0].kind == "kill" and plans[1].point == "sink.after_commit"
    assert chaos.plan_kills("2pc", 30, 7) == chaos.plan_kills("2pc", 30, 7, faults="fault-point:1,kill:1")


def test_weights_pick_the_kinds_and_the_seed_fixes_them() -> None:
    weights = {"kill": 1, "pg-restart": 2, "kafka-cut": 1, "executor-loss": 1}
    plans = chaos.plan_kills("2pc", 400, 3, faults=weights)
    assert plans == chaos.plan_kills("2pc", 400, 3, faults=weights)
    counts = {k: sum(p.kind == k for p in plans) for k in weights}
    assert set(counts) == set(weights) and sum(counts.values()) == 400
    assert 130 < counts["pg-restart"] < 200 and all(50 < counts[k] < 120 for k in ("kill", "kafka-cut"))
    assert {p.kind for p in plans} == {"kill", "pg-restart", "kafka-cut", "executor-loss"}
    assert all(p.point is None for p in plans if p.kind != "fault-point")
    assert [p.describe() for p in plans[:1]] == [f"0: {plans[0].kind}"]


def test_chunks_give_faults_from_outside_records_before_and_after() -> None:
    plans = chaos.plan_kills("2pc", 6, 1, faults={"kill": 1, "pg-cut": 1})
    outside = sum(p.kind == "pg-cut" for p in plans)
    assert chaos.schedule.chunks(plans) == 6 + outside + 1
    # a kind fed while it is on gets a third: a job that keeps up during the fault has records after its heal
    fed = chaos.plan_kills("2pc", 4, 1, faults={"kill": 1, "disk-full": 1})
    assert [p.kind for p in fed].count("disk-full") == 2 and chaos.schedule.chunks(fed) == 4 + 2 * 2 + 1


@pytest.mark.parametrize(
    ("kinds", "named", "needle"),
    [
        (
            "broker-restart:1",
            {"kafka_named": "EOS_KAFKA_BOOTSTRAP"},
            "--faults broker-restart: needs a Kafka broker the chaos run starts itself (it restarts it), but "
            "EOS_KAFKA_BOOTSTRAP names yours; unset EOS_KAFKA_BOOTSTRAP",
        ),
        (
            "kafka-stall:1",
            {"kafka_named": "--bootstrap"},
            "--faults kafka-stall: needs a Kafka broker the chaos run "
            "starts itself (it advertises a proxy from it), but --bootstrap names yours",
        ),
        (
            "kill:1,pg-crash:2",
            {"postgres_named": "--dsn"},
            "--faults pg-crash: needs a Postgres spark-eos runs (it stops and starts the server), but --dsn names yours",
        ),
        (
            "pg-cut:1",
            {"dsn": "host=/var/run/postgresql dbname=x"},
            "--faults pg-cut: the Postgres DSN names no single TCP",
        ),
        ("slow-task:1", {"partitions": 1}, "--faults slow-task: needs --partitions >= 2"),
        (
            "leader-kill:1",
            {"kafka_named": "--bootstrap"},
            "--faults leader-kill: needs a Kafka broker the chaos run starts itself (it restarts it), but --bootstrap "
            "names yours",
        ),
        (
            "rolling-restart:1,broker-crash:1",
            {},
            "--faults rolling-restart and broker-crash: a chaos run has one Kafka, a three-node cluster "
            "(rolling-restart) or a single broker (broker-crash); run them in separate chaos runs",
        ),
    ],
)
def test_faults_the_setup_cannot_inject_are_refused_naming_the_fault(kinds: str, named: dict, needle: str) -> None:
    given = {"bootstrap": "127.0.0.1:9092", "dsn": "postgresql://u@127.0.0.1:5/db", "partitions": 2}
    given.update({k: v for k, v in named.items() if k in ("dsn", "partitions")})
    given.update(
        kafka_named=named.get("kafka_named"), postgres_named=named.get("postgres_named"), workdir="/nonexistent"
    )
    with pytest.raises(ConfigError) as exc:
        chaos.prepare(_NoServices(), faults=kinds, **given)  # refused before any service is asked for
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    # the same faults on services spark-eos runs: nothing refused
    setup = fault_kinds.Setup(dsn="postgresql://u@127.0.0.1:5/db", partitions=2)
    fault_kinds.refuse(fault_kinds.parse_faults("kill:1,pg-crash:1,broker-restart:1,kafka-cut:1,pg-cut:1"), setup)


class _NoServices:
    def kafka(self) -> None:
        pytest.fail("a broker was asked for")

    def postgres(self) -> None:
        pytest.fail("a Postgres was asked for")


def test_the_fault_kit_refuses_server_faults_without_the_postgres_service(tmp_path: Path) -> None:
    kit = fault_kit.FaultKit(
        {"pg-restart": 1}, bootstrap="127.0.0.1:1", dsn="postgresql://u@127.0.0.1:1/db", workdir=str(tmp_path)
    )
    with pytest.raises(ConfigError, match="pg-restart: needs the Postgres service spark-eos runs"), kit:
        pass


def test_hold_specs_parse_and_hold_the_first_task_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = chaos.schedule.hold_spec("source.read.start", 3, 0.01, log_others=True)
    assert [r.text for r in faults.parse_spec(spec)] == [
        "source.read.start:batch=3:action=sleep:seconds=0.01:once",
        "source.read.start:batch=3:action=sleep:seconds=0",
    ]
    log = tmp_path / "faults.jsonl"
    monkeypatch.setenv("EOS_FAULTS_LOG", str(log))
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path / "state"))
    for partition in (0, 1, 0):  # the first task is held, the others (a copy of it among them) are logged
        faults.point("source.read.start", spec=spec, batch=3, partition=partition, topic="t")
    faults.point("source.read.start", spec=spec, batch=4, partition=0, topic="t")  # another batch: nothing
    held = fault_kit.firings(str(log), spec.split(";")[0])
    assert len(held) == 1 and held[0]["partition"] == 0
    others = fault_kit.firings(str(log), spec.split(";")[1])
    assert [e["partition"] for e in others] == [1, 0]
    # a copy: the same task, another process, while the first was held
    copy = dict(others[1], pid=held[0]["pid"] + 1)
    (tmp_path / "f2.jsonl").write_text(json.dumps(held[0]) + "\n" + json.dumps(copy) + "\n")
    assert fault_kit.speculative_copy(str(tmp_path / "f2.jsonl"), held[0], spec.split(";")[1]) == copy
    late = dict(copy, time=held[0]["time"] + fault_kinds.HOLD_SECONDS + 5)
    (tmp_path / "f3.jsonl").write_text(json.dumps(held[0]) + "\n" + json.dumps(late) + "\n")
    assert fault_kit.speculative_copy(str(tmp_path / "f3.jsonl"), held[0], spec.split(";")[1]) is None


def test_executor_loss_refuses_a_process_under_no_executor() -> None:
    proof = fault_kit.kill_executor(os.getpid())
    assert proof["ok"] is False and "runs under no executor JVM" in proof["proof"]


def test_with_address_points_a_dsn_at_the_proxy_and_keeps_the_rest() -> None:
    from psycopg.conninfo import conninfo_to_dict

    moved = conninfo_to_dict(
        fault_kit.with_address("postgresql://u:pw@db.example:5432/app?sslmode=disable", "127.0.0.1", 6000)
    )
    assert moved["host"] == "127.0.0.1" and moved["port"] == "6000"
    assert moved["dbname"] == "app" and moved["user"] == "u" and moved["sslmode"] == "disable"


def test_a_start_marker_is_found_however_much_the_run_logged_after_it(tmp_path: Path) -> None:
    # found by a chaos run: stack traces of retries after a pg-cut pushed "RUNNER STARTED" out of a
    # 20 kB tail, and the loop waited 300 s for a start that had happened long before
    log = tmp_path / "pipeline.log"
    log.write_text("RUNNER STARTED pid=1 (an earlier run)\n")
    code = "import sys; print('RUNNER STARTED pid=2', flush=True); sys.stdout.write('x' * 200000 + '\\n')"
    proc = PipelineProcess([sys.executable, "-c", code], None, str(log)).start()
    assert not proc.logged("never logged")
    proc.wait(30)
    assert proc.logged("RUNNER STARTED pid=2") and not proc.logged("RUNNER STARTED pid=1")
    assert "RUNNER STARTED" not in proc.log_tail(20000)


def test_fault_log_lines_are_appended_whole(tmp_path: Path) -> None:
    log = str(tmp_path / "faults.jsonl")
    faults.append_log(log, {"point": "chaos.pg-cut", "action": "pg-cut", "time": time.time(), "ok": True})
    faults.append_log(log, {"point": "chaos.pg-stall", "action": "pg-stall", "time": time.time(), "ok": False})
    assert [e["action"] for e in fault_kit.iter_chaos_entries(log)] == ["pg-cut", "pg-stall"]


def test_cli_help_lists_every_fault_kind() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "connectors.toolkit.chaos", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="400"),
    )  # argparse wraps lines at hyphens
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and all(k in text for k in fault_kinds.KINDS), text


def test_the_producer_waits_out_a_broker_that_is_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by the broker faults: a producer's metadata request while the broker restarts failed the run
    from confluent_kafka import KafkaError, KafkaException

    calls: list[int] = []

    def flaky(bootstrap: str, topic: str, records: list, **kw: object) -> None:
        calls.append(len(records))
        if len(calls) < 3:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))

    monkeypatch.setattr(chaos.workload, "produce_records", flaky)
    monkeypatch.setattr(chaos.workload.time, "sleep", lambda _s: None)
    producer = chaos.workload.Producer(
        "127.0.0.1:1", "t", records=10, chunks=2, checkpoint=str(tmp_path / "ck"), seed=7
    )
    producer.write(5)
    assert calls == [5, 5, 5] and producer.written == 5
    producer.timeout = -1.0  # past the deadline: the error is the run's
    calls.clear()
    with pytest.raises(KafkaException):
        producer.write(5)
    assert producer.written == 5


def test_the_draining_run_runs_on_the_jobs_own_master_not_the_cluster_a_fault_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """executor-loss runs the job's runs on local-cluster (executor JVMs to kill), slow-task on a standalone
    cluster with speculation; the draining run carries no fault: the job's own master, none of the kit's conf."""
    started: list[list[str]] = []

    class Run:
        def __init__(self, argv: list[str], env: dict[str, str], log: str, root: str) -> None:
            started.append(argv)
            self.pid, self.log_path, self.returncode = 42, log, 0

        def start(self) -> Run:
            return self

        def wait(self, timeout: float) -> Run:
            return self

    monkeypatch.setattr(chaos.runs, "PipelineProcess", Run)
    cfg = chaos.ChaosConfig(
        "2pc",
        kills=1,
        seed=1,
        records=10,
        bootstrap="127.0.0.1:9",
        dsn="postgresql://u@h/d",
        workdir=str(tmp_path),
        master="local[3,2]",
    )
    for kinds, kit_master in (({"executor-loss": 1}, fault_kit.LOCAL_CLUSTER), ({"slow-task": 1}, "spark://h:7077")):
        kit = fault_kit.FaultKit(kinds, bootstrap=cfg.bootstrap, dsn=cfg.dsn)
        kit.master, kit.conf = kit_master, {"spark.speculation": "true", "spark.executor.memory": "768m"}
        runlog = chaos.runs.RunLog(str(tmp_path / "runs.jsonl"))
        state = chaos.RunState(bootstrap=cfg.bootstrap, topic="t", table="t", records=cfg.records)
        assert chaos.runs.drain(cfg, state, kit, {}, str(tmp_path), runlog).returncode == 0
        argv = started[-1]
        assert argv[argv.index("--master") + 1] == "local[3,2]" and "--conf" not in argv, argv
    assert [r["master"] for r in chaos.read_runs(str(tmp_path)) if r["role"] == "drain"] == ["local[3,2]"] * 2


# ---- disk-full: the checkpoint's filesystem full while the job runs --------------------------------------


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def test_disk_full_fills_the_checkpoints_own_filesystem_and_leaves_the_checkpoint_on_disk(tmp_path: Path) -> None:
    kit = fault_kit.FaultKit({"disk-full": 1}, bootstrap="127.0.0.1:1", dsn="", workdir=str(tmp_path))
    checkpoint = tmp_path / "checkpoint"
    log = tmp_path / "pipeline.log"
    fed: list[bool] = []

    def feed() -> None:  # the job, fed records, meets the full disk and says so
        fed.append(True)
        (checkpoint / "offsets").mkdir(exist_ok=True)
        try:
            (checkpoint / "offsets" / "7").write_bytes(b"x" * 8192)
        except OSError as exc:
            log.write_text(f"java.io.IOException: {exc.strerror}\n")

    with kit:
        assert _mounted(checkpoint)
        (checkpoint / "commits").mkdir()
        (checkpoint / "commits" / "6").write_text("v1\n{}\n")
        proof = kit.disturb("disk-full", feed)
        assert fed == [True] and proof["ok"], proof
        assert proof["write_refused"] and proof["job_met_it"] and proof["free_while_full"] < 4096, proof
        assert 3 <= proof["full_seconds"] < 30
        (checkpoint / "offsets" / "8").write_text("the disk is free again\n")
    assert not _mounted(checkpoint)
    assert (checkpoint / "commits" / "6").read_text() == "v1\n{}\n" and (checkpoint / "offsets" / "8").exists()
    assert not list(checkpoint.glob(".eos-disk-*"))


def test_disk_full_says_when_the_job_never_met_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fault_kit, "DISK_FULL_SECONDS", (0.2, 1.0))
    with fault_kit.FaultKit({"disk-full": 1}, bootstrap="b:1", dsn="", workdir=str(tmp_path)) as kit:
        proof = kit.disturb("disk-full")
    assert not proof["ok"] and proof["write_refused"] and "the job did NOT meet it" in proof["proof"], proof


def test_disk_full_is_refused_where_no_filesystem_can_be_mounted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="disk-full: mounts a 64 MB tmpfs for the job's checkpoint, which only root"):
        fault_kinds.refuse({"disk-full": 1}, fault_kinds.Setup())
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    fault_kinds.refuse({"disk-full": 1}, fault_kinds.Setup())
