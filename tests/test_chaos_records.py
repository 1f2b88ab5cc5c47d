"""The user's records for a chaos run (connectors.toolkit.chaos): generator tuples and dicts, files of
sample records, timestamps, partitions, several topics; each bad record refused naming where it is."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest

from connectors.toolkit import app_runner, chaos
from eos_core.errors import ConfigError


def test_tuples_and_dicts_become_records_with_timestamps_headers_partitions_and_topics() -> None:
    r = chaos.to_record(("s1", {"t": 1.5}), "here")
    assert r == chaos.Record(key=b"s1", value=b'{"t": 1.5}')
    r = chaos.to_record((b"k", "v", [("h", "x")], 1, 1_700_000_000_000), "here")
    assert (r.key, r.value, r.headers, r.partition, r.timestamp) == (b"k", b"v", (("h", b"x"),), 1, 1_700_000_000_000)
    when = dt.datetime(2026, 11, 25, 10, 0, 3, tzinfo=dt.timezone.utc)
    r = chaos.to_record(
        {"key": None, "value": b"raw", "timestamp": when, "topic": "payments", "headers": {"a": b"1"}}, "h"
    )
    assert r.timestamp == int(when.timestamp() * 1000) and r.topic == "payments" and r.key is None
    assert r.headers == (("a", b"1"),)


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ({"key": "k", "vale": 1}, r"unknown field\(s\) \['vale'\]"),
        (("only-one",), "is not a record"),
        ("k,v", "str is not a record"),
        (("k", object()), "value: object is not bytes"),
        (("k", "v", (), -1), "partition -1 is not an int >= 0"),
        (("k", "v", (), None, 1.5), r"timestamp: 1.5 is not a timestamp"),
        (("k", "v", (), None, dt.datetime(2026, 1, 1)), "naive datetime"),
        ({"value": "v", "topic": "a b"}, "topic 'a b'"),
        (("k", "v", [("h",)]), "is not a \\(name, value\\) pair"),
    ],
)
def test_a_bad_record_is_refused_naming_where_it_is(item: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as exc:
        chaos.to_record(item, "--generator myjob:records, record 7")
    assert str(exc.value).startswith("--generator myjob:records, record 7: ")


def test_a_generator_by_name_or_by_function_is_seeded_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gen_job_x.py").write_text(
        "def records(seed, n):\n    return [(f'k{seed}', {'i': i}, (), None, 1000 + i) for i in range(n)]\n"
        "def broken(seed, n):\n    yield ('k', 'v')\n    yield 42\n"
        "def empty(seed, n):\n    return []\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    recs = chaos.generate_records("gen_job_x:records", 3, 4)
    assert [r.value for r in recs] == [b'{"i": 0}', b'{"i": 1}', b'{"i": 2}', b'{"i": 3}']
    assert {r.key for r in recs} == {b"k3"} and [r.timestamp for r in recs] == [1000, 1001, 1002, 1003]
    assert chaos.generate_records(lambda seed, n: [("a", "b")] * n, 1, 2) == [chaos.Record(b"a", b"b")] * 2
    with pytest.raises(ConfigError, match="gen_job_x:broken, record 1: int is not a record"):
        chaos.generate_records("gen_job_x:broken", 1, 2)
    with pytest.raises(ConfigError, match="gave no record"):
        chaos.generate_records("gen_job_x:empty", 1, 2)
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        chaos.generate_records("gen_job_x:nope", 1, 2)


def test_files_of_sample_records_json_lines_and_raw_lines(tmp_path: Path) -> None:
    jl = tmp_path / "sample.jsonl"
    jl.write_text(
        json.dumps({"key": "s1", "value": {"temp": 21.5}, "timestamp": 5})
        + "\n\n"
        + json.dumps({"value": "x", "topic": "other", "headers": {"h": "1"}})
        + "\n"
    )
    recs = chaos.read_records_file(str(jl))
    assert recs == [
        chaos.Record(b"s1", b'{"temp": 21.5}', timestamp=5),
        chaos.Record(None, b"x", headers=(("h", b"1"),), topic="other"),
    ]
    assert len(chaos.read_records_file(str(jl), 1)) == 1
    raw = tmp_path / "sample.txt"
    raw.write_bytes(b"a|1\nb|2\n")
    assert [r.value for r in chaos.read_records_file(str(raw))] == [b"a|1", b"b|2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"value": 1}\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"--records-file '.*bad.jsonl', line 2: a JSON object"):
        chaos.read_records_file(str(bad))
    bad.write_text("{not json\n")
    with pytest.raises(ConfigError, match="line 1: not JSON"):
        chaos.read_records_file(str(bad))
    with pytest.raises(ConfigError, match="cannot read it"):
        chaos.read_records_file(str(tmp_path / "none.jsonl"))


def test_several_topics_reach_the_job_and_partitions_are_checked_before_anything_runs(tmp_path: Path) -> None:
    recs = [chaos.Record(b"k", b"v"), chaos.Record(None, b"p", topic="payments")]
    topics = chaos.topics_of(recs, "chaos_app_1_2")
    assert topics == {"": "chaos_app_1_2", "payments": "chaos_app_1_2_payments"}
    cfg = chaos.ChaosConfig(
        pipeline="app",
        kills=1,
        seed=1,
        records=10,
        bootstrap="b:1",
        dsn="postgresql://h/d",
        workdir=str(tmp_path),
        app="j:build",
    )
    state = chaos.RunState(bootstrap="b:1", topic="chaos_app_1_2", table="t", records=10, topics=topics)
    argv = chaos.runs.runner_argv(cfg, state, "t", "/c", "available-now")
    assert argv[argv.index("--topics") + 1] == "payments=chaos_app_1_2_payments"
    job = app_runner.Job("b:1", "chaos_app_1_2", "d", "t", topics={"payments": "chaos_app_1_2_payments"})
    assert job.topic_named("payments") == "chaos_app_1_2_payments" and job.topic_named("") == "chaos_app_1_2"
    with pytest.raises(KeyError, match="no topic named 'refunds'"):
        job.topic_named("refunds")
    with pytest.raises(ConfigError, match=r"partition 5, but the run's topics have 2 \(--partitions 2\)"):
        chaos.workload.load(dataclasses.replace(cfg, generator=lambda seed, n: [("k", "v", (), 5)]))
    loaded = chaos.workload.load(dataclasses.replace(cfg, generator=lambda seed, n: [("k", "v")] * 3))
    assert loaded is not None and len(loaded) == 3
