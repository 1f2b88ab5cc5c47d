"""Container hygiene: traffic stays on 127.0.0.1, and nothing of ours (dockerd, container, mount) outlives a run."""

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

from connectors.services import docker as engines
from connectors.services.containers import ContainerKafka, ContainerPostgres

pytestmark = [pytest.mark.docker, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


def _listeners(port: int) -> list[str]:
    """Local addresses of the TCP sockets listening on ``port`` in this network namespace."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.rsplit(":", 1)
                if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                    found.append(addr)
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


CHILD_TEST = '''
"""Run by test_docker_hygiene in a pytest of its own: an engine, one container left running."""
import json, os, time
from connectors.services.containers import ContainerKafka
from integration.fixtures.docker import docker_engine

def test_child(docker_engine):
    box = ContainerKafka(docker_engine)  # not stopped here: the session's end must remove it
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
        EOS_DOCKER_CACHE=str(tmp_path / "cache"),  # its own data root (only the small kafka image is built)
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
