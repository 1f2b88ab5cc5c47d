"""Issue 31 without services: ``spark-eos chaos --sink-kind kafka|kafka-partition`` on a job whose sink
is the kafka-eos Kafka sink. The runs' command lines, the fault points and hold points each mode draws,
the refusals of what cannot apply (naming the input and the fix), the job's wiring checked by the
runner, the dispatch to the topic checker and what it reports. The chaos run itself, on Apache Kafka:
integration/test_chaos_kafka_sink.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from connectors.toolkit import app_runner, chaos, checker, harness, pytest_plugin, topic_checker
from connectors.toolkit.chaos import kinds as fault_kinds
from connectors.toolkit.harness import Outcome
from eos_core import faults
from eos_core.errors import ConfigError
from sinks.kafka.markers import Marker


def _cfg(sink_kind: str = "kafka", **kw: Any) -> chaos.ChaosConfig:
    base: dict[str, Any] = dict(
        pipeline="app",
        kills=2,
        seed=32,
        records=120,
        bootstrap="127.0.0.1:9",
        dsn="",
        workdir="/tmp/w",
        app="rekey_job:build",
        sink_kind=sink_kind,
    )
    return chaos.ChaosConfig(**{**base, **kw})


def _state(topic: str = "src", table: str = "t", cfg: chaos.ChaosConfig | None = None) -> chaos.RunState:
    return chaos.RunState(bootstrap=(cfg or _cfg()).bootstrap, topic=topic, table=table, records=120)


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


class _Services:
    """A chaos run's services as the front door asks for them: what was asked, in order."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def kafka(self) -> Any:
        self.asked.append("kafka")
        return SimpleNamespace(bootstrap="b:1")

    def postgres(self) -> Any:
        self.asked.append("postgres")
        return SimpleNamespace(dsn="pg")


def _prepare(sink_kind: str = "kafka", faults: Any = "kill:1", services: Any = None, **kw: Any) -> chaos.ChaosConfig:
    given: dict[str, Any] = dict(bootstrap="127.0.0.1:9", kafka_named="--bootstrap", workdir="/tmp/w")
    return chaos.prepare(
        services or _Services(), app="rekey_job:build", sink_kind=sink_kind, faults=faults, **{**given, **kw}
    )


# ---- the runs' command lines ---------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "visibility"), [("kafka", "batch"), ("kafka-partition", "partition")])
def test_a_kafka_sink_run_hands_the_job_its_topic_and_visibility_and_no_postgres(kind: str, visibility: str) -> None:
    argv = chaos.runs.runner_argv(_cfg(kind), _state(), "chaos_app_32_9", "/tmp/w/checkpoint", "available-now")
    assert _flag(argv, "--out-topic") == "chaos_app_32_9_out" and _flag(argv, "--visibility") == visibility
    assert _flag(argv, "--dsn") == "" and _flag(argv, "--topic") == "src"
    # the runner takes them and hands them to the job
    args = app_runner.build_parser().parse_args(argv[argv.index("--app") :])
    assert (args.out_topic, args.visibility, args.dsn) == ("chaos_app_32_9_out", visibility, "")
    # a reference run writes a topic of its own
    ref = chaos.runs.runner_argv(_cfg(kind), _state(), "chaos_app_32_9_ref1", "/tmp/w/r1", "available-now")
    assert _flag(ref, "--out-topic") == "chaos_app_32_9_ref1_out"


def test_other_sink_kinds_get_no_out_topic_and_a_dsn_without_its_password() -> None:
    cfg = _cfg("2pc", dsn="postgresql://eos:s3cret@127.0.0.1:5/db")
    argv = chaos.runs.runner_argv(cfg, _state(cfg=cfg), "t", "/tmp/w/checkpoint", "available-now")
    assert "--out-topic" not in argv and "--visibility" not in argv
    assert "s3cret" not in " ".join(argv) and "s3cret" not in chaos.reproduce_command(cfg, None)
    assert harness.password_apart(cfg.dsn) == ("user=eos dbname=db host=127.0.0.1 port=5", {"PGPASSWORD": "s3cret"})
    assert harness.password_apart("") == ("", {})


def test_the_reproduce_command_names_the_sink_kind_and_a_custom_id_field() -> None:
    cmd = chaos.reproduce_command(_cfg("kafka-partition", id_field="pid", options={"drop_tests": "false"}), [1])
    for part in ("--sink-kind kafka-partition", "--id-field pid", "--only-kills 1", "--option drop_tests=false"):
        assert part in cmd, cmd


# ---- fault points and kinds ----------------------------------------------------------------------


def test_each_mode_draws_the_points_its_sink_passes() -> None:
    batch, partition = set(chaos.fault_points("kafka")), set(chaos.fault_points("kafka-partition"))
    assert batch | partition <= set(faults.POINTS)
    # visibility=batch: the driver's publish (before it, in the middle, after its commit); no task commits
    assert {"sink.commit.before_decision", "sink.publish.mid"} <= batch and "sink.task.after_commit" not in batch
    # visibility=partition: a task commits its own; the publish runs only for a partly written batch's replay
    assert "sink.task.after_commit" in partition and not {"sink.publish.mid", "sink.commit.before_decision"} & partition
    drawn = {p.point for p in chaos.plan_kills("kafka", 200, 3, faults="fault-point:1")}
    assert drawn == batch
    assert chaos.schedule.hold_point("kafka") == chaos.schedule.hold_point("kafka-partition") == "sink.after_write"
    assert chaos.KAFKA_SINK_KINDS == {"kafka": "batch", "kafka-partition": "partition"}
    assert {"kafka", "kafka-partition"} <= set(chaos.SINK_KINDS)


@pytest.mark.parametrize("fault", ["pg-restart", "pg-crash", "pg-stop", "pg-cut", "pg-stall"])
def test_postgres_faults_are_refused_for_a_job_writing_to_kafka(fault: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _prepare("kafka", {"kill": 1, fault: 1})
    msg = str(exc.value)
    assert msg.startswith(f"--faults {fault}: --sink-kind kafka: the run gives the job no Postgres"), msg
    assert f"drop {fault}" in msg
    # the plugin's names in the plugin's refusal
    with pytest.raises(ConfigError, match=f"^faults= {fault}: sink_kind= kafka-partition"):
        _prepare("kafka-partition", {fault: 1}, names=chaos.PLUGIN_NAMES)


def test_a_postgres_the_job_names_may_be_cut_not_restarted() -> None:
    dsn = "postgresql://u@127.0.0.1:5/db"
    services = _Services()
    cfg = _prepare("kafka", {"pg-cut": 1, "pg-stall": 1, "kill": 1}, services, dsn=dsn, postgres_named="--dsn")
    assert cfg.dsn == dsn and cfg.postgres_service is None and services.asked == []
    with pytest.raises(ConfigError, match="--faults pg-restart: --sink-kind kafka: it would stop and start a Postgres"):
        _prepare("kafka", {"pg-restart": 1}, dsn=dsn, postgres_named="--dsn")
    # every other kind applies (the broker faults on a broker of the run's own: none named, none asked for)
    # (the replicated cluster's kinds in a run of their own: a run has one Kafka)
    replicated = {k for k, kind in fault_kinds.KINDS.items() if "kafka-cluster" in kind.needs}
    assert replicated == {"leader-kill", "rolling-restart"}
    others = {k: 1 for k in fault_kinds.KINDS if not k.startswith("pg-") and k not in replicated}
    for kinds in (others, dict.fromkeys(replicated, 1)):
        cfg = _prepare("kafka", kinds, services, bootstrap=None, kafka_named=None, dead_letters="{table}_dlq")
        assert cfg.bootstrap == "" and services.asked == []
    # a job writing to Postgres gets the Postgres the run starts, whose server the faults restart
    cfg = _prepare("2pc", {"pg-restart": 1}, services, dead_letters="public.x")
    assert services.asked == ["postgres"] and cfg.dsn == "pg" and cfg.postgres_service is not None


def test_dead_letters_of_a_kafka_job_must_be_a_topic_name() -> None:
    with pytest.raises(ConfigError, match=r"--dead-letters '\{table\} refused': with --sink-kind kafka .*errors.topic"):
        _prepare("kafka", dead_letters="{table} refused")


def _chaos_argv(*extra: str) -> list[str]:
    return ["--app", "rekey_job:build", "--kills", "2", "--bootstrap", "127.0.0.1:9", *extra]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--pipeline", "2pc", "--sink-kind", "kafka"], "--sink-kind kafka needs --app"),
        (
            _chaos_argv("--sink-kind", "kafka", "--faults", "kill:1,pg-restart:1"),
            "--faults pg-restart: --sink-kind kafka: the run gives the job no Postgres",
        ),
        (_chaos_argv("--sink-kind", "kafka-partition", "--faults", "pg-cut:1"), "name it with --dsn"),
        (_chaos_argv("--sink-kind", "kafka", "--dead-letters", "a/b"), "--dead-letters 'a/b'"),
    ],
)
def test_the_command_refuses_before_any_service_starts(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from connectors import services

    monkeypatch.delenv("EOS_POSTGRES_DSN", raising=False)
    monkeypatch.setattr(services, "kafka", lambda: pytest.fail("a broker was started"))
    monkeypatch.setattr(services, "postgres", lambda: pytest.fail("a Postgres was started"))
    assert chaos.main(argv) == 64
    err = capsys.readouterr().err
    assert err.startswith("chaos: config error: ") and needle in err, err


def test_a_kafka_job_gets_no_postgres_unless_one_is_named() -> None:
    services = _Services()
    cfg = _prepare("kafka", services=services, bootstrap=None, kafka_named=None)
    assert services.asked == ["kafka"] and (cfg.bootstrap, cfg.dsn, cfg.postgres_service) == ("b:1", "", None)
    cfg = _prepare("2pc", services=services)
    assert services.asked == ["kafka", "postgres"] and cfg.dsn == "pg" and cfg.bootstrap == "127.0.0.1:9"


def test_the_plugin_asks_its_fixtures_for_no_postgres_for_a_kafka_job() -> None:
    asked: list[str] = []
    fixtures = {"eos_kafka": SimpleNamespace(bootstrap="b:1"), "eos_postgres": SimpleNamespace(dsn="pg", kind="x")}
    request = SimpleNamespace(getfixturevalue=lambda name: asked.append(name) or fixtures[name])
    session = pytest_plugin.SessionServices(request)  # type: ignore[arg-type]
    cfg = _prepare("kafka-partition", services=session, bootstrap=None, kafka_named=None, names=chaos.PLUGIN_NAMES)
    assert (cfg.bootstrap, cfg.dsn) == ("b:1", "") and asked == ["eos_kafka"]
    cfg = _prepare("2pc", {"broker-restart": 1}, session, bootstrap=None, kafka_named=None)
    assert cfg.bootstrap == "" and cfg.postgres_service is fixtures["eos_postgres"] and asked[-1] == "eos_postgres"


# ---- the job's wiring, checked by the runner -----------------------------------------------------


def _job(visibility: str = "partition", out: str = "t_out") -> app_runner.Job:
    return app_runner.Job("b:1", "src", "", "t", out_topic_name=out, visibility=visibility)


def _writer(fmt: str, **options: str) -> Any:
    w = SimpleNamespace()
    app_runner.sink_of(w).update(format=fmt, options=options)
    return w


def test_a_job_wired_as_the_run_asks_is_accepted() -> None:
    ok = {"topic": "t_out", "sink.id": "t", "visibility": "partition"}
    assert app_runner.sink_refusal(_writer("kafka-eos", **ok), _job()) is None
    # visibility=batch is the sink's default; a foreachBatch is not looked into; other runs, other sinks
    assert app_runner.sink_refusal(_writer("kafka-eos", topic="t_out", **{"sink.id": "t"}), _job("batch")) is None
    assert app_runner.sink_refusal(_writer("foreachBatch"), _job()) is None
    assert app_runner.sink_refusal(_writer("postgres-2pc"), _job(out="")) is None


@pytest.mark.parametrize(
    ("fmt", "options", "needle"),
    [
        (
            "postgres-2pc",
            {},
            "--sink-kind kafka-partition: the job's query writes with format('postgres-2pc'), not "
            "with the kafka-eos sink; run it with the --sink-kind of its sink",
        ),
        ("", {}, "writes with Spark's default format (no .format())"),
        ("kafka-eos", {"sink.id": "t", "visibility": "partition"}, "has no option 'topic', the run needs 't_out'"),
        (
            "kafka-eos",
            {"topic": "mine", "sink.id": "t", "visibility": "partition"},
            "has topic='mine', the run needs 't_out' (the topic the run creates and reads back read_committed): "
            "give it .option('topic', job.out_topic)",
        ),
        ("kafka-eos", {"topic": "t_out", "sink.id": "x", "visibility": "partition"}, ".option('sink.id', job.sink_id)"),
        ("kafka-eos", {"topic": "t_out", "sink.id": "t"}, "has visibility='batch', the run needs 'partition'"),
        (
            "kafka-eos",
            {"topic": "t_out", "sink.id": "t", "visibility": "partition", "marker.topic": "m"},
            "marker.topic='m'; the run reads them from job.out_topic",
        ),
    ],
)
def test_a_job_not_wired_as_the_run_asks_is_refused_saying_how_to_fix_it(
    fmt: str, options: dict[str, str], needle: str
) -> None:
    why = app_runner.sink_refusal(_writer(fmt, **options), _job())
    assert why is not None and needle in why, why


def test_a_kafka_sink_job_under_another_sink_kind_is_refused() -> None:
    why = app_runner.sink_refusal(_writer("kafka-eos", topic="x"), _job(out=""))
    assert why is not None and "run it with --sink-kind kafka (visibility=batch) or kafka-partition" in why
    with pytest.raises(ConfigError, match=r"job.out_topic: .*needs --sink-kind kafka or kafka-partition"):
        _ = _job(out="").out_topic


def test_the_writer_remembers_what_build_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    for name in ("format", "option", "options"):  # restored after the test
        monkeypatch.setattr(DataStreamWriter, name, getattr(DataStreamWriter, name))
    jvm = SimpleNamespace(calls=[])
    jvm.format = lambda s: jvm.calls.append(("format", s)) or jvm
    jvm.option = lambda k, v: jvm.calls.append((k, v)) or jvm
    writer = DataStreamWriter.__new__(DataStreamWriter)
    writer._jwrite = jvm
    app_runner.record_sink()
    app_runner.record_sink()  # once only
    out = writer.format("kafka-eos").option("Topic", "t_out").option("skipped", None)
    out.options(**{"sink.id": "t", "visibility": "partition"})
    assert app_runner.sink_of(writer) == {
        "format": "kafka-eos",
        "options": {"topic": "t_out", "sink.id": "t", "visibility": "partition"},
    }
    assert jvm.calls == [("format", "kafka-eos"), ("Topic", "t_out"), ("sink.id", "t"), ("visibility", "partition")]
    assert app_runner.sink_refusal(writer, _job()) is None


def test_a_refusal_ends_the_runner_with_64_and_the_chaos_run_with_its_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def start() -> Any:
        raise ConfigError("--sink-kind kafka: the job's query writes with format('console')")

    assert app_runner.serve(start, 5) == chaos.REFUSED_EXIT == 64
    err = capsys.readouterr().err
    assert err.startswith("RUNNER REFUSED: --sink-kind kafka: the job's query writes with format('console')"), err
    with pytest.raises(ConfigError, match=r"^--sink-kind kafka: the job's query writes with format\('console'\)$"):
        chaos.raise_refusal(Outcome(64, 9.0, "spark said things\n" + err + "more\n"))
    chaos.raise_refusal(Outcome(2, 9.0, err))  # a failure is not a refusal: the next run may fare better
    chaos.raise_refusal(Outcome(64, 9.0, "no reason printed"))
    chaos.raise_refusal(None)


# ---- the checker's dispatch and the topic checker ------------------------------------------------


def test_a_kafka_sink_run_is_checked_by_the_topic_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(topic_checker, "verify_topic", lambda **kw: calls.append(("topic", kw)) or checker.Report())
    monkeypatch.setattr(checker, "verify", lambda **kw: calls.append(("table", kw)) or checker.Report())
    chaos.verdict.verify_output(
        _cfg("kafka-partition", payload_fields=("account",), dead_letters="{table}_dlq"), _state(), "/c"
    )
    chaos.verdict.verify_output(_cfg("kafka", oracle="append"), _state(), "/c")
    chaos.verdict.verify_output(_cfg("2pc", dsn="pg"), _state(), "/c")
    chaos.verdict.verify_output(_cfg("kafka", app=None, pipeline="2pc", dsn="pg"), _state(), "/c")
    assert [c[0] for c in calls] == ["topic", "topic", "table", "table"]
    first, second = calls[0][1], calls[1][1]
    assert (first["source_topic"], first["sink_topic"], first["sink_id"], first["checkpoint"]) == (
        "src",
        "t_out",
        "t",
        "/c",
    )
    assert first["visibility"] == "partition" and first["records"] is True and first["errors_topic"] == "t_dlq"
    assert first["payload_fields"] == ("account",)
    assert second["visibility"] == "batch" and second["records"] is False  # the oracle judges the records
    assert calls[2][1]["table"] == "t" and calls[2][1]["decisions"] is True


def test_the_oracle_reads_a_kafka_jobs_topic_and_the_run_makes_its_topics(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[tuple[str, Any]] = []
    made: list[tuple[str, int]] = []
    monkeypatch.setattr(
        topic_checker, "topic_rows", lambda b, t, latest_by=None, decode=None: read.append((t, latest_by)) or []
    )
    monkeypatch.setattr(chaos.workload, "create_topic", lambda b, t, n: made.append((t, n)))
    chaos.verdict.output_rows(_cfg("kafka", oracle="upsert", oracle_key=("id",)), "b:1", "t_ref1")
    chaos.verdict.output_rows(_cfg("kafka-partition", oracle="append"), "b:1", "t")
    assert read == [("t_ref1_out", ("id",)), ("t_out", None)]
    assert chaos.verdict.written(_cfg("kafka"), "t") == "topic t_out" and chaos.verdict.written(_cfg("2pc"), "t") == "t"
    chaos.workload.make_out_topics(_cfg("kafka", partitions=3, dead_letters="{table}_dlq"), "b:1", "t")
    chaos.workload.make_out_topics(_cfg("2pc"), "b:1", "t")
    assert made == [("t_out", 3), ("t_dlq", 1)]


def test_topic_rows_are_what_a_read_committed_reader_ends_with(monkeypatch: pytest.MonkeyPatch) -> None:
    held = [
        {"value": b'{"id": "p1", "n": 1}', "key": b"a", "headers": [("src", b"0:1")]},
        {"value": b"not json", "key": None, "headers": None},
        {"value": b'{"id": "p1", "n": 2}', "key": b"a", "headers": None},
        {"value": b'{"id": "p2"}', "key": b"\xff", "headers": None},
        {"value": None, "key": b"\xff", "headers": None},  # a tombstone: a compacted topic forgets key 0xff
    ]
    monkeypatch.setattr(
        topic_checker, "read_topic", lambda *a, **k: [dict(r, _partition=0, _offset=i) for i, r in enumerate(held)]
    )
    rows = topic_checker.topic_rows("b:1", "t")
    assert rows[0] == {"id": "p1", "n": 1, "_key": "a", "_headers": [["src", "0:1"]]}
    assert rows[1] == {"_value": "not json", "_key": None} and rows[3] == {"id": "p2", "_key": "0xff"}
    latest = topic_checker.topic_rows("b:1", "t", latest_by=["id"])
    assert latest == [{"_value": "not json", "_key": None}, {"id": "p1", "n": 2, "_key": "a"}]


def _topic_report(monkeypatch: pytest.MonkeyPatch, modes: list[str], **kw: Any) -> checker.Report:
    markers = {f"g{i}": Marker(7, "l", "q", 1, "d", m) for i, m in enumerate(modes)}
    monkeypatch.setattr(topic_checker, "read_topic", lambda *a, **k: pytest.fail("records read"))
    monkeypatch.setattr(topic_checker, "open_transactions", lambda b, t: {})
    monkeypatch.setattr(topic_checker, "marker_batches", lambda b, s, t: markers)
    monkeypatch.setattr(topic_checker, "last_commit", lambda c: 7)
    return topic_checker.verify_topic(
        bootstrap="b:1", source_topic="s", sink_topic="t", sink_id="t", checkpoint="/c", records=False, **kw
    )


def test_the_topic_checker_holds_the_sink_to_the_visibility_the_run_names(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _topic_report(monkeypatch, ["partition", "partition"], visibility="partition")
    assert report.ok and [c.name for c in report.checks] == [
        "end.open_transactions",
        "end.marker_vs_commit",
        "end.visibility",
    ], report.table()
    bad = _topic_report(monkeypatch, ["batch"], visibility="partition").get("end.visibility")
    assert not bad.ok and "give it .option('visibility', job.visibility)" in bad.summary, bad.summary
    assert not _topic_report(monkeypatch, [], visibility="batch").get("end.visibility").ok  # no marker at all
    assert "end.visibility" not in [c.name for c in _topic_report(monkeypatch, ["batch"]).checks]


def test_the_job_runs_with_its_own_kafka_config_else_the_toolkits_and_none_on_a_broker_of_its_own(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secured cluster: the job's kafka.* options carry --app-kafka-config's settings (its own principal),
    else the toolkit's own file (EOS_KAFKA_CONFIG); on a broker the run starts itself, that broker's
    properties, which the fault kit names in EOS_KAFKA_CONFIG while it runs (none on a plaintext one)."""
    app_props, toolkit_props = tmp_path / "app.properties", tmp_path / "admin.properties"
    app_props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n")
    toolkit_props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n")
    monkeypatch.setenv("EOS_KAFKA_CONFIG", str(toolkit_props))
    cfg = _prepare("2pc", dsn="dbname=x", app_kafka_config=str(app_props))
    argv = chaos.runs.runner_argv(cfg, _state(cfg=cfg), "t", "/tmp/w/checkpoint", "available-now")
    args = app_runner.build_parser().parse_args(argv[argv.index("--app") :])
    job = app_runner.Job(args.bootstrap, args.topic, args.dsn, args.table, kafka_config=args.kafka_config)
    assert job.kafka_options == {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
    }
    assert f"--app-kafka-config {app_props}" in chaos.reproduce_command(cfg, None)
    toolkit = _cfg("2pc")
    assert _flag(chaos.runs.runner_argv(toolkit, _state(), "t", "/c", "available-now"), "--kafka-config") == str(
        toolkit_props
    )
    # the faults need a broker of the run's own (kit.FaultKit): --app-kafka-config's principal is not on it
    own = _cfg("2pc", bootstrap="", app_kafka_config=str(app_props))
    own_argv = chaos.runs.runner_argv(own, _state(cfg=own), "t", "/c", "available-now")
    assert _flag(own_argv, "--kafka-config") == str(toolkit_props)
    monkeypatch.delenv("EOS_KAFKA_CONFIG")  # a plaintext broker of the run's own, or a plaintext cluster
    assert "--kafka-config" not in chaos.runs.runner_argv(own, _state(cfg=own), "t", "/c", "available-now")
    assert "--kafka-config" not in chaos.runs.runner_argv(_cfg("2pc"), _state(), "t", "/c", "available-now")
    assert app_runner.Job("b:1", "t", "", "x").kafka_options == {"kafka.bootstrap.servers": "b:1"}
    with pytest.raises(ConfigError, match="--app-kafka-config: Kafka client properties"):
        _prepare("2pc", dsn="dbname=x", app_kafka_config=str(tmp_path / "missing.properties"))
