"""Spark Connect (issue 50), without a server: what differs from a classic session in the connectors' own code.
The server, the queries over it and their kills are integration/test_spark_connect.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.services.spark_connect import SERVER_CLASS, ConnectServer
from eos_core.errors import ConfigError
from sinks.postgres import adapters
from sources.kafka.alias import install_kafka_alias


def _frame(module: str, partitions: int) -> Any:
    class Rdd:
        def getNumPartitions(self) -> int:
            return partitions

    class Frame:
        @property
        def rdd(self) -> Rdd:
            if module.startswith("pyspark.sql.connect"):
                raise AssertionError("a Connect DataFrame has no RDD API: twopc_batch must not ask it")
            return Rdd()

    Frame.__module__ = module
    return Frame()


def test_twopc_batch_counts_partitions_on_a_classic_session_only() -> None:
    assert adapters._partitions(_frame("pyspark.sql.classic.dataframe", 7)) == 7
    assert adapters._partitions(_frame("pyspark.sql.connect.dataframe", 7)) is None


def test_connect_server_runs_pysparks_own_server_on_loopback(tmp_path: Path) -> None:
    server = ConnectServer(tmp_path, conf={"spark.sql.shuffle.partitions": "3"})
    argv = server.argv()
    assert argv[0].endswith("/bin/spark-submit") and argv[-1] == "spark-internal"
    assert argv[argv.index("--class") + 1] == SERVER_CLASS
    confs = {argv[i + 1] for i, a in enumerate(argv) if a == "--conf"}
    assert "spark.connect.grpc.binding.address=127.0.0.1" in confs
    assert f"spark.connect.grpc.binding.port={server.port}" in confs
    assert "spark.sql.shuffle.partitions=3" in confs and "spark.ui.enabled=false" in confs
    assert server.remote == f"sc://127.0.0.1:{server.port}" and not server.running()


def test_the_kafka_alias_is_refused_on_a_connect_session_naming_the_format_to_write() -> None:
    class ConnectSession:
        pass

    ConnectSession.__module__ = "pyspark.sql.connect.session"
    with pytest.raises(ConfigError) as err:
        install_kafka_alias(ConnectSession())
    assert err.value.option == "kafka_alias" and ".format('kafka-eos')" in str(err.value)


class _NoServices:
    def kafka(self) -> None:
        pytest.fail("a broker was asked for")

    def postgres(self) -> None:
        pytest.fail("a Postgres was asked for")


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"pipeline": "2pc"}, "--connect needs --app"),
        ({"app": "j:build", "faults": "kill:1,executor-loss:1"}, "--faults executor-loss: not with --connect"),
        ({"app": "j:build", "faults": "slow-task:1"}, "--faults slow-task: not with --connect"),
    ],
)
def test_chaos_connect_refuses_what_it_cannot_run_naming_the_flag(given: dict[str, Any], needle: str) -> None:
    from connectors.toolkit import chaos

    base = {"bootstrap": "127.0.0.1:9092", "dsn": "postgresql://u@127.0.0.1:5/db", "workdir": "/nonexistent"}
    with pytest.raises(ConfigError) as err:
        chaos.prepare(_NoServices(), connect=True, **base, **given)  # refused before any service is asked for
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_chaos_connect_runs_the_app_runner_as_a_connect_client() -> None:
    from connectors.toolkit.chaos import inputs
    from connectors.toolkit.chaos.runs import runner_argv

    base = {"bootstrap": "127.0.0.1:9092", "dsn": "postgresql://u@127.0.0.1:5/db", "workdir": "/nonexistent"}
    cfg = inputs.prepare(_NoServices(), app="j:build", connect=True, **base)
    assert cfg.connect

    class State:
        topic, bootstrap, topics = "t", "127.0.0.1:9092", {}

    argv = runner_argv(cfg, State(), "tbl", "/ck", "available-now")  # type: ignore[arg-type]
    assert "connectors.toolkit.app_runner" in argv and "--connect" in argv
    plain = inputs.prepare(_NoServices(), app="j:build", **base)
    assert "--connect" not in runner_argv(plain, State(), "tbl", "/ck", "available-now")  # type: ignore[arg-type]
