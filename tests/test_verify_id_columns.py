"""Issue 32 item 2: ``verify`` for any table. ``--id-column`` names what identifies a record (one or
more fields of its JSON value, or its Kafka position topic/partition/offset, each with the table's
column), a table or topic that cannot be compared is refused with one line, and nothing is "held"
without rows compared."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import psycopg
import pytest

from connectors import cli
from connectors.toolkit import checker
from eos_core.errors import ConfigError

TOPIC = [
    {"id": 1, "account": "a", "amount": 5, "_topic": "t", "_partition": 0, "_offset": 0},
    {"id": 2, "account": "b", "amount": 7, "_topic": "t", "_partition": 1, "_offset": 0},
    {"id": 3, "account": "a", "amount": 9, "_topic": "t", "_partition": 0, "_offset": 1},
]


def fake_services(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]], columns: list[str]) -> None:
    def read_topic(_b: str, _t: str, *, with_position: bool = False, **_: Any) -> list[dict[str, Any]]:
        keep = ("_topic", "_partition", "_offset")
        return [{k: v for k, v in r.items() if with_position or k not in keep} for r in TOPIC]

    monkeypatch.setattr(checker, "read_topic", read_topic)
    monkeypatch.setattr(psycopg, "connect", lambda *_a, **_k: nullcontext(object()))
    monkeypatch.setattr(checker, "read_table", lambda _c, _t: [dict(r) for r in rows])
    monkeypatch.setattr(checker, "_columns", lambda _c, _t: columns)
    monkeypatch.setattr(checker, "check_end_state", lambda *_a, **_k: [])


def verify(**kw: Any) -> checker.Report:
    return checker.verify(bootstrap="b:1", topic="t", dsn="d", table="payments", **kw)


def test_kafka_position_identifies_the_records(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        {"account": "a", "amount": 5, "src_partition": 0, "src_offset": 0},
        {"account": "b", "amount": 7, "src_partition": 1, "src_offset": 0},
        {"account": "a", "amount": 9, "src_partition": 0, "src_offset": 1},
    ]
    fake_services(monkeypatch, rows, ["account", "amount", "src_partition", "src_offset"])
    idc = checker.parse_id_columns(["partition=src_partition,offset=src_offset"])
    assert idc == [("partition", "src_partition"), ("offset", "src_offset")]
    report = verify(id_columns=idc)
    assert report.ok and report.get("records.losses").counts["losses"] == 0, report.table()
    # a duplicate and a loss by position are found, and a changed payload
    rows2 = [rows[0], rows[0], {**rows[1], "amount": 8}]
    fake_services(monkeypatch, rows2, ["account", "amount", "src_partition", "src_offset"])
    report = verify(id_columns=idc)
    assert report.get("records.duplicates").counts["duplicates"] == 1
    assert report.get("records.losses").counts["losses"] == 1
    assert report.get("records.payload").ok is False and not report.ok


def test_several_value_fields_and_a_renamed_column(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"payment_id": r["id"], "account": r["account"], "amount": r["amount"]} for r in TOPIC]
    fake_services(monkeypatch, rows, ["payment_id", "account", "amount"])
    report = verify(id_columns=checker.parse_id_columns(["id=payment_id", "account"]))
    assert report.ok, report.table()
    assert report.get("records.duplicates").counts["sink"] == 3


def test_a_table_without_the_id_column_is_refused_naming_its_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was KeyError: 'id' on the Quick start's own table."""
    fake_services(monkeypatch, [{"account": "a", "body": "{}"}], ["account", "body"])
    with pytest.raises(ConfigError, match=r"table 'payments' has no column 'id' \(its columns: account, body\)"):
        verify()
    with pytest.raises(ConfigError, match="no column 'src_offset'"):
        verify(id_columns=[("offset", "src_offset")])


def test_records_without_the_field_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_services(monkeypatch, [], ["order_id"])
    with pytest.raises(ConfigError, match=r"3 of the 3 records of topic 't' have no field 'order_id'.*fields seen"):
        verify(id_columns=[("order_id", "order_id")])


@pytest.mark.parametrize("spec", ["", "a=", "=b", "a=b c", "a=1x"])
def test_malformed_id_columns(spec: str) -> None:
    with pytest.raises(ConfigError, match="--id-column"):
        checker.parse_id_columns([spec])


def test_verify_refuses_an_empty_topic_instead_of_holding(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_services(monkeypatch, [], ["id"])
    monkeypatch.setattr(checker, "read_topic", lambda *_a, **_k: [])
    monkeypatch.setattr(cli, "_check_topic", lambda *_a: None)
    code = cli.main(["verify", "--bootstrap", "b:1", "--dsn", "postgresql://u@h/d", "--topic", "t", "--table", "x"])
    out, err = capsys.readouterr()
    assert code == 2 and "HELD" not in out and "holds no records to compare" in err and err.count("\n") == 1


def test_verify_without_a_sink_id_says_whose_prepared_transactions_it_counts() -> None:
    class Cur:
        def __enter__(self) -> Cur:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def execute(self, *_: object) -> None:
            return None

        def fetchall(self) -> list[tuple[str]]:
            return [("eos:other-sink:1:0:x",)]

    class Conn:
        def cursor(self) -> Cur:
            return Cur()

    [check] = checker.check_end_state(Conn(), sink_id=None, checkpoint=None)
    assert not check.ok and "any eos sink in this database (give --sink-id to count only yours)" in check.summary
