"""The reference-run oracle's comparisons (connectors.toolkit.oracle): each must fail on a wrong table."""

from __future__ import annotations

from decimal import Decimal

import pytest

from connectors.toolkit import oracle

REF = [
    {"w": "10:00", "sensor": "a", "n": 3, "total": 1.1, "written_at": 1},
    {"w": "10:00", "sensor": "b", "n": 1, "total": 2.2, "written_at": 2},
    {"w": "10:01", "sensor": "a", "n": 2, "total": 0.30000000000000004, "written_at": 3},
]


def test_upsert_equal_tables_pass_and_every_kind_of_difference_fails() -> None:
    same = oracle.compare(list(reversed(REF)), REF, mode="upsert", key=("w", "sensor"))
    assert same.ok, same
    missing = oracle.compare(REF[:2], REF, mode="upsert", key=("w", "sensor"))
    assert not missing.ok and missing.counts["missing"] == 1 and missing.ids["missing"] == [["10:01", "a"]]
    extra = oracle.compare([*REF, {**REF[0], "sensor": "z"}], REF, mode="upsert", key=("w", "sensor"))
    assert not extra.ok and extra.counts["extra"] == 1
    changed = oracle.compare([{**REF[0], "n": 4}, *REF[1:]], REF, mode="upsert", key=("w", "sensor"))
    assert not changed.ok and changed.counts["differ"] == 1 and "n=4" in changed.ids["differ"][0]
    dup = oracle.compare([*REF, REF[0]], REF, mode="upsert", key=("w", "sensor"))
    assert not dup.ok and dup.counts["duplicate_keys"] == 1


def test_append_is_a_multiset_comparison_a_duplicate_row_fails() -> None:
    assert oracle.compare(list(reversed(REF)), REF, mode="append").ok
    dup = oracle.compare([*REF, REF[1]], REF, mode="append")
    assert not dup.ok and dup.counts == {"missing": 0, "extra": 1}
    # same set, different multiplicities: a row twice in place of another row
    swapped = oracle.compare([REF[0], REF[0], REF[2]], REF, mode="append")
    assert not swapped.ok and swapped.counts == {"missing": 1, "extra": 1}


def test_float_tolerance_is_the_users_and_only_for_floats() -> None:
    near = [{**r, "total": r["total"] * (1 + 1e-12)} for r in REF]
    assert not oracle.compare(near, REF, mode="upsert", key=("w", "sensor")).ok  # exact by default
    assert oracle.compare(near, REF, mode="upsert", key=("w", "sensor"), tolerance=1e-9).ok
    assert oracle.compare(near, REF, mode="append", tolerance=1e-9).ok
    far = [{**REF[0], "total": 1.2}, *REF[1:]]
    assert not oracle.compare(far, REF, mode="append", tolerance=1e-9).ok
    assert not oracle.compare(far, REF, mode="upsert", key=("w", "sensor"), tolerance=1e-9).ok
    # an integer column is never loosened by the tolerance
    assert not oracle.compare([{**REF[0], "n": 4}, *REF[1:]], REF, mode="append", tolerance=0.5).ok
    dec = [{"k": 1, "v": Decimal("1.0000000001")}]
    assert oracle.compare(dec, [{"k": 1, "v": Decimal("1")}], mode="upsert", key=("k",), tolerance=1e-6).ok


def test_ignored_columns_may_differ_others_may_not() -> None:
    later = [{**r, "written_at": 99} for r in REF]
    assert not oracle.compare(later, REF, mode="append").ok
    assert oracle.compare(later, REF, mode="append", ignore=("written_at",)).ok
    assert oracle.compare(later, REF, mode="upsert", key=("w", "sensor"), ignore=("written_at",)).ok


def test_judge_says_cannot_judge_when_two_reference_runs_differ() -> None:
    other_ref = [{**REF[0], "written_at": 42}, *REF[1:]]
    report = oracle.judge(REF, [REF, other_ref], mode="upsert", key=("w", "sensor"))
    assert not report.ok and report.info["verdict"] == oracle.CANNOT_JUDGE
    assert report.get("oracle.reference_deterministic").summary.startswith("CANNOT JUDGE")
    assert "verdict: CANNOT JUDGE" in report.table()
    # the same runs with the differing column allowed to differ: judged, and the chaos run compared
    ok = oracle.judge(REF, [REF, other_ref], mode="upsert", key=("w", "sensor"), ignore=("written_at",))
    assert ok.ok and [c.name for c in ok.checks] == ["oracle.reference_deterministic", "oracle.table"]
    bad = oracle.judge(REF[:2], [REF, REF], mode="upsert", key=("w", "sensor"))
    assert not bad.ok and "verdict" not in bad.info and not bad.get("oracle.table").ok
    assert "EXACTLY-ONCE VIOLATED" in bad.table()
    empty = oracle.judge([], [[], []], mode="append")
    assert not empty.ok and empty.info["verdict"] == oracle.CANNOT_JUDGE


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"--oracle 'upsert'.*key columns"):
        oracle.parse_mode("upsert")
    with pytest.raises(ValueError, match="--oracle 'merge'"):
        oracle.parse_mode("merge")
    with pytest.raises(ValueError, match="takes no key"):
        oracle.parse_mode("append:id")
    assert oracle.parse_mode("upsert:w, sensor") == ("upsert", ("w", "sensor"))
    with pytest.raises(ValueError, match=r"key column\(s\) \['nope'\]"):
        oracle.compare(REF, REF, mode="upsert", key=("nope",))
    with pytest.raises(ValueError, match=r"different columns.*only in the run: \['x'\]"):
        oracle.compare([{**REF[0], "x": 1}], REF[:1], mode="append")
    with pytest.raises(ValueError, match="tolerance"):
        oracle.compare(REF, REF, mode="append", tolerance=-1)
