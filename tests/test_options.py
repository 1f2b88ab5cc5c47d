"""Option parsing: types, defaults, case-insensitive keys, errors naming option and value, and the
options classes derived from their specs (one declaration per option)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from eos_core.errors import ConfigError
from eos_core.options import (
    REQUIRED,
    Option,
    OptionSet,
    group,
    option,
    option_specs,
    parse_duration,
    reuse,
    spec_of,
)
from sinks.postgres.options import CONNECTION_OPTIONS, UPSERT_OPTIONS, ConnectionOptions, UpsertOptions
from sinks.postgres.twophase.options import TWOPC_OPTIONS
from sources.kafka.options import OPTIONS as KAFKA_OPTIONS


@dataclass(frozen=True, kw_only=True)
class Parsed:
    subscribe: tuple[str, ...] | None = option("subscribe", "list", description="topics")
    max_offsets_per_trigger: int | None = option("maxOffsetsPerTrigger", "int", min=1)
    fail_on_data_loss: bool = option("failOnDataLoss", "bool", True)
    max_trigger_delay: float = option("maxTriggerDelay", "duration", 900.0)
    assign: Any = option("assign", "json")
    mode: str = option("mode", "choice", "append", choices=("append", "upsert"))
    password: str | None = option("password", secret=True)
    table: str = option("table", default=REQUIRED, description="target table")
    passthrough: dict[str, str] = field(default_factory=dict)


SPECS = OptionSet("test-source", Parsed, passthrough=("kafka.",))


def test_parses_types_and_defaults_case_insensitively():
    p = SPECS.build(
        {
            "SUBSCRIBE": "a, b,,c",
            "maxoffsetspertrigger": "10",
            "failondataloss": "FALSE",
            "maxTriggerDelay": "2m",
            "assign": '{"t":[0]}',
            "Mode": "UPSERT",
            "table": "x",
            "kafka.security.protocol": "SSL",
        },
    )
    assert p.subscribe == ("a", "b", "c")
    assert p.max_offsets_per_trigger == 10
    assert p.fail_on_data_loss is False
    assert p.max_trigger_delay == 120.0
    assert p.assign == {"t": [0]}
    assert p.mode == "upsert"
    assert p.password is None
    assert p.passthrough == {"kafka.security.protocol": "SSL"}
    assert SPECS.build({"table": "x"}) == Parsed(table="x")  # the class's defaults are the specs'


def test_required_option_missing_names_it():
    with pytest.raises(ConfigError, match=r"option 'table' is required \(target table\)"):
        SPECS.parse({})


@pytest.mark.parametrize(
    ("raw", "pattern"),
    [
        ({"maxOffsetsPerTrigger": "ten"}, r"'maxOffsetsPerTrigger' has an invalid value 'ten'.*a whole number"),
        (
            {"maxOffsetsPerTrigger": "0"},
            r"'maxOffsetsPerTrigger' is '0', out of range; expected a whole number \(>= 1\)",
        ),
        ({"failOnDataLoss": "maybe"}, r"'failOnDataLoss'.*'maybe'.*true or false"),
        ({"maxTriggerDelay": "soon"}, r"'maxTriggerDelay'.*'soon'.*duration"),
        ({"assign": "{bad"}, r"'assign' has an invalid value '\{bad'"),
        ({"mode": "merge"}, r"'mode'.*'merge'.*one of append, upsert"),
    ],
)
def test_bad_values_name_option_value_and_valid_values(raw, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        SPECS.parse({"table": "t", **raw})
    assert info.value.option == next(iter(raw))


def test_unknown_option_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown option 'subscrib'; did you mean 'subscribe'\?"):
        SPECS.parse({"table": "t", "subscrib": "x"})


def test_same_option_twice_in_different_case_is_refused():
    with pytest.raises(ConfigError, match="given twice"):
        SPECS.parse({"table": "t", "mode": "append", "MODE": "upsert"})


@dataclass(frozen=True, kw_only=True)
class Secret:
    password: int | None = option("password", "int", secret=True)


def test_secret_values_never_appear_in_errors_or_repr():
    with pytest.raises(ConfigError) as info:
        OptionSet("s", Secret).build({"password": "hunter2"})
    assert "hunter2" not in str(info.value)
    assert "***" in str(info.value)
    assert "1234" not in repr(OptionSet("s", Secret).build({"password": "1234"}))


def test_ignored_keys_are_dropped():
    assert "path" not in SPECS.parse({"table": "t", "path": "/x"})


def _even(v: int) -> None:
    if v % 2:
        raise ValueError("must be even")


@dataclass(frozen=True, kw_only=True)
class Even:
    n: int | None = option("n", "int", check=_even)


def test_check_hook_rejects_with_its_reason():
    specs = OptionSet("s", Even)
    assert specs.build({"n": "2"}).n == 2
    with pytest.raises(ConfigError, match="must be even"):
        specs.build({"n": "3"})


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("10s", 10), ("5m", 300), ("1h", 3600), ("2", 2), ("1.5 minutes", 90)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_markdown_lists_every_option():
    table = SPECS.markdown()
    for name in ("subscribe", "maxOffsetsPerTrigger", "table"):
        assert f"`{name}`" in table
    assert "required" in table


# -- one declaration per option: the options classes are derived from their specs ----------------

ALL = {"kafka-eos": KAFKA_OPTIONS, "postgres-upsert": UPSERT_OPTIONS, "postgres-2pc": TWOPC_OPTIONS}


def _option_fields(cls: type, prefix: str = "") -> dict[str, tuple[dataclasses.Field, Option]]:
    """{path: (field, spec)} of every option field, groups walked."""
    out: dict[str, tuple[dataclasses.Field, Option]] = {}
    for f in dataclasses.fields(cls):
        sub = f.metadata.get("spark-eos options")
        if sub is not None:
            out.update(_option_fields(sub, f"{prefix}{f.name}."))
        elif "spark-eos option" in f.metadata:
            out[prefix + f.name] = (f, f.metadata["spark-eos option"])
    return out


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_spec_is_a_field_and_every_field_a_spec(name: str) -> None:
    options = ALL[name]
    fields = _option_fields(options.cls)
    assert [o.attr for o in options.options] == list(fields)  # the option set is the class's fields, in order
    assert [o.name for o in options.options] == [spec.name for _f, spec in fields.values()]
    plain = [f.name for f in dataclasses.fields(options.cls) if not f.metadata]
    assert plain == (["kafka"] if name == "kafka-eos" else [])  # only the kafka.* passthrough map is no option


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_fields_default_is_its_specs_default(name: str) -> None:
    for path, (f, spec) in _option_fields(ALL[name].cls).items():
        if spec.required:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, path
        else:
            assert f.default == spec.default and type(f.default) is type(spec.default), path
    if name == "kafka-eos":  # no required option: what an empty map parses to is the class's defaults
        assert ALL[name].build({}) == ALL[name].cls()


def test_a_spec_whose_default_disagrees_with_its_field_cannot_be_declared() -> None:
    with pytest.raises(TypeError, match=r"default '5' is not a value of kind int"):
        option("n", "int", "5")
    with pytest.raises(TypeError, match=r"default 10 is not a value of kind duration"):
        option("t", "duration", 10)  # a duration parses to float: 10.0
    with pytest.raises(TypeError, match=r"default 'merge' is not one of"):
        option("mode", "choice", "merge", choices=("append", "upsert"))

    @dataclass(frozen=True, kw_only=True)
    class WrongType:
        n: str = option("n", "int", 5)

    with pytest.raises(TypeError, match=r"WrongType.n: its type .* does not hold the values of option n"):
        OptionSet("s", WrongType)

    @dataclass(frozen=True, kw_only=True)
    class NoNone:
        n: int = option("n", "int")  # default None, but the field cannot hold None

    with pytest.raises(TypeError, match=r"NoNone.n: its type"):
        OptionSet("s", NoNone)


def test_a_field_without_a_spec_is_refused() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Stray:
        n: int | None = option("n", "int")
        m: int = 3  # an option whose spec was forgotten

    with pytest.raises(TypeError, match=r"Stray.m: a field of an options class is an option\(\)"):
        OptionSet("s", Stray)

    @dataclass
    class Mutable:
        n: int | None = option("n", "int")

    with pytest.raises(TypeError, match="frozen dataclass"):
        OptionSet("s", Mutable)


def _same_spec(a: Option, b: Option) -> bool:
    return (a.name, a.kind, a.choices, a.min, a.max, a.secret, a.check, a.convert) == (
        b.name,
        b.kind,
        b.choices,
        b.min,
        b.max,
        b.secret,
        b.check,
        b.convert,
    )


def test_postgres_2pc_reuses_the_upsert_specs_it_shares() -> None:
    upsert = {o.name: o for o in UPSERT_OPTIONS.options}
    twopc = {o.name: o for o in TWOPC_OPTIONS.options}
    shared = sorted(set(upsert) & set(twopc))
    assert set(upsert) <= set(twopc)  # every upsert option is a postgres-2pc option (its upsert mode)
    for name in shared:
        assert _same_spec(upsert[name], twopc[name]), name
        if name != "key":
            assert twopc[name].default == upsert[name].default, name
    assert upsert["key"].required and twopc["key"].default == ()  # append mode has no key
    assert twopc["version"].description == "upsert mode: " + upsert["version"].description


def test_one_list_of_connection_fields() -> None:
    names = [f.name for f in dataclasses.fields(ConnectionOptions)]
    assert [o.attr for o in CONNECTION_OPTIONS] == names
    for options in (UPSERT_OPTIONS, TWOPC_OPTIONS):
        conn = [o for o in options.options if o.attr.startswith("connection.")]
        assert [o.attr for o in conn] == [f"connection.{n}" for n in names]
        assert all(_same_spec(a, b) and a.default == b.default for a, b in zip(conn, CONNECTION_OPTIONS, strict=True))
    opts = UpsertOptions.from_options({"host": "h", "port": "6000", "table": "t", "key": "k"})
    assert opts.connection == ConnectionOptions(host="h", port=6000)


def _upper(value: str, context: str) -> str:
    return f"{context}:{value.upper()}"


@dataclass(frozen=True, kw_only=True)
class Inner:
    size: int = option("inner.size", "int", 3)
    label: str | None = option("inner.label", convert=_upper)

    def validate(self, context: str) -> None:
        if self.size > 10:
            raise ConfigError(f"{context}: inner.size above 10", option="inner.size")


@dataclass(frozen=True, kw_only=True)
class Outer:
    inner: Inner = group(Inner)
    size: int = reuse(Inner, "size", default=4)  # another option of the same spec: a name clash
    name: str = option("name", default=REQUIRED)


def test_groups_converters_and_validate() -> None:
    with pytest.raises(TypeError, match="duplicate option names"):
        OptionSet("o", Outer)  # inner.size is declared twice

    @dataclass(frozen=True, kw_only=True)
    class Outer2:
        inner: Inner = group(Inner)
        count: int = reuse(Inner, "size", name="count", default=4)
        name: str = option("name", default=REQUIRED)

    options = OptionSet("o", Outer2)
    assert [o.attr for o in options.options] == ["inner.size", "inner.label", "count", "name"]
    got = options.build({"name": "n", "inner.label": "x", "Count": "7"})
    assert got == Outer2(inner=Inner(size=3, label="o:X"), count=7, name="n")  # converted with the context
    assert options.build({"name": "n"}).inner.label is None  # no value: nothing to convert
    with pytest.raises(ConfigError, match=r"o: inner\.size above 10"):
        options.build({"name": "n", "inner.size": "11"})
    assert spec_of(Outer2, "count").name == "count" and option_specs(Inner)[0].attr == "size"
    with pytest.raises(TypeError, match="has no option field 'nope'"):
        spec_of(Inner, "nope")


# ---- the foreachBatch helpers take every option as a keyword ------------------------------------------


def _helpers() -> list[tuple[str, Any, Any, dict[str, Any]]]:
    """(name, helper, its option set, the options it needs) for twopc_batch, upsert_batch, kafka_batch."""
    from sinks.kafka.options import OPTIONS as KAFKA_SINK
    from sinks.kafka.spark import kafka_batch
    from sinks.postgres.adapters import twopc_batch, upsert_batch
    from sinks.postgres.options import UPSERT_OPTIONS
    from sinks.postgres.twophase.options import TWOPC_OPTIONS
    from sources.kafka.datasource import KafkaEosDataSource

    pg = {"dsn": "postgresql://u@h/d", "table": "t"}
    return [
        ("twopc_batch", twopc_batch, TWOPC_OPTIONS, {**pg, "sink_id": "s", "checkpoint_location": "/c"}),
        ("upsert_batch", upsert_batch, UPSERT_OPTIONS, {**pg, "key": "id"}),
        (
            "kafka_batch",
            lambda **kw: kafka_batch(KafkaEosDataSource, **kw),
            KAFKA_SINK,
            {"topic": "t", "sink_id": "s", "checkpoint_location": "/c", "kafka.bootstrap.servers": "b:1"},
        ),
    ]


@pytest.mark.parametrize("index", range(3))
def test_every_option_of_a_foreach_batch_helper_is_one_of_its_keywords(index: int) -> None:
    name, _, options, _ = _helpers()[index]
    keywords = options.keywords()
    for o in options.options:
        mine = [k for k, v in keywords.items() if v == o.name]
        assert mine and all(k.isidentifier() for k in mine), f"{name}: option {o.name} has no keyword"
        for k in mine:
            assert options.from_keywords({k: 1}) == {o.name: 1}
    assert options.from_keywords({"sink.id": 1, "kafka.acks": 2}) == {"sink.id": 1, "kafka.acks": 2}


def test_the_helpers_take_the_keywords_they_refused() -> None:
    # found on issue 43: twopc_batch(lock_timeout=...) and upsert_batch(delete_column=...) were refused
    (_, twopc, _, twopc_needs), (_, upsert, _, upsert_needs), (_, kafka, _, kafka_needs) = _helpers()
    assert twopc(**twopc_needs, lock_timeout="7s").__name__ == "twopc_batch[s]"
    assert upsert(**upsert_needs, delete_column="op").__name__ == "upsert_batch[t]"
    assert (
        kafka(**kafka_needs, errors_topic="dlq", errors_tolerance="all", kafka_producer_timeout_ms=30000).__name__
        == "kafka_batch[s]"
    )
    with pytest.raises(ConfigError, match="lock_timeot"):
        twopc(**twopc_needs, lock_timeot="7s")  # a misspelt keyword is still an unknown option
