"""``spark-eos services up|down|status|env``: keep embedded Kafka and Postgres running for manual use.

Both are secured as users deploy them: Apache Kafka with a SASL_SSL listener (SCRAM-SHA-512, a CA of its own,
ACLs enforced; ``--kafka-security plaintext`` or ``EOS_KAFKA_SECURITY=plaintext`` for none) and Postgres with
TLS and scram-sha-256. ``env`` exports what a client needs: the bootstrap and ``EOS_KAFKA_CONFIG`` (the
admin's client properties), a DSN that verifies the server's certificate and ``PGPASSFILE`` (a passfile
beside the state: no password in the DSN, the environment or ``ps``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from connectors.commands import group, standalone
from connectors.services import _proc
from connectors.services.base import redact_dsn
from eos_core.errors import ServiceError
from eos_core.kafka_config import client_settings

__all__ = [
    "SERVICES",
    "STATE_ENV",
    "add_subparser",
    "default_state_dir",
    "down",
    "load_state",
    "main",
    "state_path",
    "status",
    "up",
]

STATE_ENV = "EOS_STATE_DIR"
SERVICES = ("kafka", "postgres", "registry")  # the state's entries, in the order they start, stop and show


def default_state_dir() -> Path:
    """The per-user state directory: ``${XDG_STATE_HOME:-~/.local/state}/spark-eos``.

    Per user, not per working directory, so ``spark-eos services status`` (and ``env``, ``down``)
    finds what ``up`` started from any directory."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "spark-eos"


def state_path(state_dir: str | None = None) -> Path:
    """``<state dir>/services.json``; the state dir is ``--state-dir``, ``EOS_STATE_DIR`` or the per-user
    ``default_state_dir()``."""
    return Path(state_dir or os.environ.get(STATE_ENV) or default_state_dir()) / "services.json"


def _legacy_hint(path: Path) -> str:
    """Older spark-eos kept the state in ``./.eos``: say so when such a file is here and not the one read."""
    old = Path(".eos") / "services.json"
    if old.exists() and old.resolve() != path.resolve():
        return f"; {old} here is from an older spark-eos: pass --state-dir .eos"
    return ""


def load_state(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ServiceError(f"cannot read the services state file {path}: {e}; delete it if no service runs") from e
    return state if isinstance(state, dict) else {}


def _save_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # The state holds the Postgres password: readable by the owner only.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, path)


def _is_ours(entry: dict[str, Any]) -> bool:
    """The recorded pid still runs the recorded program (pids get reused after a reboot or a crash).

    ``cmdline_contains`` (a JVM: its program is just ``java``) must also appear among its arguments.
    """
    pid = int(entry.get("pid") or 0)
    if pid <= 0 or not _proc.pid_alive(pid):
        return False
    try:
        args = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return False
    if os.path.basename(args[0]) != os.path.basename(str(entry.get("program", ""))):
        return False
    needle = entry.get("cmdline_contains")
    return not needle or str(needle) in args


def _healthy(name: str, entry: dict[str, Any], timeout: float = 3.0) -> bool:
    if name == "registry":
        from connectors.services.schema_registry import registry_answers

        return registry_answers(entry["url"], timeout)
    if name == "kafka":
        from connectors.services.embedded_kafka import kafka_reachable

        return kafka_reachable(entry["bootstrap"], timeout, client_settings(entry.get("client_config")))[0]
    from connectors.services.embedded_postgres import postgres_ready

    return postgres_ready(entry["dsn"], timeout)[0]


def up(
    *,
    state_dir: str | None = None,
    kafka: bool = True,
    postgres: bool = True,
    kafka_port: int | None = None,
    postgres_port: int | None = None,
    kafka_broker: str | None = None,
    kafka_security: str | None = None,
    registry: bool = False,
    registry_port: int | None = None,
    out: Any = None,
) -> dict[str, Any]:
    """Start the embedded services that are not running yet, detached from this process; return the state.

    ``kafka_broker`` is ``apache`` or ``tansu`` (default: ``EOS_KAFKA_EMBEDDED``, else apache);
    ``kafka_security`` ``sasl_ssl`` or ``plaintext`` (default: ``EOS_KAFKA_SECURITY``, else sasl_ssl for
    Apache Kafka; tansu has no SASL_SSL listener). ``registry``: a Schema Registry too (Apicurio, Confluent's
    API; ``connectors.services.schema_registry``).
    """
    from connectors.services import embedded_kafka_kind
    from connectors.services.embedded_postgres import EmbeddedPostgres

    out = out or sys.stdout
    path = state_path(state_dir)
    state = load_state(path)
    started: list[Any] = []
    try:
        if kafka:
            entry = state.get("kafka")
            if entry and _is_ours(entry):
                print(f"kafka     already up (pid {entry['pid']})", file=out)
            else:
                broker = embedded_kafka_kind({"EOS_KAFKA_EMBEDDED": kafka_broker} if kafka_broker else None)
                state["kafka"] = _start_kafka(broker, kafka_port, started, _kafka_security(broker, kafka_security))
        if postgres:
            entry = state.get("postgres")
            if entry and _is_ours(entry):
                print(f"postgres  already up (pid {entry['pid']})", file=out)
            else:
                p = EmbeddedPostgres(port=postgres_port, detached=True, keep=True)
                started.append(p)
                state["postgres"] = {
                    "kind": "embedded",
                    "pid": p.pid,
                    "port": p.port,
                    "dsn": p.dsn,
                    "program": str(p.bin_dir / "postgres"),
                    "pg_ctl": str(p.bin_dir / "pg_ctl"),
                    "base": str(p.base),
                    "data_dir": str(p.data_dir),
                    "log": str(p.log_path),
                    "run_as": p.run_as.user if p.run_as else None,
                    "start_seconds": round(p.start_seconds, 2),
                    "passfile": str(_write_passfile(path.parent, p.dsn)),
                }
        if registry:
            entry = state.get("registry")
            if entry and _is_ours(entry):
                print(f"registry  already up (pid {entry['pid']})", file=out)
            else:
                state["registry"] = _start_registry(registry_port, started)
    except BaseException:
        for service in started:  # never leave half of an "up" running without a record of it
            service.stop()
        raise
    _save_state(path, state)
    _print_state(state, out)
    print(f"state: {path}   stop with: spark-eos services down   (full DSN: spark-eos services env)", file=out)
    return state


def _kafka_security(broker: str, asked: str | None) -> str:
    from connectors.services import embedded_kafka_security

    security = asked or embedded_kafka_security(default="sasl_ssl")
    if broker == "tansu":
        if asked == "sasl_ssl":
            raise ServiceError("tansu has no SASL_SSL listener: use the apache broker, or --kafka-security plaintext")
        return "plaintext"
    return security


def _write_passfile(directory: Path, dsn: str) -> Path:
    """libpq's passfile (mode 0600) for ``dsn``'s host, port and user: ``env`` exports ``PGPASSFILE`` and a DSN
    without the password."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)

    def field(value: object) -> str:
        return str(value).replace("\\", "\\\\").replace(":", "\\:")

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pgpass"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(":".join(field(parts[k]) for k in ("host", "port")) + ":*:")
        f.write(":".join(field(parts[k]) for k in ("user", "password")) + "\n")
    return path


def _start_kafka(broker: str, port: int | None, started: list[Any], security: str = "plaintext") -> dict[str, Any]:
    """Start a detached embedded broker (appended to ``started`` at once) and return its state entry."""
    if broker == "tansu":
        from connectors.services.embedded_kafka import EmbeddedKafka

        t = EmbeddedKafka(port=port, detached=True)
        started.append(t)
        return {
            "kind": "embedded",
            "broker": "tansu",
            "pid": t.pid,
            "port": t.port,
            "bootstrap": t.bootstrap,
            "program": t.binary,
            "log": str(t.log_path),
            "start_seconds": round(t.start_seconds, 2),
        }
    from connectors.services.apache_kafka import ApacheKafka

    a = ApacheKafka(port=port, detached=True, security=security)
    started.append(a)
    properties = a.client_properties()
    return {
        "security": security,
        "client_config": str(properties) if properties else None,
        "kind": "embedded",
        "broker": "apache",
        "version": a.version,
        "pid": a.pid,
        "port": a.port,
        "controller_port": a.controller_port,
        "bootstrap": a.bootstrap,
        "program": a.java,
        "cmdline_contains": str(a.properties_path),
        "base": str(a.base),
        "data_dir": str(a.log_dir),
        "log": str(a.log_path),
        "start_seconds": round(a.start_seconds, 2),
    }


def _start_registry(port: int | None, started: list[Any]) -> dict[str, Any]:
    """Start a detached Apicurio Registry (appended to ``started`` at once) and return its state entry."""
    from connectors.services.schema_registry import ApicurioRegistry

    r = ApicurioRegistry(port=port, detached=True, persistent=True)
    started.append(r)
    return {
        "kind": "embedded",
        "version": r.version,
        "pid": r.pid,
        "port": r.port,
        "url": r.url,
        "program": str(r.java),
        "cmdline_contains": str(r.home / "quarkus-run.jar"),
        "base": str(r.base),
        "log": str(r.log_path),
        "start_seconds": round(r.start_seconds, 2),
    }


def _print_state(state: dict[str, Any], out: Any) -> None:
    if "kafka" in state:
        k = state["kafka"]
        if k.get("broker") == "apache":
            secured = ", SASL_SSL + ACLs" if k.get("security") == "sasl_ssl" else ", plaintext"
            what = f"Apache Kafka {k.get('version')}{secured}, data {k.get('data_dir')}"
        else:
            what = "tansu, memory storage: data is lost on stop"
        print(f"kafka     bootstrap {k['bootstrap']}   ({what})   pid {k['pid']}", file=out)
    if "postgres" in state:
        p = state["postgres"]
        print(f"postgres  dsn {redact_dsn(p['dsn'])}   pid {p['pid']}   data {p['data_dir']}", file=out)
    if "registry" in state:
        r = state["registry"]
        print(
            f"registry  url {r['url']}   (Apicurio Registry {r.get('version')}, schemas in memory)   pid {r['pid']}",
            file=out,
        )


def _stop_entry(name: str, entry: dict[str, Any]) -> None:
    pid = int(entry.get("pid") or 0)
    if name == "postgres":
        if _is_ours(entry) and entry.get("pg_ctl"):
            run_as = _proc.RunAs.named(entry["run_as"]) if entry.get("run_as") else None
            try:
                _proc.run(
                    [entry["pg_ctl"], "stop", "-D", entry["data_dir"], "-m", "fast", "-w", "-t", "30"],
                    run_as=run_as,
                    timeout=60,
                )
            except ServiceError:
                pass  # the signals below finish the job
        if _is_ours(entry):
            _proc.stop_group(None, pid, grace=10.0)
        if entry.get("base"):
            shutil.rmtree(entry["base"], ignore_errors=True)
        if entry.get("passfile"):
            Path(entry["passfile"]).unlink(missing_ok=True)
    elif name == "registry":
        if _is_ours(entry):
            _proc.stop_group(None, pid, grace=10.0, sig=signal.SIGTERM)
        if entry.get("base"):
            shutil.rmtree(entry["base"], ignore_errors=True)
    elif entry.get("broker") == "apache":
        if _is_ours(entry):  # SIGTERM: Kafka's clean shutdown, which takes a few seconds
            from connectors.services.apache_kafka import STOP_GRACE

            _proc.stop_group(None, pid, grace=STOP_GRACE, sig=signal.SIGTERM)
        if entry.get("base"):
            shutil.rmtree(entry["base"], ignore_errors=True)
    else:
        if _is_ours(entry):
            _proc.stop_group(None, pid, grace=5.0, sig=signal.SIGTERM)
        if entry.get("log"):
            shutil.rmtree(Path(entry["log"]).parent, ignore_errors=True)


def down(*, state_dir: str | None = None, out: Any = None) -> int:
    """Stop what ``up`` started and delete its data; returns how many services were stopped."""
    out = out or sys.stdout
    path = state_path(state_dir)
    state = load_state(path)
    if not state:
        print(f"no services recorded in {path}: nothing to stop{_legacy_hint(path)}", file=out)
        return 0
    n = 0
    for name in SERVICES:
        entry = state.get(name)
        if entry:
            alive = _is_ours(entry)
            _stop_entry(name, entry)
            print(f"{name:<9} {'stopped' if alive else 'was not running'} (pid {entry.get('pid')})", file=out)
            n += 1 if alive else 0
    path.unlink(missing_ok=True)
    return n


def status(*, state_dir: str | None = None, out: Any = None) -> dict[str, bool]:
    """{service: up?} for what ``up`` recorded; an entry is up when its process runs and answers."""
    out = out or sys.stdout
    path = state_path(state_dir)
    state = load_state(path)
    if not state:
        print(f"no services recorded in {path} (start them with: spark-eos services up){_legacy_hint(path)}", file=out)
        return {}
    result = {}
    for name in SERVICES:
        entry = state.get(name)
        if not entry:
            continue
        ok = _is_ours(entry) and _healthy(name, entry)
        result[name] = ok
        where = {"kafka": entry.get("bootstrap"), "registry": entry.get("url")}.get(name) or redact_dsn(entry["dsn"])
        print(f"{name:<9} {'up' if ok else 'DOWN'}   {where}   pid {entry.get('pid')}", file=out)
    return result


def _env_lines(state: dict[str, Any], path: Path | None = None) -> list[str]:
    import shlex

    from eos_core.kafka_config import CONFIG_ENV
    from sinks.postgres.connection import postgres_options

    lines = []
    if "kafka" in state:
        lines.append(f"export EOS_KAFKA_BOOTSTRAP={shlex.quote(state['kafka']['bootstrap'])}")
        if state["kafka"].get("client_config"):  # the admin's client properties: SASL_SSL and the CA
            lines.append(f"export {CONFIG_ENV}={shlex.quote(state['kafka']['client_config'])}")
    if "postgres" in state:
        pg = state["postgres"]
        if pg.get("passfile"):  # the password stays in a 0600 file libpq reads, out of the DSN and ps
            dsn = postgres_options(pg["dsn"], option="dsn")["dsn"]
            lines.append(f"export EOS_POSTGRES_DSN={shlex.quote(dsn)}")
            lines.append(f"export PGPASSFILE={shlex.quote(pg['passfile'])}")
        else:
            lines.append(f"export EOS_POSTGRES_DSN={shlex.quote(pg['dsn'])}")
    if "registry" in state:
        from connectors.services.schema_registry import URL_ENV

        lines.append(f"export {URL_ENV}={shlex.quote(state['registry']['url'])}")
    if path is not None:  # later commands in this shell find the same state, whatever their directory
        lines.append(f"export {STATE_ENV}={shlex.quote(str(path.parent.resolve()))}")
    return lines


# ---- command line -------------------------------------------------------------------------------
def _cmd_up(args: argparse.Namespace) -> int:
    up(
        state_dir=args.state_dir,
        kafka=not args.no_kafka,
        postgres=not args.no_postgres,
        kafka_port=args.kafka_port,
        postgres_port=args.postgres_port,
        kafka_broker=args.kafka_broker,
        kafka_security=args.kafka_security,
        registry=args.with_registry,
        registry_port=args.registry_port,
    )
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    down(state_dir=args.state_dir)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    result = status(state_dir=args.state_dir)
    return 0 if result and all(result.values()) else 3


def _cmd_env(args: argparse.Namespace) -> int:
    path = state_path(args.state_dir)
    state = load_state(path)
    if not state:
        print(
            f"no services recorded in {path} (start them with: spark-eos services up){_legacy_hint(path)}",
            file=sys.stderr,
        )
        return 3
    print("\n".join(_env_lines(state, path)))
    return 0


def _add_commands(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--state-dir",
            default=None,
            help=f"where services.json lives (default ${STATE_ENV}, else ~/.local/state/spark-eos)",
        )
        return p

    p = common(sub.add_parser("up", help="start embedded Kafka and Postgres and keep them running"))
    p.add_argument("--no-kafka", action="store_true", help="do not start Kafka")
    p.add_argument(
        "--kafka-broker",
        choices=("apache", "tansu"),
        default=None,
        help="the embedded broker: Apache Kafka (jars from Maven Central) or tansu (default $EOS_KAFKA_EMBEDDED or apache)",
    )
    p.add_argument(
        "--kafka-security",
        choices=("sasl_ssl", "plaintext"),
        default=None,
        help="Apache Kafka's listener: SASL_SSL with SCRAM-SHA-512 and ACLs (the default, or $EOS_KAFKA_SECURITY), "
        "or plaintext",
    )
    p.add_argument("--no-postgres", action="store_true", help="do not start Postgres")
    p.add_argument("--kafka-port", type=int, default=None, help="port for Kafka (default: a free one)")
    p.add_argument("--postgres-port", type=int, default=None, help="port for Postgres (default: a free one)")
    p.add_argument(
        "--with-registry",
        action="store_true",
        help="also start a Schema Registry (Apicurio Registry from Maven Central, Confluent's API; needs Java 21+)",
    )
    p.add_argument("--registry-port", type=int, default=None, help="port for the registry (default: a free one)")
    p.set_defaults(func=_cmd_up)
    common(sub.add_parser("down", help="stop the services started by 'up' and delete their data")).set_defaults(
        func=_cmd_down
    )
    common(
        sub.add_parser("status", help="show whether the services started by 'up' run and answer (exit 3 if not)")
    ).set_defaults(func=_cmd_status)
    common(
        sub.add_parser(
            "env",
            help="print export lines: EOS_KAFKA_BOOTSTRAP, EOS_KAFKA_CONFIG (secured Kafka), EOS_POSTGRES_DSN, "
            "PGPASSFILE, EOS_SCHEMA_REGISTRY_URL (--with-registry)",
        )
    ).set_defaults(func=_cmd_env)


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``services {up,down,status,env}`` to a CLI; each leaf sets ``func(args) -> exit code``."""
    return group(
        subparsers,
        "services",
        "run embedded Kafka and Postgres for manual use (up, down, status, env)",
        "services_command",
        _add_commands,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        return standalone("python -m connectors.services", __doc__, "services_command", _add_commands, argv)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
