"""Fault points: off by default, matched by conditions, once across processes, logged before acting."""

import os
import signal
import subprocess
import sys

import pytest

from eos_core import faults
from eos_core.errors import ConfigError


@pytest.fixture
def fault_env(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV_LOG, str(tmp_path / "fired.jsonl"))
    monkeypatch.setenv(faults.ENV_STATE, str(tmp_path / "state"))
    monkeypatch.delenv(faults.ENV_SPEC, raising=False)
    monkeypatch.delenv(faults.ENV_PGID, raising=False)  # a leaked group id would aim kill-group at pytest
    return tmp_path


def test_off_unless_enabled(fault_env):
    faults.point("sink.after_prepare", batch=3, partition=0)
    assert faults.fired(str(fault_env / "fired.jsonl")) == []


def test_raise_matches_conditions_and_logs(fault_env):
    spec = "sink.after_prepare:batch=3:partition=0"
    faults.point("sink.after_prepare", spec=spec, batch=2, partition=0)
    faults.point("sink.after_prepare", spec=spec, batch=3, partition=1)
    with pytest.raises(faults.FaultInjected, match=r"sink\.after_prepare"):
        faults.point("sink.after_prepare", spec=spec, batch=3, partition=0)
    (entry,) = faults.fired(str(fault_env / "fired.jsonl"))
    assert entry["point"] == "sink.after_prepare"
    assert entry["batch"] == 3 and entry["partition"] == 0


def test_env_var_enables(fault_env, monkeypatch):
    monkeypatch.setenv(faults.ENV_SPEC, "source.read.mid:partition=1")
    with pytest.raises(faults.FaultInjected):
        faults.point("source.read.mid", partition=1)


def test_once_and_times(fault_env):
    with pytest.raises(faults.FaultInjected):
        faults.point("sink.after_write", spec="sink.after_write:once")
    faults.point("sink.after_write", spec="sink.after_write:once")  # used up
    spec = "sink.after_commit:times=2"
    for _ in range(2):
        with pytest.raises(faults.FaultInjected):
            faults.point("sink.after_commit", spec=spec)
    faults.point("sink.after_commit", spec=spec)
    assert len(faults.fired(str(fault_env / "fired.jsonl"))) == 3


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("sink.after_prepar", "unknown fault point 'sink.after_prepar'"),
        ("sink.after_prepare:action=explode", "unknown action 'explode'"),
        ("sink.after_prepare:batch", "neither 'once' nor key=value"),
        ("sink.after_prepare:times=x", "times must be a whole number"),
    ],
)
def test_bad_specs_are_config_errors(spec, pattern):
    with pytest.raises(ConfigError, match=pattern):
        faults.parse_spec(spec)


def _run_child(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_kill_is_logged_before_the_process_dies_and_fires_once(fault_env):
    env = dict(os.environ, EOS_FAULTS="sink.after_prepare:action=kill:once", PYTHONPATH=os.getcwd())
    code = "from connectors import faults; faults.point('sink.after_prepare', batch=1); print('survived')"
    first = _run_child(code, env)
    assert first.returncode == -signal.SIGKILL
    assert "survived" not in first.stdout
    second = _run_child(code, env)  # the once-state outlived the killed process
    assert second.returncode == 0 and "survived" in second.stdout
    (entry,) = faults.fired(str(fault_env / "fired.jsonl"))
    assert entry["action"] == "kill" and entry["batch"] == 1


def test_kill_group_takes_the_whole_process_group(fault_env):
    env = dict(os.environ, EOS_FAULTS="sink.commit.after_decision:action=kill-group", PYTHONPATH=os.getcwd())
    # a parent in its own session starts a child sharing its group; the child's fault kills both
    code = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', \"from connectors import faults; faults.point('sink.commit.after_decision')\"]);"
        "time.sleep(30); print('parent survived')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, start_new_session=True
    )
    assert proc.returncode == -signal.SIGKILL
    assert "parent survived" not in proc.stdout


def test_exit_action_uses_code(fault_env):
    env = dict(os.environ, EOS_FAULTS="pipeline.batch:action=exit:code=42", PYTHONPATH=os.getcwd())
    proc = _run_child("from connectors import faults; faults.point('pipeline.batch')", env)
    assert proc.returncode == 42


def test_kill_group_targets_the_group_named_in_the_environment(fault_env):
    # PySpark's daemon puts executor workers in their own group; EOS_FAULTS_PGID names the query's.
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        env = dict(
            os.environ,
            EOS_FAULTS="sink.after_prepare:action=kill-group",
            EOS_FAULTS_PGID=str(os.getpgid(victim.pid)),
            PYTHONPATH=os.getcwd(),
        )
        code = "from connectors import faults; faults.point('sink.after_prepare'); print('survived')"
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, start_new_session=True
        )
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert proc.returncode == -signal.SIGKILL  # and the firing process itself never runs past the point
        assert "survived" not in proc.stdout
    finally:
        if victim.poll() is None:
            victim.kill()
