"""Issue 27 item 10: ``spark-eos inspect`` and ``spark-eos verify`` given bad arguments say so in one
line on stderr with the documented exit code (64 a bad argument, 2 a service that fails), never a
traceback and never a password (docs/pipelines-and-cli.md, exit codes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors import cli

PG = "postgresql://u:pw-Secret-9@127.0.0.1:1/db"  # nothing listens on port 1
BAD_DSN = "host=db password='pw-Secret-9"  # unterminated quote: libpq rejects it


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    assert "pw-Secret-9" not in text and "Secret-9" not in text
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1, out.err
    return code, lines[0]


def checkpoint(tmp_path: Path) -> str:
    (tmp_path / "ck" / "offsets").mkdir(parents=True)
    return str(tmp_path / "ck")


def test_inspect_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "inspect", str(tmp_path / "nope"))
    assert code == cli.EXIT_CONFIG and "does not exist" in line and "nope" in line


def test_inspect_directory_that_is_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "inspect", str(tmp_path))
    assert code == cli.EXIT_CONFIG and "not a streaming checkpoint" in line


def test_inspect_malformed_dsn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "inspect", checkpoint(tmp_path), "--dsn", BAD_DSN)
    assert code == cli.EXIT_CONFIG and "'--dsn' is not a valid connection string" in line


def test_inspect_unreachable_postgres(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "inspect", checkpoint(tmp_path), "--dsn", PG)
    assert code == 2 and "postgres" in line


def test_inspect_bad_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run(capsys, "inspect", checkpoint(tmp_path), "--dsn", PG, "--eos-schema", "a;b")
    assert code == cli.EXIT_CONFIG and "--eos-schema" in line


def test_inspect_unexpected_failure_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = checkpoint(tmp_path)
    (Path(ck) / "metadata").write_text("{not json")
    monkeypatch.delenv("SPARK_EOS_TRACEBACK", raising=False)
    code, line = run(capsys, "inspect", ck)
    assert code == 2 and "JSONDecodeError" in line


def verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    return run(capsys, "verify", "--table", "t", *argv)


@pytest.mark.parametrize("bootstrap", ["a b", "host:99999", "host:port", "h1:9092,,h2:9092", ""])
def test_verify_malformed_bootstrap(bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = verify(capsys, "--bootstrap", bootstrap, "--topic", "t", "--dsn", PG)
    assert code == cli.EXIT_CONFIG and "--bootstrap" in line


def test_verify_malformed_dsn(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = verify(capsys, "--bootstrap", "127.0.0.1:1", "--topic", "t", "--dsn", BAD_DSN)
    assert code == cli.EXIT_CONFIG and "'--dsn' is not a valid connection string" in line


def test_verify_unreachable_kafka(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "KAFKA_CHECK_TIMEOUT_S", 1.0)
    code, line = verify(capsys, "--bootstrap", "127.0.0.1:1", "--topic", "t", "--dsn", PG)
    assert code == 2 and "127.0.0.1:1" in line and "did not answer" in line


class _Meta:
    def __init__(self, topics: dict[str, Any]) -> None:
        self.topics = topics


class _NoTopicConsumer:
    """A cluster that answers and has no topic 'missing' (librdkafka's answer: the topic, with an error)."""

    closed = 0

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, topic: str, timeout: float) -> _Meta:
        from confluent_kafka import KafkaError

        class T:
            error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            partitions: dict[int, Any] = {}

        return _Meta({topic: T()})

    def close(self) -> None:
        type(self).closed += 1


def test_verify_topic_that_does_not_exist(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Consumer", _NoTopicConsumer)
    code, line = verify(capsys, "--bootstrap", "127.0.0.1:9092", "--topic", "missing", "--dsn", PG)
    assert code == cli.EXIT_CONFIG and "--topic 'missing' does not exist" in line
    assert _NoTopicConsumer.closed == 1


def test_verify_unreachable_postgres(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka

    from connectors.toolkit import checker

    class Exists(_NoTopicConsumer):
        def list_topics(self, topic: str, timeout: float) -> _Meta:
            return _Meta({topic: type("T", (), {"error": None, "partitions": {}})()})

    monkeypatch.setattr(confluent_kafka, "Consumer", Exists)
    monkeypatch.setattr(checker, "read_topic", lambda *a, **k: [])
    code, line = verify(capsys, "--bootstrap", "127.0.0.1:9092", "--topic", "t", "--dsn", PG)
    assert code == 2 and "postgres" in line
