"""Reading what a checkpoint planned: lineage digests, file-source batches, locations in messages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eos_core.checkpoint import batch_lineage, display, last_planned, query_id
from eos_core.errors import FatalError


def _offsets(ck: Path, batch: int, *sources: str, stamp: int = 0) -> None:
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": stamp})
    (ck / "offsets" / str(batch)).write_text("v1\n" + meta + "\n" + "\n".join(sources) + "\n")


def _files(ck: Path, name: str, batch_files: dict[int, list[str]]) -> None:
    d = ck / "sources" / "0"
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"path": f, "timestamp": 1, "batchId": b}) for b, fs in batch_files.items() for f in fs]
    (d / name).write_text("v1\n" + "\n".join(lines) + "\n")


def test_lineage_is_the_source_offsets_not_the_batch_metadata(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _offsets(a, 3, '{"t":{"1":5,"0":7}}', stamp=1)
    _offsets(b, 3, '{"t":{"0":7,"1":5}}', stamp=2)  # re-planned later, same offsets, keys reordered
    assert batch_lineage(str(a), 3).digest == batch_lineage(f"file://{b}", 3).digest
    _offsets(b, 3, '{"t":{"0":8,"1":5}}')
    assert batch_lineage(str(a), 3).digest != batch_lineage(str(b), 3).digest
    assert last_planned(str(a)) == 3 and last_planned(str(tmp_path / "none")) is None
    with pytest.raises(FatalError, match="no offsets/4"):
        batch_lineage(str(a), 4)


def test_file_source_batches_are_told_apart_by_their_files_also_when_compacted(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for ck in (a, b, c):
        _offsets(ck, 2, '{"logOffset":2}')
    _files(a, "2", {2: ["file:/in/p2.json"]})
    _files(b, "2", {2: ["file:/in/p2.json", "file:/in/p3.json"]})  # the same batch number, planned anew
    _files(c, "9.compact", {1: ["file:/in/p1.json"], 2: ["file:/in/p2.json"]})  # compacted log
    la, lb, lc = (batch_lineage(str(x), 2).digest for x in (a, b, c))
    assert la != lb and la == lc


def test_locations_in_messages_carry_no_credentials() -> None:
    assert display("s3a://AKIA:secret@bucket/ck?sig=abc") == "s3a://bucket/ck"
    assert display("abfss://c@acct.dfs.core.windows.net/ck?sv=1&sig=x") == "abfss://acct.dfs.core.windows.net/ck"
    assert display("/local/ck") == "/local/ck" and display(None) is None


def test_query_id_and_dbfs_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "metadata").write_text('{"id":"q-7"}\n')
    assert query_id(str(tmp_path)) == "q-7"
    seen = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: seen.append(p) or real(tmp_path))
    last_planned("dbfs:/ckpt/q")
    assert seen == ["/dbfs/ckpt/q/offsets"]
