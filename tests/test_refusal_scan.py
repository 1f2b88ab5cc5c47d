"""The value screen's NUL scan reads the string data buffer first (issue 29: ``match_substring`` over
every text value was ~40 % of a visibility=partition task's Python CPU); it must still find every NUL
in the rows it is given, in sliced and large strings, and none outside them."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sinks.postgres.refusal import _may_hold_nul, unstorable
from sinks.postgres.types import Column

COLS = [Column("k", "k", "text", "string", target_type="text")]


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()])
def test_the_scan_sees_only_the_rows_of_the_slice(type_: pa.DataType) -> None:
    arr = pa.array(["a\x00", "b", None, "c", "\x00d"], type_)
    assert _may_hold_nul(arr)
    assert not _may_hold_nul(arr.slice(1, 3))  # "b", None, "c"
    assert _may_hold_nul(arr.slice(3))  # "c", "\x00d"
    assert not _may_hold_nul(arr.slice(0, 0))
    assert not _may_hold_nul(pa.array([None, None], type_))


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()])
def test_unstorable_still_names_each_nul_row(type_: pa.DataType) -> None:
    batch = pa.RecordBatch.from_arrays([pa.array(["ok", "x\x00", None, "y", "\x00"], type_)], names=["k"])
    assert [(u.row, u.column) for u in unstorable(batch, COLS)] == [(1, "k"), (4, "k")]
    assert [u.row for u in unstorable(batch.slice(2), COLS)] == [2]
    assert unstorable(batch.slice(2, 2), COLS) == []
