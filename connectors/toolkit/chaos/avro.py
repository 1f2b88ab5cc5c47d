"""Sample records from an Avro container file, for ``spark-eos chaos --records-file events.avro``.

Each record of the file becomes one Kafka record whose value is that record encoded as plain Avro
binary with the file's writer schema: the bytes Spark's ``from_avro(col("value"), schema_json)``
decodes (no Confluent schema-registry header; a job that expects one adds it in its ``build``), with
no key. The file's schema is returned beside the records, so a job or a test can hand it to
``from_avro``.

Reading Avro needs ``fastavro`` (``pip install 'spark-eos[avro]'``); without it the error says so.
"""

from __future__ import annotations

import io
import json
from typing import Any

from eos_core.errors import ConfigError

__all__ = ["read_avro_records"]


def _fastavro(option: str, path: str) -> Any:
    try:
        import fastavro
    except ImportError as exc:
        raise ConfigError(
            f"{option} {path!r}: reading Avro needs fastavro; install it with pip install 'spark-eos[avro]'"
        ) from exc
    return fastavro


def read_avro_records(path: str, n: int | None = None, *, option: str = "--records-file") -> tuple[list[bytes], str]:
    """The first ``n`` records of the container file ``path`` (all when ``n`` is None), each encoded
    as plain Avro binary, and the file's writer schema as JSON text."""
    fastavro = _fastavro(option, path)
    try:
        with open(path, "rb") as fh:
            reader = fastavro.reader(fh)
            schema = reader.writer_schema
            rows = []
            for i, row in enumerate(reader):
                if n is not None and i >= n:
                    break
                rows.append(row)
    except OSError as exc:
        raise ConfigError(f"{option} {path!r}: cannot read it ({exc.strerror})") from exc
    except (ValueError, EOFError) as exc:  # fastavro's errors for a file that is not Avro
        raise ConfigError(f"{option} {path!r}: not an Avro container file ({exc})") from exc
    if not rows:
        raise ConfigError(f"{option} {path!r}: no record in it")
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        out.append(buf.getvalue())
    return out, json.dumps(schema)
