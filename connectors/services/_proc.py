"""Process plumbing shared by the embedded services: ports, process groups, privilege drop, cleanup."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from eos_core.errors import ServiceError

__all__ = [
    "OWNER_FILE",
    "RunAs",
    "claim_dir",
    "descendants",
    "free_port",
    "group_pids",
    "locked",
    "pid_alive",
    "port_in_use",
    "process_tree",
    "register_cleanup",
    "run",
    "run_as_for_root",
    "spawn",
    "stop_group",
    "sweep_stale",
    "tail",
    "unregister_cleanup",
    "wait_until",
]

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the caller retries if it loses the race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on ``host:port`` or holds it bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR like every server: sockets in TIME_WAIT from our own health checks do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


@contextlib.contextmanager
def locked(path: Path, timeout: float, what: str) -> Iterator[None]:
    """An exclusive flock on ``path`` (made if missing), waited for up to ``timeout`` seconds; a
    ServiceError names ``what`` the holder is doing and the lock file after that."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ServiceError(
                        f"another process has been {what} for {timeout:.0f}s (lock {path}); "
                        "wait for it or remove the lock file if no such process runs",
                        lock=str(path),
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds pass; returns the last result."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (read from /proc, no psutil)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the command name in parentheses, which may itself hold spaces.
    return stat[stat.rindex(")") + 2] not in "ZX"


def _processes() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live (non-zombie) process, from /proc."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in "ZX":
            yield int(entry), int(fields[1]), int(fields[2])


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``, from /proc."""
    return sorted(pid for pid, _, group in _processes() if group == pgid)


OWNER_FILE = "owner.pid"


def claim_dir(path: Path) -> None:
    """Record that this process owns the temp dir ``path`` (see ``sweep_stale``)."""
    (path / OWNER_FILE).write_text(str(os.getpid()))


def sweep_stale(prefix: str) -> list[Path]:
    """Delete ``<tmp>/<prefix>*`` dirs whose owning process is gone (it died by SIGKILL, before any cleanup).

    Only dirs with an owner file are considered: ``services up`` leaves none, its services outlive it.
    """
    import tempfile

    removed = []
    for d in Path(tempfile.gettempdir()).glob(prefix + "*"):
        try:
            owner = int((d / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not pid_alive(owner):
            pidfile = d / "data" / "postmaster.pid"
            try:
                server = int(pidfile.read_text().split()[0]) if pidfile.exists() else 0
            except (OSError, ValueError, IndexError):
                server = 0
            if server and pid_alive(server):
                continue  # a server still runs there; the kernel's parent-death signal will end it first
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def tail(path: Path | str, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file, for error messages ('' when unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class RunAs:
    """An unprivileged account a child process switches to (PostgreSQL refuses to run as root)."""

    user: str
    uid: int
    gid: int
    home: str

    @classmethod
    def named(cls, user: str) -> RunAs:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise ServiceError(
                f"user {user!r} does not exist: PostgreSQL refuses to run as root, so spark-eos runs it as an "
                f"unprivileged user. Create one (e.g. 'useradd --system {user}') or name another with EOS_PG_USER.",
                user=user,
            ) from None
        return cls(user=user, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir)


def run_as_for_root() -> RunAs | None:
    """The account to drop to when we are root (``EOS_PG_USER``, default ``postgres``), else None."""
    if os.geteuid() != 0:
        return None
    return RunAs.named(os.environ.get("EOS_PG_USER", "postgres"))


# Loaded once in the parent: the child of a fork in a threaded process (Spark's py4j threads) must not
# import or load anything before exec.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _tie_to_parent() -> None:
    # Runs in the child after Popen switched uid/gid (a credential change clears the parent-death
    # signal, so the order matters). The kernel then SIGKILLs the child when we die by SIGKILL,
    # where no atexit handler can run.
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _creds(run_as: RunAs | None) -> dict[str, Any]:
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


def spawn(
    argv: Sequence[str],
    *,
    log: IO[bytes] | int | None = subprocess.DEVNULL,
    run_as: RunAs | None = None,
    tie_to_parent: bool = True,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session/process group, optionally as ``run_as``.

    ``tie_to_parent`` makes the kernel SIGKILL it when this interpreter dies; ``services up`` turns it
    off because those processes must outlive the command.
    """
    child_env = dict(os.environ if env is None else env)
    if run_as is not None:
        child_env.update(HOME=run_as.home, USER=run_as.user, LOGNAME=run_as.user)
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT if log not in (None, subprocess.DEVNULL) else log,
        start_new_session=True,
        preexec_fn=_tie_to_parent if tie_to_parent else None,
        env=child_env,
        cwd=cwd,
        **_creds(run_as),
    )


def run(
    argv: Sequence[str], *, run_as: RunAs | None = None, timeout: float = 120.0, env: dict[str, str] | None = None
) -> str:
    """Run a helper command (initdb, pg_ctl) to completion; ServiceError with its output when it fails (a
    ``password=`` in its arguments shown as ``password=***``)."""
    shown = " ".join(_PASSWORD_ARG.sub(r"\1***", a) for a in argv)
    child_env = dict(os.environ if env is None else env)
    if run_as is not None:
        child_env.update(HOME=run_as.home, USER=run_as.user, LOGNAME=run_as.user)
    try:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=child_env,
            cwd="/",
            **_creds(run_as),
        )
    except subprocess.TimeoutExpired as e:
        raise ServiceError(f"{argv[0]} did not finish within {timeout:.0f}s: {shown}", command=shown.split()) from e
    output: str = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode != 0:
        raise ServiceError(
            f"{Path(argv[0]).name} failed with exit code {done.returncode}: {shown}\n{output.strip()}",
            command=shown.split(),
            returncode=done.returncode,
        )
    return output


_PASSWORD_ARG = re.compile(r"(password=)[^,\]\s]+", re.IGNORECASE)


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (children, grandchildren, ...), from the /proc parent links."""
    children: dict[int, list[int]] = {}
    for child, parent, _ in _processes():
        children.setdefault(parent, []).append(child)
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return sorted(out)


def process_tree(pid: int) -> list[int]:
    """``pid`` (if alive), its process group and its descendants: everything a service stop must end."""
    pids = set(group_pids(pid)) | set(descendants(pid))
    if pid_alive(pid):
        pids.add(pid)
    return sorted(pids)


def stop_group(
    proc: subprocess.Popen[bytes] | None, pgid: int, *, grace: float = 10.0, sig: int = signal.SIGTERM
) -> None:
    """Send ``sig`` to process group ``pgid``, wait up to ``grace`` seconds, then SIGKILL what is left.

    What is left includes descendants that made their own process group (PostgreSQL backends call
    setsid), snapshotted before the signal so that none escapes by being re-parented.
    """
    tree = set(process_tree(pgid))

    def signal_group(s: int) -> None:
        if s == 0:
            return
        try:
            os.killpg(pgid, s)
        except (ProcessLookupError, PermissionError):
            pass

    def gone() -> bool:
        if proc is not None:
            proc.poll()  # reap our child so it does not linger as a zombie
        tree.update(descendants(pgid) if pid_alive(pgid) else [])
        return not any(pid_alive(p) for p in tree) and not group_pids(pgid)

    signal_group(sig)
    if not wait_until(gone, grace, 0.05):
        signal_group(signal.SIGKILL)
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        wait_until(gone, 5.0, 0.05)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


# ---- cleanup of everything still running when the interpreter exits ------------------------------
_live: dict[int, tuple[int, Callable[[], None]]] = {}
_lock = threading.RLock()  # re-entrant: the signal handler may interrupt a holder in the main thread
_handlers_installed = False


def register_cleanup(key: int, stop: Callable[[], None]) -> None:
    """Remember ``stop`` so it runs at interpreter exit or on SIGTERM/SIGHUP if nobody called it."""
    global _handlers_installed
    with _lock:
        _live[key] = (os.getpid(), stop)
        if not _handlers_installed:
            atexit.register(_cleanup_all)
            if threading.current_thread() is threading.main_thread():
                for signum in (signal.SIGTERM, signal.SIGHUP):
                    previous = signal.getsignal(signum)
                    if previous in (signal.SIG_DFL, None):
                        signal.signal(signum, _on_signal)
            _handlers_installed = True


def unregister_cleanup(key: int) -> None:
    with _lock:
        _live.pop(key, None)


def _cleanup_all() -> None:
    with _lock:
        # A forked child inherits the registry but does not own the services: only their starter stops them.
        stops = [stop for owner, stop in _live.values() if owner == os.getpid()]
        _live.clear()
    for stop in stops:
        try:
            stop()
        except Exception:  # at exit nothing can be reported better than trying the rest
            pass


def _on_signal(signum: int, frame: Any) -> None:
    _cleanup_all()
    # Die of the same signal, as the default action would have done.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
