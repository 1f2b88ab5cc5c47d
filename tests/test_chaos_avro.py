"""chaos --records-file *.avro: each record goes to Kafka as the plain Avro binary from_avro decodes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

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


# ---- --value-format avro: registry-encoded records ------------------------------------------------------


def _records(seed: int, n: int) -> list[dict[str, Any]]:
    return [{"value": ROWS[i % len(ROWS)]} for i in range(n)]


def _given(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    schema = tmp_path / "reading.avsc"
    schema.write_text(json.dumps(SCHEMA))
    base: dict[str, Any] = dict(
        app="job:build",
        sink_kind="kafka",
        generator=_records,
        bootstrap="127.0.0.1:9",
        kafka_named="--bootstrap",
        workdir=str(tmp_path / "w"),
        faults="kill:1",
        value_format="avro",
        schema=str(schema),
        schema_registry="http://registry:8081",
    )
    return {**base, **kw}


class _NoServices:
    def kafka(self) -> Any:
        raise AssertionError("no service is asked for")

    def postgres(self) -> Any:
        raise AssertionError("no service is asked for")


def test_an_avro_run_takes_the_schema_and_the_registry_and_hands_the_job_the_registry(tmp_path: Path) -> None:
    from connectors.toolkit import app_runner
    from connectors.toolkit.chaos import RunState, prepare, runs

    cfg = prepare(_NoServices(), **_given(tmp_path))
    assert json.loads(cfg.schema or "") == SCHEMA and cfg.schema_registry == "http://registry:8081"
    assert cfg.codec is not None and cfg.codec.url == "http://registry:8081"
    state = RunState(bootstrap=cfg.bootstrap, topic="src", table="t", records=3)
    argv = runs.runner_argv(cfg, state, "t", str(tmp_path / "ck"), "available-now")
    assert not any("registry" in a for a in argv)  # off the command line, where a user:password@ would show
    env = pytest.MonkeyPatch()
    try:
        env.setenv("EOS_SCHEMA_REGISTRY_URL", cfg.schema_registry or "")  # how the run hands it to the job
        args = app_runner.build_parser().parse_args(argv[argv.index("--app") :])
    finally:
        env.undo()
    job = app_runner.Job("b", "src", "", "t", schema_registry=args.schema_registry)
    assert job.registry_options == {"schema.registry.url": "http://registry:8081"}
    from connectors.toolkit.chaos.experiment import reproduce_command

    again = reproduce_command(cfg, None)
    assert f"--value-format avro --schema {cfg.schema_file}" in again and "registry" not in again
    assert app_runner.Job("b", "src", "", "t").registry_options == {}  # a JSON run: none
    # the registry from EOS_SCHEMA_REGISTRY_URL when not given (what services up --with-registry sets)
    os_env = pytest.MonkeyPatch()
    try:
        os_env.setenv("EOS_SCHEMA_REGISTRY_URL", "http://env:8081")
        assert prepare(_NoServices(), **_given(tmp_path, schema_registry=None)).schema_registry == "http://env:8081"
    finally:
        os_env.undo()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"app": None, "pipeline": "2pc", "sink_kind": "2pc", "generator": None}, r"--value-format avro needs --app"),
        ({"schema": None}, r"needs --schema FILE"),
        ({"schema_registry": None}, r"needs a Schema Registry: --schema-registry URL, or EOS_SCHEMA_REGISTRY_URL"),
        ({"generator": None}, r"give --generator or --records-file"),
        ({"generator": None, "records_file": "AVRO"}, r"holds plain Avro .* give a \*.jsonl file"),
        ({"value_format": "json"}, r"--schema goes with --value-format avro"),
        ({"value_format": "protobuf"}, r"--value-format 'protobuf': json \(the default\) or avro"),
    ],
)
def test_an_avro_run_is_refused_naming_what_is_missing(
    tmp_path: Path, change: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from connectors.toolkit.chaos import prepare

    monkeypatch.delenv("EOS_SCHEMA_REGISTRY_URL", raising=False)
    if change.get("records_file") == "AVRO":
        change = {**change, "records_file": str(tmp_path / "x.avro")}
        (tmp_path / "x.avro").write_bytes(b"")
    with pytest.raises(ConfigError, match=message):
        prepare(_NoServices(), **_given(tmp_path, **change))


def test_a_schema_file_that_is_no_avro_record_is_refused(tmp_path: Path) -> None:
    from connectors.toolkit.chaos.avro import read_schema_file

    for text, message in (
        ('"string"', "record schema expected"),
        ("{", "not an Avro schema"),
        ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}', "not an Avro schema"),
    ):
        (tmp_path / "s.avsc").write_text(text)
        with pytest.raises(ConfigError, match=message):
            read_schema_file(str(tmp_path / "s.avsc"))


def test_the_checker_reads_wire_format_values_with_the_decoder_and_everything_else_as_before() -> None:
    from confluent_kafka.serialization import SerializationError

    from connectors.toolkit.checker import decode_value

    seen: list[tuple[str, bytes]] = []

    def decode(topic: str, value: bytes) -> Any:
        seen.append((topic, value))
        if value.endswith(b"bad"):
            raise SerializationError("the body does not decode")
        if value.endswith(b"down"):
            raise ConnectionError("the registry is down")
        return {"id": "a"}

    assert decode_value(decode, "t", b"\x00\x00\x00\x00\x01body") == {"id": "a"}
    assert decode_value(decode, "t", b'{"id": "j"}') == b'{"id": "j"}'  # JSON: not the wire format, not asked
    assert decode_value(decode, "t", b"\x00\x00\x00\x00\x01bad") == b"\x00\x00\x00\x00\x01bad"  # poison: its bytes
    with pytest.raises(ConnectionError):  # a registry that fails is never taken for a poison record
        decode_value(decode, "t", b"\x00\x00\x00\x00\x01down")
    assert [v for _, v in seen][:2] == [b"\x00\x00\x00\x00\x01body", b"\x00\x00\x00\x00\x01bad"]


def test_the_codec_writes_what_confluents_serializer_writes_and_names_a_record_the_schema_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from connectors.toolkit.chaos.avro import RegistryCodec

    registered: list[str] = []

    class Registry:  # what AvroSerializer asks of confluent-kafka's client, answered here
        config: dict[str, Any] = {}

        def register_schema_full_response(self, subject: str, schema: Any, normalize_schemas: bool = False) -> Any:
            registered.append(subject)
            return SimpleNamespace(schema_id=9, guid=None, schema=schema)

        def lookup_schema(self, *a: Any, **k: Any) -> Any:
            raise AssertionError("auto.register: no look-up")

    codec = RegistryCodec("http://registry:8081", json.dumps(SCHEMA))
    monkeypatch.setattr(codec, "_client", Registry())
    out = codec.encode("orders", json.dumps(ROWS[0]).encode(), "record 0")
    assert out is not None and out[:5] == b"\x00\x00\x00\x00\x09"
    read = fastavro.schemaless_reader(
        io.BytesIO(out[5:]), fastavro.parse_schema(SCHEMA), None, return_record_name=False
    )
    assert {**read, "at_ms": int(read["at_ms"].timestamp() * 1000)} == ROWS[0]  # timestamp-millis reads as a datetime
    assert registered == ["orders-value"]  # TopicNameStrategy
    assert codec.encode("orders", None, "record 1") is None  # a tombstone stays one
    with pytest.raises(ConfigError, match=r"record 2: not written with --schema"):
        codec.encode("orders", b'{"sensor": 5}', "record 2")


def test_a_record_the_schema_does_not_fit_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from connectors.toolkit.chaos import Record
    from connectors.toolkit.chaos.avro import check_records

    fits = Record(key=None, value=json.dumps(ROWS[0]).encode())
    check_records([fits, Record(key=None, value=None)], json.dumps(SCHEMA), "--generator")
    bad = Record(key=None, value=json.dumps({**ROWS[0], "sensor": 5}).encode())
    with pytest.raises(ConfigError, match=r"--generator, record 1: its value does not fit --schema"):
        check_records([fits, bad], json.dumps(SCHEMA), "--generator")


def test_the_registrys_password_stays_out_of_the_codecs_errors() -> None:
    from connectors.toolkit.chaos.avro import RegistryCodec

    with pytest.raises(ConfigError) as err:
        RegistryCodec("http://user:s3cret@127.0.0.1:1", json.dumps(SCHEMA)).register("t")
    assert "s3cret" not in str(err.value) and "could not be reached" in str(err.value), err.value
