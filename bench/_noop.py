"""A Python data source whose writers only read their Arrow batches: what PySpark costs any Python sink
(the floor of the sink benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["noop_source"]


def noop_source(name: str = "bench-noop") -> Any:
    """Format ``name``: batch and stream writers read their Arrow batches and return their row count;
    commit() does nothing."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    @dataclass
    class Counted(WriterCommitMessage):
        rows: int

    class Writer(DataSourceArrowWriter):
        def write(self, iterator: Any) -> Any:
            return Counted(sum(b.num_rows for b in iterator))

    class StreamWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Any) -> Any:
            return Counted(sum(b.num_rows for b in iterator))

        def commit(self, messages: Any, batchId: int) -> None:
            pass

        def abort(self, messages: Any, batchId: int) -> None:
            pass

    class Noop(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return Writer()

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return StreamWriter()

    return Noop
