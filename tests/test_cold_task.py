"""A sink task's first batches must not pay for imports it does not need (issue 29, the first write).

pyarrow imports pandas (0.2-1 s in a cold Python worker) for ``to_numpy``, ``fill_null`` with a
Python value and ``pa.array`` of numpy or Python values; the task path (the value screen, the
ordinals, the key tracker) reads Arrow buffers instead.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa

from sinks.postgres.merge import KeyTracker
from sinks.postgres.refusal import _numbers
from sinks.postgres.staging import ordinals

ROOT = Path(__file__).resolve().parents[1]

TASK = textwrap.dedent(
    """
    import datetime as dt, json, sys
    import pyarrow as pa
    from sinks.postgres.merge import KeyTracker, MergePlan
    from sinks.postgres.options import TableName
    from sinks.postgres.refusal import Screen
    from sinks.postgres.staging import prepared_rows
    from sinks.postgres.twophase.writer import _with_ordinals
    from sinks.postgres.types import Column

    # the batches arrive as Arrow IPC, as Spark hands them to a Python worker
    buf = open(sys.argv[1], "rb").read()
    batches = list(pa.ipc.open_stream(buf))
    loaded = "pandas" in sys.modules
    cols = [Column("id", "id", "bigint", "bigint", target_type="bigint"),
            Column("k", "k", "text", "string", target_type="varchar(10)"),
            Column("ts", "ts", "timestamptz", "timestamp", target_type="timestamp(3) with time zone"),
            Column("d", "d", "date", "date", target_type="date"),
            Column("n", "n", "double precision", "double", target_type="numeric(10,2)")]
    screen = Screen(cols, where="x", version="n", on_found="refuse")
    seen = sum(b.num_rows for b in screen(batches))
    plan = MergePlan(TableName(None, "t"), tuple(cols), ("id",), "n")
    class Opts:
        delete_column = None
        delete_tombstones = False
    keys = KeyTracker(("id",))
    staged = sum(b.num_rows for b in prepared_rows(batches, plan, Opts(), keys))
    appended = sum(b.num_rows for b in _with_ordinals(batches, ["id", "k"]))
    print(json.dumps({"before": loaded, "after": "pandas" in sys.modules, "rows": [seen, staged, appended],
                      "unique": keys.unique}))
    """
)


def _ipc(tmp_path: Path) -> Path:
    n = 1000
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(n), pa.int64()),
            "k": [f"k{i}" for i in range(n)],
            "ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
            "d": pa.array([dt.date(2024, 1, 1)] * n, pa.date32()),
            "n": pa.array([1.25] * n, pa.float64()),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch.slice(0, 0))
    path = tmp_path / "batches.arrow"
    path.write_bytes(sink.getvalue().to_pybytes())
    return path


def test_a_task_path_without_nulls_never_imports_pandas(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", TASK, str(_ipc(tmp_path))],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"before": False, "after": False, "rows": [1000, 1000, 1000], "unique": True}


def test_numbers_reads_sliced_arrays_and_nulls_as_zero() -> None:
    ints = pa.array([5, 6, 7, 8], pa.int64()).slice(1, 2)
    assert _numbers(ints).tolist() == [6, 7]
    floats = pa.array([1.5, None, 2.5], pa.float32()).slice(1)
    assert _numbers(floats).tolist() == [0.0, 2.5]
    ts = pa.array([dt.datetime(1970, 1, 1, 0, 0, 1)] * 3, pa.timestamp("us")).slice(2)
    assert _numbers(ts.view(pa.int64())).tolist() == [1_000_000]


def test_ordinals_and_key_tracker_on_sliced_keys() -> None:
    assert ordinals(7, 3).to_pylist() == [7, 8, 9]
    assert ordinals(0, 0).to_pylist() == []
    keys = KeyTracker(("id",))
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2, 3, 1], pa.int32())], names=["id"])
    keys.see(batch.slice(0, 3))
    assert keys.unique
    keys.see(batch.slice(3, 1))  # the 1 again, read at an offset
    assert not keys.unique
    assert np.array_equal(keys._codes(batch.slice(1, 2)), np.array([2, 3]))
