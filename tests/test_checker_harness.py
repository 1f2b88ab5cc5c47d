"""Harness pieces without services: process-group kills, checkpoint tampering, the proxy, kill plans."""

import contextlib
import os
import signal
import socket
import sys
import threading
import time

import pytest

from connectors.toolkit import chaos, harness
from connectors.toolkit.chaos.proxy import TcpProxy

CHILD = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def test_kill_group_takes_children_too(tmp_path):
    log = str(tmp_path / "log")
    proc = harness.PipelineProcess([sys.executable, "-c", CHILD], log_path=log).start()
    harness.wait_until(lambda: "ready" in proc.log_tail(), timeout=20, what="child ready")
    kids = harness.descendants(proc.pid)
    assert kids, "the grandchild should exist"
    assert os.getpgid(kids[0]) == proc.pid  # own session: the whole tree shares the group
    proc.kill_group()
    out = proc.wait(10)
    assert out.killed and out.signal == signal.SIGKILL
    assert "SIGKILL" in str(out)
    harness.wait_until(
        lambda: not any(os.path.exists(f"/proc/{k}") and harness.process_state(k) != "Z" for k in kids),
        timeout=10,
        what="grandchild gone",
    )


STRAY = """
import os, subprocess, sys, time
env = dict(os.environ, EOS_FAULTS_PGID=str(os.getpgrp()))  # as app_runner names the job's group
# a grandchild in a group of its own, as PySpark's worker daemon is
subprocess.Popen([sys.executable, "-c", "import os, time; os.setpgid(0, 0); time.sleep(60)"], env=env)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_run_takes_its_processes_outside_the_group_too(tmp_path):
    proc = harness.PipelineProcess([sys.executable, "-c", STRAY], log_path=str(tmp_path / "log")).start()
    harness.wait_until(
        lambda: "ready" in proc.log_tail() and harness.marked_processes(proc.pid), timeout=20, what="the stray ready"
    )
    stray = harness.marked_processes(proc.pid)
    harness.wait_until(lambda: os.getpgid(stray[0]) == stray[0], timeout=10, what="the stray in its own group")
    proc.kill_group()
    assert proc.wait(10).killed
    assert harness.marked_processes(proc.pid) == []
    assert not os.path.exists(f"/proc/{stray[0]}") or harness.process_state(stray[0]) == "Z"


SCRATCH = """
import os, re, time
tmp = re.findall(r"-Djava.io.tmpdir=(\\S+)", os.environ["JDK_JAVA_OPTIONS"])[-1]
os.makedirs(os.path.join(tmp, "blockmgr-1"))  # what a JVM leaves there when it is SIGKILLed
open(os.path.join(tmp, "liblz4-java.so"), "w").close()
print("scratch", tmp, flush=True)
time.sleep(60)
"""


def test_a_killed_runs_jvm_scratch_files_go_with_it(tmp_path, monkeypatch):
    """Each run's JVMs get a java.io.tmpdir of the run's own (the last -D wins over the caller's), removed
    once the run has ended; one of a harness that was itself SIGKILLed is swept by the next run."""
    import tempfile

    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:+UseSerialGC -Djava.io.tmpdir=/somewhere")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan = tmp_path / f"{harness.SCRATCH_PREFIX}orphan"  # its owner is gone
    orphan.mkdir()
    from connectors.services import _proc

    (orphan / _proc.OWNER_FILE).write_text("999999999")
    proc = harness.PipelineProcess([sys.executable, "-c", SCRATCH], log_path=str(tmp_path / "log")).start()
    harness.wait_until(lambda: "scratch" in proc.log_tail(), timeout=20, what="the child's scratch")
    scratch = proc.log_tail().split("scratch ", 1)[1].split()[0]
    assert scratch == proc.scratch and os.path.isdir(os.path.join(scratch, "blockmgr-1"))
    assert os.path.dirname(scratch) == str(tmp_path) and not orphan.exists()
    proc.kill_group()
    assert proc.wait(10).killed
    assert not os.path.exists(scratch) and proc.scratch is None


def test_exit_code_reported(tmp_path):
    out = harness.PipelineProcess(
        [sys.executable, "-c", "import sys; print('bye'); sys.exit(17)"], log_path=str(tmp_path / "l")
    ).run(30)
    assert out.returncode == 17 and not out.killed
    assert "bye" in out.log_tail
    assert harness.describe_exit(17) == "exit code 17"


def test_run_timeout_kills_and_raises(tmp_path):
    proc = harness.PipelineProcess([sys.executable, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "l"))
    with pytest.raises(TimeoutError, match="did not finish"):
        proc.run(0.5)
    assert not proc.alive()


def test_truncate_and_corrupt(tmp_path):
    d = tmp_path / "offsets"
    d.mkdir()
    for n in (0, 1, 2):
        (d / str(n)).write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":' + str(n * 100) + "}}")
    (d / ".2.crc").write_bytes(b"crc")
    last = harness.latest_file(str(d))
    assert last.endswith("2")
    size = os.path.getsize(last)
    assert harness.truncate_file(last) == size // 2
    assert os.path.getsize(last) == size // 2 and not (d / ".2.crc").exists()
    harness.corrupt_file(str(d / "1"))
    body = (d / "1").read_bytes()
    assert body.startswith(b"v1\n") and b"not json" in body


def test_make_unwritable_refuses_new_files_even_for_root(tmp_path):
    d = tmp_path / "commits"
    d.mkdir()
    state = harness.make_unwritable(str(d))
    try:
        with pytest.raises(OSError):
            (d / "5").write_text("x")
    finally:
        harness.restore_writable(state)
    (d / "5").write_text("x")


def _echo_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return

            def echo(c=conn):
                with c:
                    try:
                        while data := c.recv(100):
                            c.sendall(data)
                    except OSError:
                        pass

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_proxy_forwards_stalls_resets_and_cuts():
    srv = _echo_server()
    with contextlib.ExitStack() as closing, TcpProxy("127.0.0.1", srv.getsockname()[1]) as proxy:
        closing.callback(srv.close)
        c = closing.enter_context(socket.create_connection(("127.0.0.1", proxy.port), timeout=3))
        c.sendall(b"hi")
        assert c.recv(10) == b"hi"
        assert proxy.stall() == 1 and proxy.stats.stalled == 1  # the proof a stall met a connection
        c.sendall(b"x")
        c.settimeout(0.5)
        with pytest.raises(socket.timeout):
            c.recv(10)
        proxy.heal()
        c.settimeout(3)
        assert c.recv(10) == b"x"
        proxy.reset_on(b"COMMIT PREPARED")
        c.sendall(b"COMMIT PREPARED 'g'")
        with pytest.raises(ConnectionResetError):
            c.recv(100)
        assert proxy.stats.pattern_hits == 1
        proxy.cut()
        with pytest.raises(OSError):  # reset during or right after the connect, whichever comes first
            c2 = closing.enter_context(socket.create_connection(("127.0.0.1", proxy.port), timeout=3))
            c2.sendall(b"y")
            time.sleep(0.2)
            if not c2.recv(10):
                raise ConnectionResetError
        assert proxy.stats.refused >= 1
        proxy.heal()
        c3 = closing.enter_context(socket.create_connection(("127.0.0.1", proxy.port), timeout=3))
        c3.sendall(b"ok")
        assert c3.recv(10) == b"ok"
        assert proxy.reset() >= 1
    srv.close()


def test_kill_plan_is_seeded_and_mixed():
    a = chaos.plan_kills("2pc", 40, seed=7)
    assert a == chaos.plan_kills("2pc", 40, seed=7)
    assert a != chaos.plan_kills("2pc", 40, seed=8)
    kinds = {p.kind for p in a}
    assert kinds == {"kill", "fault-point"}
    points = {p.point for p in a if p.point}
    assert points <= set(chaos.fault_points("2pc")) and len(points) >= 3
    fault = next(p for p in a if p.point and p.point.startswith("sink."))
    spec = fault.spec(last_commit=4)
    assert spec.startswith(fault.point) and f":batch={5 + fault.skip}:" in spec and spec.endswith("kill-group:once")


def test_fault_points_of_chaos_exist():
    from eos_core import faults

    for points in map(chaos.fault_points, {*chaos.SINK_KINDS, *chaos.PIPELINES}):
        for p in points:
            assert p in faults.POINTS
            faults.parse_spec(f"{p}:batch=1:action=kill-group:once")


def test_records_unique_and_reproducible():
    a = chaos.make_records(100, seed=3)
    assert len({r["id"] for r in a}) == 100
    assert a == chaos.make_records(100, seed=3)
    b = chaos.make_records(100, seed=3, start=100)
    assert not {r["id"] for r in a} & {r["id"] for r in b}


def test_chaos_arguments_and_help():
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    chaos.add_subparser(sub)
    args = parser.parse_args(
        ["chaos", "--pipeline", "stateful", "--kills", "3", "--seed", "5", "--records", "90", "--json"]
    )
    assert (args.pipeline, args.kills, args.seed, args.records, args.json) == ("stateful", 3, 5, 90, True)
    assert args.func is not None
    with pytest.raises(SystemExit):
        parser.parse_args(["chaos", "--pipeline", "nope"])


def test_the_matrix_runner_gets_its_postgres_password_by_environment_not_command_line(tmp_path):
    from integration.harness.matrix import Pipeline

    dsn = "postgresql://eos_admin:s3cret@127.0.0.1:5432/postgres"
    pipe = Pipeline("2pc", "127.0.0.1:9092", "t", dsn, dsn, "t", str(tmp_path))
    argv = pipe.argv()
    assert "s3cret" not in " ".join(argv), argv  # ps shows a command line to every user of the machine
    assert argv[argv.index("--dsn") + 1] == "user=eos_admin dbname=postgres host=127.0.0.1 port=5432"
    assert pipe.env(None, "run0")["PGPASSWORD"] == "s3cret"
