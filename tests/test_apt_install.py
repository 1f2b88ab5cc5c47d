"""integration.harness.dockerd.apt_install: waits out dpkg's lock held by another apt, names the failure."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eos_core.errors import ServiceError
from integration.harness import dockerd

FAKE_APT = """#!/bin/sh
echo "$@" >> "{log}"
n=$(wc -l < "{log}")
if [ "$n" -le {locked} ]; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1192 (apt-get)" >&2
  exit 100
fi
case "$*" in *no-such-package*) echo "E: Unable to locate package no-such-package" >&2; exit 100;; esac
exit 0
"""


def _fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, locked: int) -> Path:
    log = tmp_path / "calls"
    log.touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text(FAKE_APT.format(log=log, locked=locked))
    apt.chmod(apt.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("EOS_DOCKER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dockerd.time, "sleep", lambda s: None)
    return log


def test_apt_install_waits_for_a_lock_held_by_another_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _fake_apt(tmp_path, monkeypatch, locked=2)
    dockerd.apt_install("docker.io")
    calls = log.read_text().splitlines()
    # update refused twice for the lock, then update and install once each; apt's own wait is asked for too
    assert [c.split()[2] for c in calls] == ["update", "update", "update", "install"], calls
    assert all(c.startswith(f"-o DPkg::Lock::Timeout={int(dockerd.APT_LOCK_TIMEOUT)} ") for c in calls), calls
    assert calls[-1].endswith("docker.io")


def test_apt_install_names_the_command_and_apts_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _fake_apt(tmp_path, monkeypatch, locked=0)
    with pytest.raises(
        ServiceError, match=r"installing no-such-package failed at `apt-get .*install.*Unable to locate"
    ):
        dockerd.apt_install("no-such-package")
    assert len(log.read_text().splitlines()) == 2  # no retry for an error that is not the lock
