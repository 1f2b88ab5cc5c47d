"""Container hygiene: the Kafka image is the embedded broker, traffic stays on 127.0.0.1, and nothing
of ours (dockerd, container, mount) outlives a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from connectors.services import apache_kafka as ak
from connectors.services import docker as engines
from connectors.services import images
from connectors.services.containers import LOCAL_KAFKA_VOLUME, ContainerKafka, ContainerPostgres

pytestmark = [pytest.mark.docker, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


V4_MAPPED = "0000000000000000FFFF0000"  # ::ffff:a.b.c.d in /proc/net/tcp6


def _listeners(port: int) -> list[str]:
    """Local addresses of the TCP sockets listening on ``port`` in this network namespace, an IPv6
    socket bound to an IPv4-mapped address (a JVM's socket bound to 127.0.0.1) as that IPv4 address."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.rsplit(":", 1)
                if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                    found.append(addr.removeprefix(V4_MAPPED))
    return found


def test_traffic_stays_on_loopback(
    docker_engine: engines.Engine, kafka_box: ContainerKafka, pg_box: ContainerPostgres
) -> None:
    """Both containers run in the host network namespace (no bridge, no container IP); every
    address they hand out, advertise or listen on is 127.0.0.1; a dockerd we started has no
    bridge network and made no docker0 interface."""
    for box in (kafka_box, pg_box):
        info = box.inspect()
        assert info["HostConfig"]["NetworkMode"] == "host", info["HostConfig"]["NetworkMode"]
        nets = info["NetworkSettings"]["Networks"]
        assert set(nets) == {"host"}, nets
        assert all(not n.get("IPAddress") and not n.get("Gateway") for n in nets.values()), nets
        assert box.addresses() and all(a.startswith("127.0.0.1:") for a in box.addresses()), box.addresses()
        assert _listeners(box.port) == [LOOPBACK_HEX], (
            f"{box.name} listens on {_listeners(box.port)}, not only 127.0.0.1"
        )
    assert _listeners(kafka_box.controller_port) == [LOOPBACK_HEX], "the KRaft controller listens beyond 127.0.0.1"

    assert kafka_box.bootstrap == f"127.0.0.1:{kafka_box.port}"
    brokers = AdminClient({"bootstrap.servers": kafka_box.bootstrap}).list_topics(timeout=10).brokers
    assert {b.host for b in brokers.values()} == {"127.0.0.1"}, "the broker advertises a non-loopback address"

    assert urlsplit(pg_box.dsn).hostname == "127.0.0.1"
    with psycopg.connect(pg_box.dsn, autocommit=True) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert str(conn.execute("SELECT inet_server_addr()").fetchone()[0]) == "127.0.0.1"  # type: ignore[index]

    drivers = {n["Name"]: n["Driver"] for n in docker_engine.client().api.networks()}
    if docker_engine.owned:
        assert "bridge" not in drivers.values(), f"our dockerd created a bridge network: {drivers}"
        assert not os.path.exists("/sys/class/net/docker0"), "a docker0 bridge interface exists"
        assert docker_engine.host.startswith("unix://"), docker_engine.host  # the API is a local socket too
        cmdline = Path(f"/proc/{docker_engine.pid}/cmdline").read_bytes().decode().split("\0")
        for flag in ("--bridge=none", "--iptables=false", "--ip-masq=false"):
            assert flag in cmdline, f"dockerd runs without {flag}: {cmdline}"


def _properties(text: str) -> dict[str, str]:
    """key=value lines of a .properties file as render_properties writes them (no escapes in these values)."""
    pairs = (line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {k: v for k, v in pairs}


def test_kafka_image_runs_the_embedded_broker(docker_engine: engines.Engine, kafka_box: ContainerKafka) -> None:
    """The container's broker is the Apache Kafka version the embedded broker runs (its own startup
    log says so); the upstream image is pinned to that version. On the private engine's local image
    it is moreover the embedded broker itself: the same jars as the embedded jar cache, the
    server.properties apache_kafka.broker_properties renders for the container's ports (with the log
    segments on the container's volume), and the embedded broker's JVM flags."""
    version = ak.kafka_version()
    assert images.KAFKA_IMAGE == f"apache/kafka:{ak.KAFKA_VERSION}", "pin the upstream image to the embedded version"
    logs = kafka_box.container.logs().decode(errors="replace")
    assert f"Kafka version: {version}" in logs, f"the broker does not log Kafka {version}: {logs[-2000:]}"
    assert kafka_box.version == version and not kafka_box.is_tansu
    if kafka_box.mode == "upstream":
        return  # apache/kafka: its own jars and configuration; only the version is ours to check

    label = kafka_box.container.image.labels.get("org.apache.kafka.version")
    assert label == version, f"image label org.apache.kafka.version={label}"
    jars, _ = ak.kafka_jars()
    out = kafka_box.container.exec_run(["ls", "/opt/eos-kafka/libs"]).output.decode().split()
    assert sorted(out) == sorted(p.name for p in jars.glob("*.jar")), "the image's jars are not the embedded ones"

    assert kafka_box.volume is not None
    written = _properties((Path(kafka_box.volume) / "server.properties").read_text())
    data = Path(LOCAL_KAFKA_VOLUME) / "data"
    assert written == ak.broker_properties(
        port=kafka_box.port, controller_port=kafka_box.controller_port, data_dir=data
    )
    assert kafka_box.data_dir is not None and (kafka_box.data_dir / "meta.properties").is_file(), (
        "no data on the volume"
    )

    args = kafka_box.container.exec_run(["cat", "/opt/eos-kafka/config/jvm.args"]).output.decode().split("\n")
    config = Path("/opt/eos-kafka/config/log4j2.properties")
    assert args[: args.index("-cp")] == ak.jvm_options(log4j_config=config, base=Path(LOCAL_KAFKA_VOLUME))
    pid = kafka_box.inspect()["State"]["Pid"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert cmdline[1:] == [
        "@/opt/eos-kafka/config/jvm.args",
        "kafka.Kafka",
        f"{LOCAL_KAFKA_VOLUME}/server.properties",
        "",
    ], f"PID 1 of the container is not the broker JVM: {cmdline}"


CHILD_TEST = '''
"""Run by test_docker_hygiene in a pytest of its own: an engine, one container left running."""
import json, os, time
from connectors.services.containers import ContainerKafka
from integration.fixtures.docker import docker_engine

def test_child(docker_engine):
    # tansu: a broker image built in seconds on the child's empty engine (Apache Kafka's needs minutes)
    box = ContainerKafka(docker_engine, broker="tansu")  # not stopped here: the session's end must remove it
    with open(os.environ["EOS_CHILD_REPORT"], "w") as f:
        json.dump({"pid": docker_engine.pid, "run_dir": str(docker_engine.run_dir),
                   "data_root": str(docker_engine.data_root), "container": box.name, "port": box.port}, f)
    go = os.environ["EOS_CHILD_GO"]  # the parent looks at the running engine, then lets it finish
    deadline = time.monotonic() + 600
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.1)  # the parent SIGKILLs this pytest here in the killed-session test
'''


def _ours(report: dict[str, object]) -> dict[str, list[str]]:
    """Processes and mounts that belong to the child's engine (its run dir or data root)."""
    keys = [str(report["run_dir"]), str(report["data_root"])]
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(k in cmd for k in keys) or f"127.0.0.1:{report['port']}" in cmd:
            procs.append(f"{pid} {cmd[:200]}")
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f if any(k in line for k in keys)]
    return {"processes": procs, "mounts": mounts, "listeners": _listeners(int(str(report["port"])))}


def _run_child(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    test_file = tmp_path / "test_child_engine.py"
    test_file.write_text(textwrap.dedent(CHILD_TEST))
    report_path = tmp_path / "child.json"
    env = dict(os.environ)
    env.update(
        EOS_START_DOCKERD="1",
        DOCKER_HOST="unix:///nonexistent/docker.sock",  # never the parent's engine: the child starts its own
        EOS_DOCKER_CACHE=str(tmp_path / "cache"),  # its own data root (only the small tansu image is built)
        EOS_DOCKER_IMAGES="local",
        EOS_CHILD_REPORT=str(report_path),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env["EOS_CHILD_GO"] = str(tmp_path / "go")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test_file)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not report_path.exists() or not report_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.communicate(timeout=30)[0] if proc.poll() is not None else b"(still running)"
            proc.kill()
            raise AssertionError(
                f"the child session did not start its container: {out.decode(errors='replace')[-3000:]}"
            )
        time.sleep(0.2)
    time.sleep(0.2)  # the report is written in one go; let json.dump finish
    return proc, json.loads(report_path.read_text())


def _wait_clean(report: dict[str, object], timeout: float = 60) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    left = _ours(report)
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _ours(report)
    return left


def test_no_daemon_container_or_mount_left_after_a_session(tmp_path: Path) -> None:
    """A pytest session of its own starts a dockerd (private socket, data root and exec root) and
    a broker container that the test itself never stops. After the session: that dockerd, its
    containerd, the container's processes, its listening socket and every mount under the
    engine's roots are gone, and the run directory is removed."""
    proc, report = _run_child(tmp_path)
    assert report["pid"] and Path(f"/proc/{report['pid']}").exists(), "the child's dockerd was not running"
    assert _listeners(int(str(report["port"]))) == [LOOPBACK_HEX], "the child's broker was not listening"
    (tmp_path / "go").touch()
    out = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    left = _wait_clean(report, timeout=5)
    assert not any(left.values()), f"left after the session: {left}"
    assert not Path(str(report["run_dir"])).exists(), "the engine's run directory was not removed"


def test_no_daemon_or_container_left_when_the_session_is_killed(tmp_path: Path) -> None:
    """The same, but the child pytest is SIGKILLed mid-test (no teardown, no atexit): dockerd gets
    SIGTERM from the kernel (parent-death signal), stops the container and exits with its
    containerd; no process, listener or mount of that engine remains."""
    proc, report = _run_child(tmp_path)
    assert Path(f"/proc/{report['pid']}").exists(), "the child's dockerd was not running"
    assert _listeners(int(str(report["port"]))) == [LOOPBACK_HEX], "the child's broker was not listening"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)  # reaps it and closes its output pipe
    assert proc.returncode == -signal.SIGKILL
    left = _wait_clean(report, timeout=60)
    assert not any(left.values()), f"left after the killed session: {left}"
    assert not Path(str(report["run_dir"])).exists(), "the engine's run directory was not removed"
