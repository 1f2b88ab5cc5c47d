"""The checker catches each kind of exactly-once violation, and passes a clean run."""

import json
import os
import pickle
import signal

import pytest

from connectors.toolkit import checker
from connectors.toolkit.checker import Check, Report, compare_aggregates, compare_records
from eos_core import faults


def _src(n=10):
    return [{"id": f"r{i}", "key": f"k{i % 3}", "amount": i * 10} for i in range(n)]


def _by(checks):
    return {c.name.split(".", 1)[1]: c for c in checks}


def test_clean_run_passes():
    src = _src()
    checks = _by(compare_records(src, [dict(r) for r in src]))
    assert all(c.ok for c in checks.values())
    assert checks["duplicates"].counts["sink"] == 10


def test_duplicates_reported_with_ids_and_counts():
    src = _src()
    sink = [*src, src[3], src[3], src[7]]
    checks = _by(compare_records(src, sink))
    assert not checks["duplicates"].ok
    assert checks["duplicates"].counts["duplicates"] == 3
    assert checks["duplicates"].counts["ids"] == 2
    assert checks["duplicates"].ids["duplicates"] == ["r3", "r7"]
    assert checks["losses"].ok and checks["phantoms"].ok and checks["payload"].ok


def test_losses_reported():
    src = _src()
    checks = _by(compare_records(src, src[:7]))
    assert not checks["losses"].ok
    assert checks["losses"].counts["losses"] == 3
    assert checks["losses"].ids["losses"] == ["r7", "r8", "r9"]
    assert checks["duplicates"].ok and checks["phantoms"].ok


def test_phantoms_reported():
    src = _src()
    checks = _by(compare_records(src, [*src, {"id": "zz", "key": "k0", "amount": 1}]))
    assert not checks["phantoms"].ok
    assert checks["phantoms"].ids["phantoms"] == ["zz"]
    assert checks["losses"].ok and checks["duplicates"].ok


def test_payload_mismatch_reported_and_numeric_types_normalised():
    from decimal import Decimal

    src = _src()
    sink = [dict(r, amount=Decimal(r["amount"]) if r["id"] != "r5" else 999) for r in src]
    sink[0]["amount"] = 0.0  # float vs int: equal
    checks = _by(compare_records(src, sink))
    assert not checks["payload"].ok
    assert checks["payload"].ids["payload"] == ["r5"]
    assert "sink=999" in checks["payload"].summary
    assert checks["losses"].ok and checks["duplicates"].ok


def test_payload_fields_restrict_the_comparison():
    src = _src()
    sink = [dict(r, key="other") for r in src]
    assert not _by(compare_records(src, sink))["payload"].ok
    assert _by(compare_records(src, sink, payload_fields=["amount"]))["payload"].ok


def test_repeated_source_ids_void_the_run():
    src = [*_src(), _src()[0]]
    checks = _by(compare_records(src, src))
    assert not checks["losses"].ok
    assert checks["losses"].counts["source_duplicates"] == 1


def test_aggregates_catch_double_applied_and_missing_keys():
    src = _src(9)  # k0: 0+30+60, k1: 10+40+70, k2: 20+50+80
    good = [
        {"key": "k0", "total": 90, "events": 3},
        {"key": "k1", "total": 120, "events": 3},
        {"key": "k2", "total": 150, "events": 3},
    ]
    (ok,) = compare_aggregates(src, good)
    assert ok.ok and ok.counts["keys"] == 3
    replayed = [dict(good[0], total=180, events=6), *good[1:]]
    (bad,) = compare_aggregates(src, replayed)
    assert not bad.ok and bad.ids["wrong"] == ["k0"]
    (missing,) = compare_aggregates(src, [*good[:2], {"key": "k9", "total": 1, "events": 1}])
    assert not missing.ok and missing.ids["missing"] == ["k2"] and missing.ids["phantom"] == ["k9"]


class _Cursor:
    def __init__(self, db):
        self.db, self.result = db, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql, params=()):
        if "pg_prepared_xacts" in sql:
            self.result = [(g,) for g in self.db["prepared"] if g.startswith(params[0])]
        elif "to_regclass" in sql:
            self.result = [(True,)]
        elif "sink_batches" in sql:
            self.result = [(self.db["decided"].get(params[0]),)]

    def fetchall(self):
        return self.result

    def fetchone(self):
        return self.result[0] if self.result else None


class _Conn:
    def __init__(self, **db):
        self.db = db

    def cursor(self):
        return _Cursor(self.db)


def _checkpoint(tmp_path, commits):
    os.makedirs(tmp_path / "commits")
    os.makedirs(tmp_path / "offsets")
    for n in commits:
        (tmp_path / "commits" / str(n)).write_text("v1\n{}")
        (tmp_path / "offsets" / str(n)).write_text("v1\n{}")
    (tmp_path / "commits" / ".3.crc").write_text("")
    return str(tmp_path)


def test_end_state_clean(tmp_path):
    cp = _checkpoint(tmp_path, [0, 1, 2])
    conn = _Conn(prepared=["eos:other:1:0:x:0"], decided={"s1": 2})
    checks = {c.name: c for c in checker.check_end_state(conn, sink_id="s1", checkpoint=cp)}
    assert checks["end.prepared"].ok
    assert checks["end.decision_vs_commit"].ok


def test_end_state_catches_leftover_prepared_and_decision_mismatch(tmp_path):
    cp = _checkpoint(tmp_path, [0, 1, 2])
    conn = _Conn(prepared=["eos:s1:3:0:abc:0", "eos:s10:1:0:x:0"], decided={"s1": 3})
    checks = {c.name: c for c in checker.check_end_state(conn, sink_id="s1", checkpoint=cp)}
    assert not checks["end.prepared"].ok
    assert checks["end.prepared"].ids["prepared"] == ["eos:s1:3:0:abc:0"]  # s10 is another sink
    assert not checks["end.decision_vs_commit"].ok
    assert "decided batch 3" in checks["end.decision_vs_commit"].summary


def test_end_state_without_any_commit_fails(tmp_path):
    conn = _Conn(prepared=[], decided={})
    checks = {c.name: c for c in checker.check_end_state(conn, sink_id="s1", checkpoint=str(tmp_path))}
    assert not checks["end.decision_vs_commit"].ok


def test_upsert_end_state_checks_only_prepared(tmp_path):
    checks = checker.check_end_state(_Conn(prepared=[], decided={}), sink_id=None, checkpoint=None, decisions=False)
    assert [c.name for c in checks] == ["end.prepared"] and checks[0].ok


def test_non_vacuity_needs_a_firing(tmp_path, monkeypatch):
    log = str(tmp_path / "fired.jsonl")
    (none,) = checker.check_faults(log, expect=["sink.after_prepare"])
    assert not none.ok
    monkeypatch.setenv(faults.ENV_LOG, log)
    monkeypatch.setenv(faults.ENV_STATE, str(tmp_path / "state"))
    with pytest.raises(faults.FaultInjected):
        faults.point("sink.after_prepare", spec="sink.after_prepare:once", batch=1)
    (one,) = checker.check_faults(log, expect=["sink.after_prepare"])
    assert one.ok and one.counts["fired"] == 1
    (other,) = checker.check_faults(log, expect=["sink.after_commit"])
    assert not other.ok


def test_exit_check():
    assert checker.check_exit(-signal.SIGKILL, expect_signal=signal.SIGKILL)[0].ok
    assert not checker.check_exit(0, expect_signal=signal.SIGKILL)[0].ok
    assert checker.check_exit(17, expect_code=17)[0].ok
    assert not checker.check_exit(0)[0].ok


def test_last_commit_ignores_crc_and_temp_files(tmp_path):
    cp = _checkpoint(tmp_path, [0, 1, 5])
    (tmp_path / "commits" / ".6.tmp").write_text("")
    assert checker.last_commit(cp) == 5
    assert checker.last_offsets(cp) == 5
    assert checker.last_commit(str(tmp_path / "nope")) is None


def test_report_ok_table_json_and_pickle():
    src = _src()
    report = Report(info={"kills": 3}).add(*compare_records(src, [*src[1:], src[2]]))
    assert not report.ok
    table = report.table()
    assert "records.duplicates  FAIL" in table and "records.losses      FAIL" in table
    assert "records.losses.losses: r0" in table
    assert "EXACTLY-ONCE VIOLATED" in table
    data = json.loads(report.to_json())
    assert data["ok"] is False
    assert {c["name"]: c["ok"] for c in data["checks"]}["records.phantoms"] is True
    assert pickle.loads(pickle.dumps(report)).to_dict() == report.to_dict()
    assert Report().ok is False  # an empty report proves nothing
    assert Report().add(Check("x", True, "fine")).ok


def test_many_ids_are_sampled_but_counted():
    src = [{"id": i} for i in range(100)]
    checks = _by(compare_records(src, []))
    assert checks["losses"].counts["losses"] == 100
    assert len(checks["losses"].ids["losses"]) == checker.SHOW_IDS
    assert "(+80 more)" in Report().add(*compare_records(src, [])).table()


def test_integration_reexport():
    from integration import checker as ic

    assert ic.compare_records is compare_records and ic.Report is Report


def test_committed_through_counts_batch_0_as_committed(tmp_path) -> None:
    from connectors.toolkit.checker import committed_through

    assert committed_through(str(tmp_path)) == -1
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}")
    assert committed_through(str(tmp_path)) == 0  # `last_commit(...) or -1` said -1 here
