"""Unit tests of the CLI surface, restart strategies, pipeline configs, inspect and savepoints (no services)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from connectors import cli
from connectors.inspect import inspect, render
from connectors.pipelines.config import load_config, parse_config, parse_trigger
from connectors.pipelines.restart import ExponentialBackoff, FailureRate, FixedDelay, NoRestart, parse_strategy
from connectors.savepoint import create, restore
from eos_core.errors import ConfigError

# ---------------------------------------------------------------------------------------------
# restart strategies (fake clock: the strategy only sees the times we pass)


def test_fixed_delay_gives_up_after_attempts() -> None:
    s = parse_strategy("fixed-delay:2:10s")
    assert isinstance(s, FixedDelay)
    assert [s.on_failure(t) for t in (0.0, 100.0, 200.0)] == [10.0, 10.0, None]


def test_exponential_backoff_grows_caps_and_resets() -> None:
    s = parse_strategy("exponential-backoff:1s:5s:2")
    assert isinstance(s, ExponentialBackoff)
    assert [s.on_failure(float(t)) for t in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    s.on_healthy(10.0)
    assert s.on_failure(11.0) == 1.0


def test_failure_rate_counts_failures_in_the_sliding_interval() -> None:
    s = parse_strategy("failure-rate:2:1m:3s")
    assert isinstance(s, FailureRate)
    assert s.on_failure(0.0) == 3.0
    assert s.on_failure(10.0) == 3.0
    assert s.on_failure(20.0) is None  # third failure within 60 s
    s2 = parse_strategy("failure-rate:2:1m:3s")
    assert [s2.on_failure(t) for t in (0.0, 10.0, 61.0, 71.0)] == [3.0, 3.0, 3.0, 3.0]  # old ones slid out


def test_none_never_restarts() -> None:
    assert isinstance(parse_strategy("none"), NoRestart)
    assert parse_strategy("none").on_failure(0.0) is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("fixed", "unknown strategy 'fixed'"),
        ("fixed-delay:3", "takes 2 parameters, got 1"),
        ("fixed-delay:x:1s", "ATTEMPTS 'x' is not a whole number"),
        ("fixed-delay:3:soon", "DELAY 'soon' is not a duration"),
        ("exponential-backoff:5s:1s:2", "MAX >= INITIAL"),
        ("exponential-backoff:1s:5s:0.5", "MULTIPLIER must be >= 1"),
        ("failure-rate:-1:1m:1s", "MAX_FAILURES must be at least 0"),
    ],
)
def test_bad_strategies_name_the_problem_and_the_forms(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_strategy(text)
    assert needle in str(err.value)
    assert "fixed-delay:ATTEMPTS:DELAY" in str(err.value)


# ---------------------------------------------------------------------------------------------
# configs

GOOD = {
    "pipeline": "ledger",
    "source": {"bootstrap": "h:1", "topic": "t"},
    "sink": {"dsn": "postgresql://u@h/db", "table": "ledger"},
    "spark": {"checkpoint": "/tmp/c", "trigger": "2s"},
}


def test_shipped_configs_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", "k:9")
    monkeypatch.setenv("EOS_POSTGRES_DSN", "postgresql://u@h/db")  # a pipeline writing to Kafka takes none
    for name in ("ledger.toml", "balances.toml", "ledger.yaml", "transfers.toml"):
        cfg = load_config(os.path.join(root, "configs", name))
        assert cfg.bootstrap == "k:9"
        assert cfg.pipeline == name.split(".")[0]
    bal = load_config(os.path.join(root, "configs", "balances.toml"))
    assert bal.ttl_seconds == 7 * 24 * 3600 and bal.last_n == 10
    tr = load_config(os.path.join(root, "configs", "transfers.toml"))
    assert (tr.sink_topic, tr.dead_letter_topic, tr.effective_sink_id) == (
        "transfers",
        "transfers-dead-letters",
        "transfers",
    )
    assert (tr.dsn, tr.table, tr.dead_letter_table, tr.sink_options) == ("", "", None, {"visibility": "batch"})


def test_config_values_and_env_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOPIC", "payments")
    cfg = parse_config({**GOOD, "source": {"bootstrap": "h:1", "topic": "${MY_TOPIC}"}})
    assert cfg.topic == "payments" and parse_trigger(cfg.trigger) == ("processing", 2.0)
    assert cfg.effective_sink_id == "ledger"
    assert parse_trigger("available-now") == ("available-now", 0.0)


@pytest.mark.parametrize(
    ("master", "submitted", "want_master", "same_python"),
    [
        ("", False, "local[*]", True),  # no master anywhere: this machine
        ("", True, None, False),  # under spark-submit: its --master holds, its environment too
        ("local-cluster[2,1,1024]", False, "local-cluster[2,1,1024]", True),
        ("spark://h:7077", False, "spark://h:7077", False),  # a cluster: what the user ships
        ("spark://h:7077", True, "spark://h:7077", False),  # the config's master wins
    ],
)
def test_pipeline_session_on_this_machine_or_a_cluster(
    monkeypatch: pytest.MonkeyPatch, master: str, submitted: bool, want_master: str | None, same_python: bool
) -> None:
    from connectors import pipelines
    from connectors.services import spark as spark_services

    seen: dict = {}
    monkeypatch.setattr(spark_services, "local_session", lambda app, m, **kw: seen.update(master=m, **kw))
    if submitted:
        monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    else:
        monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    cfg = parse_config({**GOOD, "spark": {**GOOD["spark"], "master": master, "conf": {"spark.archives": "e.zip#env"}}})
    pipelines.session(cfg)
    assert seen["master"] == want_master and seen["same_python"] is same_python
    # executors of a cluster never get the driver's sys.path: they import what the archive holds
    assert ("spark.executorEnv.PYTHONPATH" in seen) is same_python
    assert seen["spark.archives"] == "e.zip#env"


def test_submit_file_runs_a_command_as_spark_submit_would(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "connectors.cli", "submit-file"], capture_output=True, text=True)
    path = out.stdout.strip()
    assert out.returncode == 0 and path.endswith("spark_submit.py") and os.path.isfile(path)
    # spark-submit runs the file as a script: its directory first on sys.path must shadow nothing
    beside = {f.removesuffix(".py") for f in os.listdir(os.path.dirname(path)) if f != "__pycache__"}
    assert beside == {"__init__", "spark_submit", "pyspark_daemon"}, beside
    for name in beside - {"__init__"}:  # no module of the standard library or of an installed package has its name
        assert name not in sys.stdlib_module_names and importlib.util.find_spec(name) is None, name
    ran = subprocess.run([sys.executable, path, "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == 0 and ran.stdout.startswith("spark-eos "), ran.stderr


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"colour": 1}, "unknown key(s) 'colour'"),
        ({"spark": {"checkpoint": "/c", "tigger": "1s"}}, "spark.tigger"),
        ({"spark": {"checkpoint": "/c", "trigger": "fast"}}, "spark.trigger 'fast'"),
        ({"spark": {"trigger": "1s"}}, "'spark.checkpoint' is required"),
        ({"pipeline": "mirror"}, "pipeline 'mirror' is unknown"),
        ({"restart": {"strategy": "always"}}, "unknown strategy 'always'"),
        ({"ledger": {"malformed": "drop"}}, "ledger.malformed = 'drop'"),
        ({"balances": {"ttl": "soon"}}, "'balances.ttl' 'soon'"),
        ({"source": {"bootstrap": "h:1", "topic": "t", "max_offsets_per_trigger": "many"}}, "must be int"),
        ({"sink": {"dsn": "${EOS_SURELY_UNSET_VAR}", "table": "x"}}, "EOS_SURELY_UNSET_VAR is not set"),
    ],
)
def test_bad_configs_give_clear_errors(change: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({**GOOD, **change})
    assert needle in str(err.value)


TRANSFERS = {
    "pipeline": "transfers",
    "source": {"bootstrap": "h:1", "topic": "payments"},
    "sink": {"topic": "transfers"},
    "spark": {"checkpoint": "/tmp/c"},
}


def test_transfers_config_takes_a_topic_and_no_postgres() -> None:
    cfg = parse_config(TRANSFERS)
    assert (cfg.sink_topic, cfg.dead_letter_topic, cfg.effective_sink_id, cfg.target) == (
        "transfers",
        "transfers-dead-letters",
        "transfers",
        "transfers",
    )
    cfg = parse_config({**TRANSFERS, "transfers": {"dead_letters": "bad-payments", "partitions": 4}})
    assert (cfg.dead_letter_topic, cfg.topic_partitions) == ("bad-payments", 4)
    assert parse_config({**TRANSFERS, "transfers": {"malformed": "fail"}}).dead_letter_topic is None
    assert parse_config(GOOD).dead_letter_topic is None  # the Postgres pipelines have tables


def test_kafka_config_secures_the_source_and_the_kafka_sink(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """source.kafka_config (else EOS_KAFKA_CONFIG, which `spark-eos run --kafka-config` sets) is the cluster's
    security for every Kafka client of a pipeline; source.options / sink.options given beside it win."""
    from connectors.pipelines import transfers
    from connectors.pipelines.source import kafka_stream

    props = tmp_path / "app.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nssl.truststore.type=PEM\n")
    monkeypatch.delenv("EOS_KAFKA_CONFIG", raising=False)
    assert parse_config(GOOD).kafka_options == {"kafka.bootstrap.servers": "h:1"}  # none: a plaintext cluster
    cfg = parse_config({**TRANSFERS, "source": {**TRANSFERS["source"], "kafka_config": str(props)}})
    secured = {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512"}
    assert secured.items() <= transfers.sink_options(cfg).items()
    monkeypatch.setenv("EOS_KAFKA_CONFIG", str(props))
    cfg = parse_config({**GOOD, "source": {**GOOD["source"], "options": {"kafka.sasl.mechanism": "PLAIN"}}})
    assert cfg.kafka_config == str(props)

    class Reader:  # takes what kafka_stream hands Spark, later options over earlier ones
        given: dict[str, str] = {}

        def format(self, _: str) -> Reader:
            return self

        def options(self, **kv: str) -> Reader:
            self.given.update(kv)
            return self

        def option(self, key: str, value: str) -> Reader:
            return self.options(**{key: value})

        def load(self) -> dict[str, str]:
            return self.given

    given = kafka_stream(type("Spark", (), {"readStream": Reader()})(), cfg)
    assert given["kafka.security.protocol"] == "SASL_SSL" and given["kafka.sasl.mechanism"] == "PLAIN", given
    with pytest.raises(ConfigError, match=r"source\.kafka_config.*cannot read it") as caught:
        parse_config({**GOOD, "source": {**GOOD["source"], "kafka_config": str(tmp_path / "missing.properties")}})
    assert caught.value.option == "source.kafka_config"


@pytest.mark.parametrize(
    ("pipeline", "change", "needle", "key"),
    [
        # what each pipeline requires: Postgres for ledger and balances, a topic for transfers
        ("transfers", {"sink": {}}, "config: 'sink.topic' is required and empty", "sink.topic"),
        (
            "ledger",
            {"sink": {"dsn": "postgresql://u@h/db"}},
            "config: 'sink.table' is required and empty",
            "sink.table",
        ),
        ("balances", {"sink": {"table": "b"}}, "config: 'sink.dsn' is required and empty", "sink.dsn"),
        # keys of the other kind of sink are refused, not ignored
        (
            "transfers",
            {"sink": {"topic": "t", "dsn": "postgresql://u@h/db"}},
            "'sink.dsn' does not apply to pipeline 'transfers' (it writes to Kafka: set sink.topic); remove it",
            "sink.dsn",
        ),
        ("transfers", {"sink": {"topic": "t", "table": "x"}}, "'sink.table' does not apply", "sink.table"),
        (
            "ledger",
            {"sink": {**GOOD["sink"], "topic": "t"}},
            "'sink.topic' does not apply to pipeline 'ledger' (it "
            "writes to Postgres: set sink.dsn and sink.table); remove it",
            "sink.topic",
        ),
        # the topics: names Kafka takes, and no loop or mix-up between them
        (
            "transfers",
            {"sink": {"topic": "no spaces"}},
            "'sink.topic' = 'no spaces' is not a Kafka topic name",
            "sink.topic",
        ),
        ("transfers", {"sink": {"topic": "payments"}}, "'sink.topic' = 'payments' is source.topic too", "sink.topic"),
        (
            "transfers",
            {"transfers": {"dead_letters": "payments"}},
            "'transfers.dead_letters' = 'payments' is source.topic too",
            "transfers.dead_letters",
        ),
        (
            "transfers",
            {"transfers": {"dead_letters": "transfers"}},
            "'transfers.dead_letters' = 'transfers' is sink.topic too",
            "transfers.dead_letters",
        ),
        (
            "transfers",
            {"sink": {"topic": "t", "options": {"topic": "t"}}},
            "'sink.options.topic' would send every row, malformed events too, to one topic",
            "sink.options.topic",
        ),
        ("transfers", {"transfers": {"partitions": -1}}, "transfers.partitions must be >= 0", "transfers.partitions"),
        (
            "transfers",
            {"transfers": {"partitions": "many"}},
            "'transfers.partitions' must be int",
            "transfers.partitions",
        ),
        ("transfers", {"transfers": {"malformed": "drop"}}, "transfers.malformed = 'drop'", "transfers.malformed"),
        ("transfers", {"transfers": {"topic": "x"}}, "unknown key(s) transfers.topic", "transfers.topic"),
    ],
)
def test_each_pipeline_requires_its_sinks_keys(pipeline: str, change: dict, needle: str, key: str) -> None:
    base = TRANSFERS if pipeline == "transfers" else {**GOOD, "pipeline": pipeline}
    with pytest.raises(ConfigError) as err:
        parse_config({**base, **change})
    text = str(err.value)
    assert needle in text and "\n" not in text, text  # one line, naming the key
    assert err.value.fields.get("option") == key


def test_transfers_ignores_the_environments_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    """EOS_POSTGRES_DSN is what ledger and balances default sink.dsn to; transfers has no dsn to default."""
    monkeypatch.setenv("EOS_POSTGRES_DSN", "postgresql://u:secret@h/db")
    assert parse_config(TRANSFERS).dsn == ""
    assert parse_config({**GOOD, "sink": {"table": "ledger"}}).dsn == "postgresql://u:secret@h/db"


def test_bad_config_files(tmp_path) -> None:
    bad = tmp_path / "x.toml"
    bad.write_text("pipeline = [unclosed")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"))
    ini = tmp_path / "x.ini"
    ini.write_text("")
    with pytest.raises(ConfigError, match="unknown extension"):
        load_config(str(ini))


# ---------------------------------------------------------------------------------------------
# the command line


def test_every_command_has_help() -> None:
    parser = cli.build_parser()
    commands = ["demo", "run", "inspect", "savepoint", "verify", "services", "sinks", "chaos"]
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(commands) <= set(sub.choices)
    for name in commands:
        text = sub.choices[name].format_help()
        assert "usage: spark-eos " + name in text
        assert "unavailable" not in text


def test_console_help_and_bad_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "demo" in out.stdout and "savepoint" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "frobnicate"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 64 and "invalid choice: 'frobnicate'" in bad.stderr  # usage error: documented 64


def test_run_with_a_bad_config_exits_with_a_clear_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text('pipeline = "ledger"\n[spark]\ntrigger = "often"\n')
    assert cli.main(["run", "ledger", "--config", str(path)]) == cli.EXIT_CONFIG
    assert "'source.bootstrap' is required" in capsys.readouterr().err
    path.write_text(
        'pipeline = "balances"\n[source]\nbootstrap="h:1"\ntopic="t"\n[sink]\ndsn="postgresql://h/d"\n'
        'table="b"\n[spark]\ncheckpoint="/tmp/x"\n'
    )
    with pytest.raises(SystemExit):
        cli.main(["run", "ledger", "--config", str(path)])


# ---------------------------------------------------------------------------------------------
# inspect and savepoints on a hand-made checkpoint (Spark's layout)


def _checkpoint(root) -> str:
    ck = root / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    (ck / "sources" / "0").mkdir(parents=True)
    (ck / "metadata").write_text('{"id":"q-1"}')
    (ck / "sources" / "0" / "0").write_text('v1\n{"t":{"0":0}}')
    conf = {
        "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    }
    for n in range(4):  # batches 0..3 planned, 0..2 committed
        (ck / "offsets" / str(n)).write_text(
            "v1\n" + json.dumps({"batchTimestampMs": n, "conf": conf}) + "\n" + json.dumps({"t": {"0": 10 * (n + 1)}})
        )
        if n < 3:
            (ck / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    part = ck / "state" / "0" / "0"
    part.mkdir(parents=True)
    for v in range(1, 6):
        (part / f"{v}.changelog").write_text("x" * v)
    (part / "2.zip").write_text("zip")
    (part / "SSTs").mkdir()
    (part / "SSTs" / "a.sst").write_text("sst")
    return str(ck)


def test_inspect_reads_batches_offsets_commits_and_state(tmp_path) -> None:
    info = inspect(_checkpoint(tmp_path))
    assert info["query_id"] == "q-1"
    assert info["last_planned"] == 3 and info["last_committed"] == 2 and info["uncommitted"] == [3]
    assert info["batches"][1]["sources"] == [{"t": {"0": 20}}]
    st = info["state_store"]
    assert "RocksDB" in st["provider"] and st["changelog_checkpointing"] == "true"
    assert st["operators"][0]["versions"] == [1, 5] and st["operators"][0]["changelog"]
    text = render(info)
    assert "committed up to 2" in text and '{"t": {"0": 40}}' in text
    assert json.loads(render(info, as_json=True))["last_committed"] == 2
    with pytest.raises(ValueError, match="not a streaming checkpoint"):
        inspect(str(tmp_path))


def test_savepoint_round_trip_keeps_the_consistent_prefix(tmp_path) -> None:
    ck = _checkpoint(tmp_path)
    sp = str(tmp_path / "sp")
    manifest = create(ck, sp)
    assert manifest["last_commit"] == 2 and manifest["last_planned"] == 3
    # state versions beyond last planned + 1 (= 4) are not part of the consistent prefix
    assert os.path.exists(os.path.join(sp, "state/0/0/4.changelog"))
    assert not os.path.exists(os.path.join(sp, "state/0/0/5.changelog"))
    assert os.path.exists(os.path.join(sp, "state/0/0/SSTs/a.sst"))
    with pytest.raises(FileExistsError, match="--force"):
        create(ck, sp)
    new = str(tmp_path / "restored")
    restore(sp, new)
    assert sorted(os.listdir(os.path.join(new, "commits"))) == ["0", "1", "2"]
    assert inspect(new)["last_committed"] == 2
    with pytest.raises(FileExistsError, match="not empty"):
        restore(sp, new)
    os.remove(os.path.join(sp, "metadata"))
    with pytest.raises(ValueError, match="damaged: metadata"):
        restore(sp, str(tmp_path / "other"))


def test_savepoint_restore_warns_when_the_source_checkpoint_went_on(tmp_path, capsys) -> None:
    ck = _checkpoint(tmp_path)
    sp = str(tmp_path / "sp")
    create(ck, sp)
    assert "warning" not in restore(sp, str(tmp_path / "latest"))  # the latest savepoint: nothing to say
    for log in ("offsets", "commits"):  # the query runs on past the savepoint
        with open(os.path.join(ck, log, "3"), "w", encoding="utf-8") as fh:
            fh.write('v1\n{}\n{"t":{"0":40}}\n')
    assert cli.main(["savepoint", "restore", sp, str(tmp_path / "older")]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "ends at batch 2" in err and "up to batch 3" in err and "new 'sink.id'" in err


def test_a_savepoint_as_of_an_earlier_batch_replays_the_later_ones(tmp_path, capsys) -> None:
    """Issue 46: batches a database lost in a failover are replayed from a savepoint as of the sink's last
    decision: its commits up to that batch, the next batch's planned offsets (it replays them as planned)."""
    ck = _checkpoint(tmp_path)
    sp = str(tmp_path / "sp")
    assert cli.main(["savepoint", "create", ck, sp, "--batch", "1"]) == 0
    assert "batches 0..1 committed" in capsys.readouterr().out
    assert sorted(os.listdir(os.path.join(sp, "commits"))) == ["0", "1"]
    assert sorted(os.listdir(os.path.join(sp, "offsets"))) == ["0", "1", "2"]
    assert os.path.exists(os.path.join(sp, "state/0/0/3.changelog"))
    assert not os.path.exists(os.path.join(sp, "state/0/0/4.changelog"))
    restored = restore(sp, str(tmp_path / "replay"))
    assert restored["as_of_batch"] == 1 and "warning" not in restored  # on purpose: no "went on" warning
    info = inspect(str(tmp_path / "replay"))
    assert info["last_committed"] == 1 and info["uncommitted"] == [2]
    for batch in (3, 7):  # planned but never committed; not in the checkpoint
        with pytest.raises(ValueError, match=rf"--batch {batch}: .* keeps committed batches 0..2"):
            create(ck, str(tmp_path / f"sp{batch}"), batch=batch)


def test_savepoint_refuses_a_checkpoint_without_commits(tmp_path) -> None:
    (tmp_path / "c" / "commits").mkdir(parents=True)
    with pytest.raises(ValueError, match="no committed batch"):
        create(str(tmp_path / "c"), str(tmp_path / "d"))


# ---------------------------------------------------------------------------------------------
# the supervisor's restart loop, with fake queries, a fake clock and a fake sleep


class _FakeQuery:
    def __init__(self, error: Exception | None) -> None:
        self.error, self.id, self.runId, self.isActive, self.recentProgress = error, "q", "r", False, []

    def awaitTermination(self, timeout: float) -> bool:
        return True

    def exception(self) -> Exception | None:
        return self.error


def _supervise(
    monkeypatch: pytest.MonkeyPatch, strategy: str, errors: list[Exception | None]
) -> tuple[int, list[float]]:
    import io

    from connectors.pipelines import supervisor

    outcomes = iter(errors)
    monkeypatch.setattr(supervisor, "prepare", lambda cfg: None)
    monkeypatch.setattr(supervisor, "session", lambda cfg: type("S", (), {"stop": lambda self: None})())
    monkeypatch.setattr(supervisor, "start", lambda spark, cfg: _FakeQuery(next(outcomes)))
    sleeps: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    cfg = parse_config({**GOOD, "restart": {"strategy": strategy}})
    log = supervisor.Log("json", out=io.StringIO(), live=False)
    return supervisor.run(cfg, log=log, clock=lambda: now[0], sleep=sleep), sleeps


def test_supervisor_restarts_by_strategy_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    rc, sleeps = _supervise(
        monkeypatch, "exponential-backoff:1s:3s:2", [RuntimeError("a"), RuntimeError("b"), RuntimeError("c"), None]
    )
    assert rc == 0 and sleeps == [1.0, 2.0, 3.0]


def test_supervisor_names_the_fault_group_only_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process run must not leave EOS_FAULTS_PGID behind: children started later would aim
    kill-group faults at this process's group (it once SIGKILLed the whole test run)."""
    import os

    from connectors.pipelines import supervisor
    from eos_core import faults

    monkeypatch.delenv(faults.ENV_PGID, raising=False)
    seen: list[str | None] = []
    monkeypatch.setattr(supervisor, "prepare", lambda cfg: seen.append(os.environ.get(faults.ENV_PGID)))
    monkeypatch.setattr(supervisor, "session", lambda cfg: type("S", (), {"stop": lambda self: None})())
    monkeypatch.setattr(supervisor, "start", lambda spark, cfg: _FakeQuery(None))
    cfg = parse_config({**GOOD, "restart": {"strategy": "none"}})
    import io

    assert supervisor.run(cfg, log=supervisor.Log("json", out=io.StringIO(), live=False)) == 0
    assert seen == [str(os.getpgrp())]
    assert faults.ENV_PGID not in os.environ


def test_supervisor_gives_up_when_the_strategy_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, sleeps = _supervise(monkeypatch, "fixed-delay:1:5s", [RuntimeError("boom 1"), RuntimeError("boom 2")])
    assert rc == 2 and sleeps == [5.0]
    assert "boom 2" in capsys.readouterr().err


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    import connectors

    assert connectors.__version__ == metadata.version("spark-eos")
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"spark-eos {metadata.version('spark-eos')}"


def test_chaos_app_errors_name_the_option_and_the_fix(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from connectors.toolkit import app_runner, chaos
    from eos_core import faults

    monkeypatch.delenv(faults.ENV_PGID, raising=False)
    assert (
        chaos.main(["--app", "x:build", "--pipeline", "2pc", "--bootstrap", "b:1", "--dsn", "postgresql://h/d"]) == 64
    )
    assert "chaos: config error: --app and --pipeline: pick one" in capsys.readouterr().err
    assert (
        chaos.main(["--app", "x:build", "--option", "novalue", "--bootstrap", "b:1", "--dsn", "postgresql://h/d"]) == 64
    )
    assert "chaos: config error: --option 'novalue': expected key=value" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="expected key=value"):
        app_runner.main(
            [
                "--app",
                "x:build",
                "--bootstrap",
                "b:1",
                "--topic",
                "t",
                "--dsn",
                "postgresql://h/d",
                "--table",
                "t",
                "--checkpoint",
                "/nonexistent",
                "--option",
                "novalue",
            ]
        )
    # a refused job must not leave pytest's group named for kill-group faults (CI died of that: exit 137)
    assert faults.ENV_PGID not in os.environ
    with pytest.raises(SystemExit, match="expected module:function"):
        app_runner.load_app("just_a_module")
    with pytest.raises(SystemExit, match=r"cannot import 'no_such_job_module'.*PYTHONPATH"):
        app_runner.load_app("no_such_job_module:build")
    (tmp_path / "myjob.py").write_text("def setup(job):\n    pass\n\nbuild = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match="has no function 'build'"):
        app_runner.load_app("myjob:build")
    (tmp_path / "myjob2.py").write_text("def setup(job):\n    pass\n\ndef build(spark, job):\n    return None\n")
    build, setup = app_runner.load_app("myjob2:build")
    assert callable(build) and callable(setup)
    job = app_runner.Job("b:1", "t", "postgresql://h/d", "s.orders")
    assert job.sink_id == "s_orders"


def test_chaos_app_runs_the_users_module_with_the_runs_topic_table_and_checkpoint() -> None:
    from connectors.toolkit import chaos

    cfg = chaos.ChaosConfig(
        pipeline="app",
        kills=1,
        seed=1,
        records=10,
        bootstrap="b:1",
        dsn="postgresql://h/d",
        workdir="/tmp/w",
        app="orders_job:build",
        options={"region": "eu"},
    )
    state = chaos.RunState(bootstrap="b:1", topic="topic1", table="table1", records=10)
    argv = chaos.runs.runner_argv(cfg, state, "table1", "/tmp/w/checkpoint", "available-now")
    assert argv[1:3] == ["-m", "connectors.toolkit.app_runner"]
    for flag, value in [
        ("--app", "orders_job:build"),
        ("--topic", "topic1"),
        ("--table", "table1"),
        ("--checkpoint", "/tmp/w/checkpoint"),
        ("--option", "region=eu"),
    ]:
        assert argv[argv.index(flag) + 1] == value
    assert cfg.points == "2pc"
    assert {p.point for p in chaos.plan_kills("other", 40, 1) if p.point} == {"source.read.mid"}


def test_pipelines_without_their_extra_name_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from connectors import pipelines

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(ConfigError, match=r"need grpcio.*pip install 'spark-eos\[pipelines\]'"):
        pipelines.require_extras()
    with pytest.raises(ConfigError, match="spark-eos\\[pipelines\\]"):
        cli._demo_cmd(cli.build_parser().parse_args(["demo"]))


# ---------------------------------------------------------------------------------------------
# the demo's kill schedule


def test_demo_deals_kills_round_robin_one_kill_and_one_fault_point_per_pipeline() -> None:
    from connectors import demo

    schedule = demo.plan(6, seed=7)
    assert {name: [k.kind for k in kills] for name, kills in schedule.items()} == {
        "ledger": ["kill", "fault-point"],
        "transfers": ["fault-point", "kill"],
        "balances": ["kill", "fault-point"],
    }
    assert sum(len(k) for k in demo.plan(4, seed=7).values()) == 4
    assert [k.kind for k in demo.plan(3, seed=1)["transfers"]] == [
        "fault-point"
    ]  # a small run still kills the Kafka sink
    # only fault points that fire for the Kafka sink's default visibility=batch; 100+ record batches for publish.mid
    assert "sink.task.after_commit" not in demo.fault_points("transfers")
    points = {k.point for seed in range(60) for k in demo.plan(3, seed=seed, records=400)["transfers"]}
    assert points == set(demo.fault_points("transfers")) - {"sink.publish.mid"}
    points = {k.point for seed in range(60) for k in demo.plan(6, seed=seed, records=6000)["transfers"] if k.point}
    assert points == set(demo.fault_points("transfers"))
    kill = demo.Kill("transfers", "fault-point", point="sink.publish.mid", skip=1)
    assert kill.spec(4) == "sink.publish.mid:batch=6:action=kill-group:once"


def test_each_pipeline_declares_the_acls_of_its_principal() -> None:
    """spark-eos run's pipelines grant from one declaration: the source's ACLs on source.topic, and for
    transfers the kafka-eos sink's on the output and dead-letter topics (each row names one of them), plus
    CREATE on both and DESCRIBE_CONFIGS on the source topic for prepare()."""
    from connectors.pipelines.privileges import pipeline_acls
    from sinks.kafka.privileges import ROW_TOPICS

    ledger = {(a.resource, a.name, a.operation) for a in pipeline_acls(parse_config(GOOD))}
    assert ("topic", "t", "READ") in ledger and all(name == "t" for _, name, _ in ledger), ledger
    acls = pipeline_acls(parse_config(TRANSFERS))
    held = {(a.resource, a.name, a.operation, a.prefixed) for a in acls}
    assert len(held) == len(acls)  # each once
    for topic in ("transfers", "transfers-dead-letters"):
        for op in ("WRITE", "DESCRIBE_CONFIGS", "CREATE"):
            assert ("topic", topic, op, False) in held, (topic, op)
    assert ("topic", "transfers", "READ", False) in held  # the marker topic
    assert ("topic", "payments", "READ", False) in held and ("topic", "payments", "DESCRIBE_CONFIGS", False) in held
    assert ("transactional_id", "spark-eos:transfers:", "WRITE", True) in held
    assert not any(ROW_TOPICS in a.name for a in acls)
    sized = pipeline_acls(parse_config({**TRANSFERS, "transfers": {"partitions": 3, "malformed": "fail"}}))
    assert ("topic", "payments", "DESCRIBE_CONFIGS") not in {(a.resource, a.name, a.operation) for a in sized}
    assert "transfers-dead-letters" not in {a.name for a in sized}
