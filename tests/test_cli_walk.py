"""Issue 32 item 3: every ``spark-eos`` subcommand, walked through missing, existing and malformed
arguments, answers a user error with one line on stderr (never a traceback, never a password) and
the documented exit code: 64 a bad command line or argument, 2 a service that fails, 3 services
that are not up (docs/pipelines-and-cli.md, exit codes). The Postgres-backed cases (a misspelled
``--sink-id``) are in integration/test_cli_walk_pg.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from connectors import cli

SECRET = "pw-Secret-9"
CLOSED = f"postgresql://u:{SECRET}@127.0.0.1:1/db"  # nothing listens on port 1
BAD_DSN = f"host=db password='{SECRET}"  # unterminated quote


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit code and the one stderr line of ``spark-eos argv``."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text and SECRET not in text, text
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1, out.err
    return code, lines[0]


def leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= leaves(sub, (*prefix, name)) or {(*prefix, name)}
    return found


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EOS_POSTGRES_DSN", "EOS_KAFKA_BOOTSTRAP", "SPARK_EOS_TRACEBACK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EOS_STATE_DIR", str(tmp_path / "state"))


def committed_checkpoint(path: Path) -> Path:
    for d in ("offsets", "commits"):
        (path / d).mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": "q"}))
    (path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n{}\n')
    (path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return path


# Each leaf command with arguments missing or malformed: (argv, exit code, text in the line).
USAGE = [
    ((), 64, "required: COMMAND"),
    (("frobnicate",), 64, "invalid choice"),
    (("demo", "--records", "many"), 64, "invalid int value"),
    (("run", "ledger"), 64, "required: --config"),
    (("run", "nope", "--config", "x.toml"), 64, "invalid choice"),
    (("run", "ledger", "--config", "/nope/ledger.toml"), 64, "does not exist"),
    (("inspect",), 64, "required: CHECKPOINT"),
    (("savepoint",), 64, "required"),
    (("savepoint", "create", "ck"), 64, "required: DEST"),
    (("savepoint", "restore"), 64, "required: DEST, CHECKPOINT"),
    (("verify", "--topic", "t"), 64, "required: --bootstrap, --dsn"),
    (("verify", "--topic", "t", "--bootstrap", "127.0.0.1:1", "--dsn", CLOSED), 64, "nothing to compare"),
    (
        ("verify", "--topic", "t", "--bootstrap", "127.0.0.1:1", "--dsn", CLOSED, "--sink-id", "s"),
        64,
        "--sink-id alone",
    ),
    (
        (
            "verify",
            "--topic",
            "t",
            "--bootstrap",
            "127.0.0.1:1",
            "--dsn",
            CLOSED,
            "--table",
            "x",
            "--id-column",
            "a=b c",
        ),
        64,
        "--id-column",
    ),
    (("submit-file", "extra"), 64, "unrecognized arguments"),
    (("doctor",), 64, "required: connector"),
    (("doctor", "nope"), 64, "invalid choice"),
    (("doctor", "postgres-upsert", "-o", "table"), 64, "give KEY=VALUE"),
    (("doctor", "postgres-upsert", "-o", "key=id"), 64, "option 'table'"),
    (("services",), 64, "required"),
    (("services", "up", "--kafka-port", "high"), 64, "invalid int value"),
    (("services", "up", "--kafka-broker", "redpanda"), 64, "invalid choice"),
    (("services", "down", "--bogus"), 64, "unrecognized arguments"),
    (("services", "status", "--bogus"), 64, "unrecognized arguments"),
    (("services", "env", "--bogus"), 64, "unrecognized arguments"),
    (("sinks",), 64, "required"),
    (("kafka-sink",), 64, "required"),
    (("kafka-sink", "status", "--sink-id", "s"), 64, "required: --bootstrap, --marker-topic"),
    (("kafka-sink", "reset", "--bootstrap", "127.0.0.1:1"), 64, "required: --sink-id"),
    (("chaos", "--kills", "some"), 64, "invalid int value"),
    (("chaos", "--generator", "j:records"), 64, "--generator needs --app"),
    (
        ("chaos", "--app", "j:build", "--generator", "no_such_module_x:records"),
        64,
        "--generator 'no_such_module_x:records': cannot import",
    ),
    (("chaos", "--app", "j:build", "--generator", "nocolon"), 64, "expected module:function"),
    (
        ("chaos", "--app", "j:build", "--records-file", "/nope/r.jsonl"),
        64,
        "--records-file '/nope/r.jsonl': no such file",
    ),
    (("chaos", "--app", "j:build", "--records-file", "x", "--generator", "j:r"), 64, "pick one"),
    (("chaos", "--app", "j:build", "--oracle", "upsert"), 64, "--oracle 'upsert': upsert needs the key columns"),
    (("chaos", "--app", "j:build", "--oracle", "merge"), 64, "--oracle 'merge': expected append or upsert"),
    (("chaos", "--oracle", "append"), 64, "--oracle needs --app"),
    (("chaos", "--app", "j:build", "--tolerance", "1e-9"), 64, "--tolerance tunes the oracle"),
    (("chaos", "--app", "j:build", "--oracle", "append", "--tolerance", "-1"), 64, "--tolerance -1.0: a number >= 0"),
    (("chaos", "--app", "j:build", "--oracle", "append", "--tolerance", "tiny"), 64, "invalid float value"),
    (("chaos", "--app", "j:build", "--ignore-columns", "at"), 64, "--ignore-columns tunes the oracle"),
    (
        ("chaos", "--app", "j:build", "--oracle", "append", "--reference-runs", "0"),
        64,
        "--reference-runs 0: at least 1",
    ),
    (("chaos", "--only-kills", "0,x"), 64, "--only-kills '0,x': comma-separated kill numbers"),
    (("chaos", "--kills", "2", "--only-kills", "2"), 64, "--only-kills 2: kill numbers from 0 to 1 (--kills 2)"),
    (("chaos", "--kills", "1", "--minimise"), 64, "--minimise drops kills one at a time"),
    (("chaos", "--kills", "5", "--only-kills", "3", "--minimise"), 64, "needs at least 2"),
    (("chaos", "--faults", "reboot:1"), 64, "--faults 'reboot': unknown fault kind; kinds: kill, fault-point"),
    (("chaos", "--faults", "kill:x"), 64, "--faults 'kill:x': the weight is a whole number >= 0"),
    (("chaos", "--faults", "kill:0"), 64, "no fault kind with a weight above 0"),
    (
        ("chaos", "--faults", "kill:1,broker-restart:1", "--bootstrap", "127.0.0.1:1"),
        64,
        "--faults broker-restart: needs a Kafka broker the chaos run starts itself (it restarts it), but --bootstrap names yours",
    ),
    (
        ("chaos", "--faults", "pg-stop:2", "--dsn", CLOSED),
        64,
        "--faults pg-stop: needs a Postgres spark-eos runs (it stops and starts the server), but --dsn names yours",
    ),
    (("chaos", "--faults", "slow-task:1", "--partitions", "1"), 64, "--faults slow-task: needs --partitions >= 2"),
    (("chaos", "--report", "/dev/null"), 64, "--report '/dev/null': a file is there; name a directory"),
]
SINKS = ["status", "recover", "release", "resolve-lost", "retire", "prune", "errors", "replay-errors"]
SINK_ARGS = {
    "release": ["--sink-id", "s", "--yes"],
    "resolve-lost": ["--sink-id", "s", "--batch", "1", "--take-back", "--yes"],
    "retire": ["--sink-id", "s", "--yes"],
    "prune": ["--sink-id", "s", "--keep", "1", "--yes"],
    "errors": ["--errors-table", "dl"],
    "replay-errors": ["--errors-table", "dl", "--target", "t"],
}


@pytest.mark.parametrize(("argv", "code", "needle"), USAGE, ids=[" ".join(a[:3]) or "(none)" for a, _, _ in USAGE])
def test_usage_errors_are_one_line_and_exit_64(
    argv: tuple[str, ...], code: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got, line = run(capsys, *argv)
    assert got == code and needle in line, line


def test_every_leaf_command_is_walked() -> None:
    nested = (("savepoint",), ("services",), ("sinks",), ("kafka-sink",))
    walked = {a[:2] if a[:1] in nested else a[:1] for a, _, _ in USAGE}
    walked |= {("sinks", c) for c in SINKS} | {("savepoint", "create"), ("savepoint", "restore")}
    assert leaves(cli.build_parser()) <= walked | {("services", "up")}, leaves(cli.build_parser()) - walked


@pytest.mark.parametrize("command", SINKS)
def test_sinks_commands_missing_malformed_and_unreachable(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = SINK_ARGS.get(command, ["--sink-id", "s"])
    code, line = run(capsys, "sinks", command, *args)
    assert code == 64 and "required: --dsn" in line, line
    code, line = run(capsys, "sinks", command, "--dsn", BAD_DSN, *args)
    assert code == 64 and "config error" in line and "dsn" in line, line
    # --dsn defaults to $EOS_POSTGRES_DSN, as for verify: the server there does not answer (exit 2)
    monkeypatch.setenv("EOS_POSTGRES_DSN", CLOSED)
    code, line = run(capsys, "sinks", command, *args)
    assert code == 2 and "cannot connect" in line, line


def test_inspect_missing_and_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "inspect", str(tmp_path / "nope"))
    assert code == 64 and "does not exist" in line
    code, line = run(capsys, "inspect", str(tmp_path))
    assert code == 64 and "not a streaming checkpoint" in line


def test_savepoint_create_missing_existing_and_uncommitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "savepoint", "create", str(tmp_path / "nope"), str(tmp_path / "sp"))
    assert code == 64 and "CHECKPOINT" in line and "does not exist" in line, line
    (tmp_path / "empty").mkdir()
    code, line = run(capsys, "savepoint", "create", str(tmp_path / "empty"), str(tmp_path / "sp"))
    assert code == 64 and "no commits/" in line, line
    ck = committed_checkpoint(tmp_path / "ck")
    (tmp_path / "taken").mkdir()
    code, line = run(capsys, "savepoint", "create", str(ck), str(tmp_path / "taken"))
    assert code == 64 and "exists; pass --force" in line, line


def test_savepoint_restore_missing_damaged_and_onto_an_existing_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, line = run(capsys, "savepoint", "restore", str(tmp_path / "nope"), str(tmp_path / "ck2"))
    assert code == 64 and "DEST" in line and "does not exist" in line, line
    (tmp_path / "plain").mkdir()
    code, line = run(capsys, "savepoint", "restore", str(tmp_path / "plain"), str(tmp_path / "ck2"))
    assert code == 64 and "not a spark-eos savepoint" in line, line
    ck = committed_checkpoint(tmp_path / "ck")
    assert cli.main(["savepoint", "create", str(ck), str(tmp_path / "sp")]) == 0
    capsys.readouterr()
    code, line = run(capsys, "savepoint", "restore", str(tmp_path / "sp"), str(ck))
    assert code == 64 and "--force" in line, line


def test_services_without_state_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["services", "status"]) == 3
    assert "no services recorded in" in capsys.readouterr().out
    code, line = run(capsys, "services", "env")
    assert code == 3 and "no services recorded" in line and "spark-eos services up" in line
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "services.json").write_text("{broken")
    code, line = run(capsys, "services", "status")
    assert code == 2 and "cannot read the services state file" in line, line


def test_an_unexpected_error_is_one_line_for_every_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(_args: argparse.Namespace) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "_submit_file_cmd", boom)
    code, line = run(capsys, "submit-file")
    assert code == 2 and "spark-eos submit-file: error: KeyError: 'surprise'" in line, line
