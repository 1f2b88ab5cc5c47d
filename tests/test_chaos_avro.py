"""chaos --records-file *.avro: each record goes to Kafka as the plain Avro binary from_avro decodes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest

from connectors.toolkit.chaos import read_records_file
from connectors.toolkit.chaos.avro import read_avro_records
from eos_core.errors import ConfigError

SCHEMA = {
    "type": "record",
    "name": "Reading",
    "namespace": "example",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "celsius", "type": ["null", "double"], "default": None},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
ROWS = [
    {"sensor": "s-1", "celsius": 21.5, "at_ms": 1_700_000_000_000},
    {"sensor": "s-2", "celsius": None, "at_ms": 1_700_000_001_000},
    {"sensor": "s-ü", "celsius": -3.25, "at_ms": 1_700_000_002_000},
]


def _file(tmp_path: Path, rows: list[dict], codec: str = "deflate") -> str:
    path = tmp_path / "events.avro"
    with open(path, "wb") as fh:
        fastavro.writer(fh, fastavro.parse_schema(SCHEMA), rows, codec=codec)
    return str(path)


def _decode(value: bytes) -> dict:
    return fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(SCHEMA), None)


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_each_record_is_its_plain_avro_encoding_with_the_files_schema(tmp_path: Path, codec: str) -> None:
    records = read_records_file(_file(tmp_path, ROWS, codec))
    assert [r.key for r in records] == [None, None, None]
    decoded = [_decode(r.value) for r in records]  # type: ignore[arg-type]
    assert [d["sensor"] for d in decoded] == ["s-1", "s-2", "s-ü"]
    assert [d["celsius"] for d in decoded] == [21.5, None, -3.25]
    # no container header, no schema-registry magic byte: the first byte is the string's zigzag length
    assert records[0].value[:1] == bytes([len(b"s-1") * 2])  # type: ignore[index]


def test_the_first_n_records_and_the_schema_a_job_hands_to_from_avro(tmp_path: Path) -> None:
    values, schema = read_avro_records(_file(tmp_path, ROWS), 2)
    assert len(values) == 2
    assert json.loads(schema)["name"] in ("Reading", "example.Reading")
    assert [f["name"] for f in json.loads(schema)["fields"]] == ["sensor", "celsius", "at_ms"]
    assert len(read_records_file(_file(tmp_path, ROWS), 2)) == 2


def test_a_file_that_is_not_avro_or_has_no_record_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.avro"
    bad.write_bytes(b"this is not avro\n")
    with pytest.raises(ConfigError, match=r"--records-file '.*bad\.avro': not an Avro container file"):
        read_records_file(str(bad))
    with pytest.raises(ConfigError, match=r"--records-file '.*events\.avro': no record in it"):
        read_records_file(_file(tmp_path, []))
