"""Process control for crash tests and chaos: run, kill (by group), restart and tamper with pipelines."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from eos_core import faults

__all__ = [
    "Outcome",
    "PipelineProcess",
    "Unwritable",
    "cmdline",
    "corrupt_file",
    "descendants",
    "describe_exit",
    "executor_pids",
    "kill_executor",
    "latest_file",
    "make_unwritable",
    "marked_processes",
    "parent_pid",
    "password_apart",
    "process_state",
    "python_argv",
    "restore_writable",
    "truncate_file",
    "wait_until",
]


@dataclass
class Outcome:
    """How a pipeline process ended: return code (negative = signal), wall time, its log tail."""

    returncode: int
    seconds: float
    log_tail: str = ""

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def __str__(self) -> str:
        return f"{describe_exit(self.returncode)} after {self.seconds:.1f}s"


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


SCRATCH_PREFIX = "eos-run-jvm-"


def _scratch_dir() -> str:
    """A new JVM scratch directory, claimed by this process; those of a process that died before it could
    remove them (SIGKILLed) are swept first."""
    import tempfile
    from pathlib import Path

    from connectors.services import _proc

    _proc.sweep_stale(SCRATCH_PREFIX)
    path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    _proc.claim_dir(Path(path))
    return path


@dataclass
class PipelineProcess:
    """A pipeline run as a child process in its own session (and so its own process group).

    The group holds the Python driver and the JVM it spawns, so ``kill_group()`` takes them at once,
    like a machine losing power: nothing runs cleanup. PySpark's worker daemon leads a group of its
    own; it and its workers are found by the job's ``EOS_FAULTS_PGID`` (``app_runner`` names the group
    before the JVM starts) and killed with the group when the run ends, so no task of a killed run
    writes on after it (the daemon alone would notice the JVM's death only within a second).

    Each run's JVMs keep their scratch files (``java.io.tmpdir``, and so Spark's local dirs unless the
    environment names them: ``spark-*``, ``blockmgr-*``, the native libraries lz4-java, snappy and RocksDB
    unpack) in a directory of the run's own, removed when the run has ended: a SIGKILLed JVM removes none
    of its own, and a few thousand killed runs filled the disk of the machine that ran them.
    """

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    log_path: str | None = None
    cwd: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started: float = field(default=0.0, init=False)
    log_start: int = field(default=0, init=False)  # the log's size when this run started (runs share a log)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)
    _seen: set[str] = field(default_factory=set, init=False, repr=False)
    scratch: str | None = field(default=None, init=False)  # the run's JVM scratch directory

    def start(self) -> PipelineProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"pipeline already running (pid {self.proc.pid})")
        env = dict(os.environ if self.env is None else self.env)
        # the child leads a group of its own and names it itself: a group id inherited from here
        # would aim its kill-group faults at us
        env.pop(faults.ENV_PGID, None)
        self.scratch = _scratch_dir()
        options = f"{env.get('JDK_JAVA_OPTIONS', '')} -Djava.io.tmpdir={self.scratch}"  # the last one wins
        env["JDK_JAVA_OPTIONS"] = options.strip()
        self._log = open(self.log_path, "ab") if self.log_path else None
        self.log_start = self._log.tell() if self._log else 0
        self._seen = set()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            list(self.argv),
            env=env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
            start_new_session=True,  # own process group: the kill reaches the JVM and workers too
        )
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("pipeline not started")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the leader's pid is the group id: start_new_session)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> Outcome:
        """Wait for the leader, then make sure no member of its group survives (JVM, workers)."""
        if self.proc is None:
            raise RuntimeError("pipeline not started")
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None:
                self._reap_group()
                if self.scratch is not None:
                    shutil.rmtree(self.scratch, ignore_errors=True)
                    self.scratch = None
                if self._log:
                    self._log.close()
                    self._log = None
        return Outcome(rc, time.monotonic() - self.started, self.log_tail())

    def stop(self, timeout: float = 30.0) -> Outcome:
        """Kill the group and wait (for cleanup in tests: never leave a JVM behind)."""
        if self.alive():
            self.kill_group()
        return self.wait(timeout)

    def _reap_group(self) -> None:
        # A leader that died by a fault point's ``kill`` (not kill-group) can leave the JVM behind; a
        # kill-group leaves PySpark's daemon and its workers (their own group) running for a moment.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            strays = marked_processes(self.pid)
            group = _group_alive(self.pid)
            if not group and not strays:
                return
            if group:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def log_tail(self, chars: int = 4000) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(self.log_path) - chars))
            return fh.read().decode("utf-8", "replace")

    def logged(self, text: str) -> bool:
        """Whether this run (not an earlier one appending to the same log) has logged ``text``; however
        much it logged after it (a tail would lose a start marker under the stack traces of retries)."""
        if text in self._seen:
            return True
        if not self.log_path or not os.path.exists(self.log_path):
            return False
        needle = text.encode()
        with open(self.log_path, "rb") as fh:
            fh.seek(self.log_start)
            carry = b""
            while chunk := fh.read(1 << 20):
                if needle in carry + chunk:
                    self._seen.add(text)
                    return True
                carry = chunk[-len(needle) :]
        return False

    def run(self, timeout: float) -> Outcome:
        """Start and wait; on timeout kill the group and raise with the log tail."""
        self.start()
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            out = self.stop()
            raise TimeoutError(f"pipeline did not finish in {timeout}s ({out}); log tail:\n{out.log_tail}") from None


def marked_processes(pgid: int) -> list[int]:
    """Live processes that carry ``EOS_FAULTS_PGID=pgid``: a job's processes outside its group
    (PySpark's worker daemon and its workers)."""
    mark = f"{faults.ENV_PGID}={pgid}".encode()
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if mark in fh.read().split(b"\0") and process_state(pid) != "Z":
                    found.append(pid)
        except OSError:
            continue
    return found


def _group_alive(pgid: int) -> bool:
    for pid in _pids():
        try:
            if os.getpgid(pid) == pgid and process_state(pid) != "Z":
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def process_state(pid: int) -> str:
    """The state letter of process ``pid`` (``Z``: a zombie), ``?`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` (OSError when it is gone)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    """The command line of process ``pid``, its arguments joined by spaces ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (from /proc; Linux only)."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        try:
            children.setdefault(parent_pid(pid), []).append(pid)
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def executor_pids(root: int) -> list[int]:
    """The executor JVMs (CoarseGrainedExecutorBackend) under ``root`` in ``local-cluster`` mode."""
    return sorted(p for p in descendants(root) if "CoarseGrainedExecutorBackend" in cmdline(p))


def kill_executor(root: int, *, timeout: float = 120.0, index: int = 0) -> int:
    """Wait for an executor JVM under ``root`` and SIGKILL it; returns its pid (the proof)."""
    wait_until(lambda: executor_pids(root), timeout=timeout, what="an executor JVM")
    pids = executor_pids(root) or [-1]
    victim = pids[index % len(pids)]
    os.kill(victim, signal.SIGKILL)
    return victim


def wait_until(
    predicate: Callable[[], object],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    alive: Callable[[], bool] | None = None,
) -> object:
    """Poll ``predicate`` until it returns something truthy; TimeoutError naming ``what`` otherwise.

    ``alive``: stop early (RuntimeError) when the watched process has died.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive():
            raise RuntimeError(f"process ended while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# checkpoint tampering


def latest_file(directory: str) -> str:
    """The highest-numbered file in a checkpoint log directory (``offsets`` or ``commits``)."""
    nums = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    if not nums:
        raise FileNotFoundError(f"no numbered file in {directory}")
    return os.path.join(directory, str(nums[-1]))


def _drop_crc(path: str) -> None:
    # Hadoop's checksum file would reveal the damage as a checksum error; we want Spark's own check.
    crc = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
    if os.path.exists(crc):
        os.remove(crc)


def truncate_file(path: str, size: int | None = None) -> int:
    """Cut a checkpoint file (default: to half its length, mid-JSON); returns the new size."""
    length = os.path.getsize(path)
    new = length // 2 if size is None else size
    with open(path, "r+b") as fh:
        fh.truncate(new)
    _drop_crc(path)
    return new


def corrupt_file(path: str) -> None:
    """Overwrite a checkpoint file's body with bytes that are not JSON (keeps the version line)."""
    with open(path, "rb") as fh:
        first = fh.readline()
    with open(path, "wb") as fh:
        fh.write(first + b'{"this is": not json\x00\xff')
    _drop_crc(path)


@dataclass
class Unwritable:
    path: str
    how: str


def make_unwritable(path: str) -> Unwritable:
    """Make a directory refuse new files, even for root: ``chattr +i`` when possible, else chmod."""
    if os.geteuid() == 0 and shutil.which("chattr"):
        res = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
        if res.returncode == 0:
            return Unwritable(path, "chattr")
        if os.geteuid() == 0:
            raise OSError(f"cannot make {path} unwritable as root: chattr failed: {res.stderr.strip()}")
    os.chmod(path, 0o500)
    return Unwritable(path, "chmod")


def restore_writable(state: Unwritable) -> None:
    if state.how == "chattr":
        subprocess.run(["chattr", "-i", state.path], check=True)
    else:
        os.chmod(state.path, 0o755)


def python_argv(module: str, *args: str) -> list[str]:
    """``[this interpreter, -m, module, *args]``: the pipeline runs with the test's venv."""
    return [sys.executable, "-m", module, *args]


def password_apart(dsn: str) -> tuple[str, dict[str, str]]:
    """``dsn`` without its password, and ``{"PGPASSWORD": ...}`` (empty when it holds none) for the run's
    environment, where libpq reads it in every process of the run. A run's command line is what ``ps``
    shows to every user of the machine, and its --dsn ends up in its sink's options."""
    if not dsn:
        return "", {}
    from sinks.postgres.connection import postgres_options

    parts = postgres_options(dsn, option="--dsn")
    password = parts.get("password")
    return parts["dsn"], ({"PGPASSWORD": password} if password else {})
