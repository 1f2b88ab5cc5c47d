"""Pure logic of connectors.services: provider choice, DSN redaction, timeouts, state, process helpers."""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from connectors.services import _proc, choose, manage
from connectors.services.base import PostgresService, redact_dsn
from connectors.services.env import env_timeout
from eos_core.errors import ServiceError


# ---- provider choice ------------------------------------------------------------------------------
def never() -> bool:
    return False


def always() -> bool:
    return True


@pytest.mark.parametrize(
    ("environ", "probe", "kafka", "postgres"),
    [
        ({}, never, "embedded", "embedded"),
        ({}, always, "container", "container"),
        ({"EOS_KAFKA_BOOTSTRAP": "h:9092"}, always, "env", "container"),
        ({"EOS_POSTGRES_DSN": "postgresql://u@h/db"}, never, "embedded", "env"),
        ({"EOS_KAFKA_BOOTSTRAP": "h:9092", "EOS_POSTGRES_DSN": "dbname=x"}, always, "env", "env"),
        ({"EOS_KAFKA_BOOTSTRAP": "  "}, never, "embedded", "embedded"),  # blank counts as unset
        ({"EOS_SERVICES": "embedded", "EOS_KAFKA_BOOTSTRAP": "h:9092"}, always, "embedded", "embedded"),
        ({"EOS_SERVICES": "Container"}, always, "container", "container"),
        ({"EOS_SERVICES": "auto", "EOS_POSTGRES_DSN": "dbname=x"}, always, "container", "env"),
        ({"EOS_SERVICES": "env", "EOS_KAFKA_BOOTSTRAP": "h:1", "EOS_POSTGRES_DSN": "dbname=x"}, always, "env", "env"),
    ],
)
def test_choice_order(environ: dict[str, str], probe: Any, kafka: str, postgres: str) -> None:
    assert choose("kafka", environ, probe) == kafka
    assert choose("postgres", environ, probe) == postgres


def test_choice_errors_name_the_variable() -> None:
    with pytest.raises(ServiceError, match=r"EOS_SERVICES='docker' is not one of auto, env, container, embedded"):
        choose("kafka", {"EOS_SERVICES": "docker"}, never)
    with pytest.raises(ServiceError, match="EOS_SERVICES=env but EOS_POSTGRES_DSN is not set"):
        choose("postgres", {"EOS_SERVICES": "env", "EOS_KAFKA_BOOTSTRAP": "h:1"}, never)
    with pytest.raises(ServiceError, match="EOS_SERVICES=container but no Docker engine answers"):
        choose("kafka", {"EOS_SERVICES": "container"}, never)


def test_probe_not_called_when_env_names_the_service() -> None:
    def boom() -> bool:
        raise AssertionError("the Docker probe must not run")

    assert choose("kafka", {"EOS_KAFKA_BOOTSTRAP": "h:1"}, boom) == "env"
    assert choose("kafka", {"EOS_SERVICES": "embedded"}, boom) == "embedded"


def test_containers_need_testcontainers(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def without(name: str, *args: Any) -> Any:
        return None if name == "testcontainers" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without)
    assert choose("kafka", {}) == "embedded"  # the Docker probe is not even asked
    with pytest.raises(ServiceError, match=r"containers are not usable here.*testcontainers"):
        choose("kafka", {"EOS_SERVICES": "container"})


# ---- DSN redaction ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://eos:s3cr%40t@127.0.0.1:5432/postgres", "postgresql://eos:***@127.0.0.1:5432/postgres"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("postgresql://h:5/db?sslmode=require&password=pw", "postgresql://h:5/db?sslmode=require&password=***"),
        ("postgresql://a:b@h1:5,h2:6/db", "postgresql://a:***@h1:5,h2:6/db"),
        ("host=h port=5 user=u password=pw dbname=d", "host=h port=5 user=u password=*** dbname=d"),
        ("host=h dbname=d", "host=h dbname=d"),
        ("password='it is' host=h", "password=*** host=h"),
        ("password='unterminated host=h", "<unparsable DSN>"),
    ],
)
def test_redact_dsn(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown


def test_dsn_redacted_property_and_foreign_service_refuses_crash() -> None:
    svc = PostgresService()
    svc.dsn, svc.kind, svc.port = "postgresql://u:pw@h:1/d", "env", 1
    assert svc.dsn_redacted == "postgresql://u:***@h:1/d"
    assert "pw" not in repr(svc)
    for action in (svc.crash, svc.start, svc.restart):
        with pytest.raises(ServiceError, match=r"it is 'env', not run by spark-eos.*EOS_POSTGRES_DSN"):
            action()


def test_service_error_pickles() -> None:
    err = ServiceError("port in use", port=5)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ServiceError and str(back) == "port in use" and back.port == 5


# ---- timeouts and state -------------------------------------------------------------------------
def test_env_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EOS_SERVICE_TIMEOUT", raising=False)
    assert env_timeout() == 15.0
    monkeypatch.setenv("EOS_SERVICE_TIMEOUT", "2.5")
    assert env_timeout() == 2.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("EOS_SERVICE_TIMEOUT", bad)
        with pytest.raises(ServiceError, match=f"EOS_SERVICE_TIMEOUT='{bad}'"):
            env_timeout()


def test_state_path_and_corrupt_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EOS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert manage.state_path() == tmp_path / "xdg" / "spark-eos" / "services.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert manage.state_path() == tmp_path / "home" / ".local" / "state" / "spark-eos" / "services.json"
    monkeypatch.setenv("EOS_STATE_DIR", str(tmp_path))
    assert manage.state_path() == tmp_path / "services.json"
    assert manage.state_path("x") == Path("x/services.json")
    assert manage.load_state(tmp_path / "services.json") == {}
    (tmp_path / "services.json").write_text("{not json")
    with pytest.raises(ServiceError, match=r"cannot read the services state file.*delete it"):
        manage.load_state(tmp_path / "services.json")


def test_state_is_found_from_any_directory_and_env_exports_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32 item 7: ``up`` in one directory, ``status``/``env`` in another find the same state."""
    monkeypatch.delenv("EOS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    state = {
        "kafka": {"bootstrap": "127.0.0.1:1", "pid": 0},
        "postgres": {"dsn": "postgresql://u:pw@127.0.0.1:2/d", "pid": 0},
    }
    manage._save_state(manage.state_path(), state)
    monkeypatch.chdir(tmp_path / "b")
    assert manage.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "export EOS_KAFKA_BOOTSTRAP=127.0.0.1:1" in out
    assert f"export EOS_STATE_DIR={tmp_path / 'xdg' / 'spark-eos'}" in out
    assert manage.main(["status"]) == 3  # recorded but not running: DOWN, not "no services recorded"
    out = capsys.readouterr().out
    assert "kafka     DOWN" in out and "no services recorded" not in out


def test_a_state_file_of_an_older_version_here_is_pointed_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EOS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    manage._save_state(Path(".eos") / "services.json", {"kafka": {"bootstrap": "127.0.0.1:1", "pid": 0}})
    assert manage.main(["status"]) == 3
    assert "older spark-eos: pass --state-dir .eos" in capsys.readouterr().out
    assert manage.main(["status", "--state-dir", ".eos"]) == 3
    assert "kafka     DOWN" in capsys.readouterr().out


def test_cli_without_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert manage.main(["status", "--state-dir", str(tmp_path)]) == 3
    assert manage.main(["down", "--state-dir", str(tmp_path)]) == 0
    assert manage.main(["env", "--state-dir", str(tmp_path)]) == 3
    out = capsys.readouterr()
    assert "spark-eos services up" in out.out and "nothing to stop" in out.out


def test_add_subparser_wires_every_command() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    manage.add_subparser(parser.add_subparsers(dest="command"))
    for cmd in ("up", "down", "status", "env"):
        args = parser.parse_args(["services", cmd])
        assert callable(args.func) and args.services_command == cmd
    args = parser.parse_args(["services", "up", "--no-kafka", "--postgres-port", "6000"])
    assert args.no_kafka and args.postgres_port == 6000


# ---- process helpers ----------------------------------------------------------------------------
def test_ports() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert _proc.port_in_use(s.getsockname()[1])
    assert not _proc.port_in_use(_proc.free_port())


def test_process_table_helpers_and_stop_group() -> None:
    # a group leader with a child that made its own session, like a Postgres backend
    proc = _proc.spawn(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "print('ok', flush=True); time.sleep(60)",
        ],
        log=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
    tree = _proc.process_tree(proc.pid)
    assert proc.pid in tree and len(tree) == 2 and _proc.group_pids(proc.pid) == [proc.pid]
    _proc.stop_group(proc, proc.pid, grace=1.0)  # the stray child ignores the group signal: SIGKILL after 1s
    assert proc.returncode is not None  # reaped, not a zombie
    assert not [p for p in tree if _proc.pid_alive(p)]
    proc.stdout.close()


def test_unknown_run_as_user() -> None:
    with pytest.raises(ServiceError, match=r"user 'no-such-eos-user' does not exist.*EOS_PG_USER"):
        _proc.RunAs.named("no-such-eos-user")


# ---- docker/compose.yaml stays in step with connectors/services/images.py -----------------------
def test_compose_uses_the_pinned_images() -> None:
    import yaml

    from connectors.services import images

    compose = yaml.safe_load((Path(__file__).resolve().parent.parent / "docker" / "compose.yaml").read_text())
    kafka, pg = compose["services"]["kafka"], compose["services"]["postgres"]
    assert kafka["image"] == images.KAFKA_IMAGE
    assert pg["image"] == images.POSTGRES_IMAGE
    assert f"max_prepared_transactions={images.POSTGRES_MAX_PREPARED_TRANSACTIONS}" in pg["command"]
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert all(port.startswith("127.0.0.1:") for svc in (kafka, pg) for port in svc["ports"])
    for tag in (images.KAFKA_IMAGE, images.POSTGRES_IMAGE):
        assert ":" in tag and not tag.endswith(":latest"), "images are pinned"


# ---- the wheel starts no Docker daemon: only the repo's suite plugs one in ----------------------
def test_a_private_engine_needs_the_repos_machinery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from connectors.services import docker as engines

    monkeypatch.setattr(engines, "_engine", None)
    monkeypatch.setattr(engines, "_engine_checked", False)
    monkeypatch.setattr(engines, "_private", None)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")  # no engine answers there
    monkeypatch.setenv("EOS_START_DOCKERD", "1")
    monkeypatch.delenv("EOS_DOCKER", raising=False)
    with pytest.raises(ServiceError, match=r"EOS_START_DOCKERD=1.*starts none itself.*set DOCKER_HOST"):
        engines.get_engine()
    with pytest.raises(ServiceError, match=r"no local 'kafka' image.*EOS_DOCKER_IMAGES=upstream"):
        engines.local_image(engines.Engine(host="unix:///x"), "kafka")

    started: list[str] = []

    def start() -> engines.Engine:
        started.append("dockerd")
        return engines.Engine(host=f"unix://{tmp_path}/private.sock", owned=True)

    monkeypatch.setattr(engines, "_engine_checked", False)
    engines.use_private_engine(start, lambda engine, name: f"spark-eos/{name}:local")
    engine = engines.get_engine()
    assert engine is not None and engine.owned and started == ["dockerd"]
    assert engines.local_image(engine, "postgres") == "spark-eos/postgres:local"
    assert engines.get_engine() is engine and started == ["dockerd"]  # once per process
    monkeypatch.setattr(engine, "stop", lambda: None)
    engines.shutdown()


def test_a_lock_held_elsewhere_is_waited_for_a_bounded_time_and_named(tmp_path: Path) -> None:
    """_proc.locked: the Kafka jars' fetch, Spark's class archive and PySpark's bytecode take one lock each;
    a holder that never lets go ends the wait with an error naming what it does and the lock file."""
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ServiceError, match=r"another process has been building things for 1s \(lock .*x\.lock\)"):
            with _proc.locked(lock, 1.0, "building things"):
                pytest.fail("the lock was held elsewhere")
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()  # type: ignore[union-attr]
    with _proc.locked(lock, 1.0, "building things"):  # let go: taken at once
        pass
