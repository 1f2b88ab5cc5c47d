"""Option parsing: types, defaults, case-insensitive keys, and errors naming option and value."""

from dataclasses import dataclass

import pytest

from connectors.core.errors import ConfigError
from connectors.core.options import REQUIRED, Option, OptionSet, parse_duration

SPECS = OptionSet(
    "test-source",
    [
        Option("subscribe", "list", description="topics"),
        Option("maxOffsetsPerTrigger", "int", min=1),
        Option("failOnDataLoss", "bool", True),
        Option("maxTriggerDelay", "duration", 900.0),
        Option("assign", "json"),
        Option("mode", "choice", "append", choices=("append", "upsert")),
        Option("password", secret=True),
        Option("table", default=REQUIRED, description="target table"),
    ],
    passthrough=("kafka.",),
)


@dataclass(frozen=True)
class Parsed:
    subscribe: tuple
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    max_trigger_delay: float
    assign: object
    mode: str
    password: str | None
    table: str
    passthrough: dict


def test_parses_types_and_defaults_case_insensitively():
    p = SPECS.parse_into(
        Parsed,
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


def test_secret_values_never_appear_in_errors():
    specs = OptionSet("s", [Option("password", "int", secret=True)])
    with pytest.raises(ConfigError) as info:
        specs.parse({"password": "hunter2"})
    assert "hunter2" not in str(info.value)
    assert "***" in str(info.value)


def test_ignored_keys_are_dropped():
    assert "path" not in SPECS.parse({"table": "t", "path": "/x"})


def test_check_hook_rejects_with_its_reason():
    specs = OptionSet(
        "s", [Option("n", "int", check=lambda v: (_ for _ in ()).throw(ValueError("must be even")) if v % 2 else None)]
    )
    assert specs.parse({"n": "2"})["n"] == 2
    with pytest.raises(ConfigError, match="must be even"):
        specs.parse({"n": "3"})


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
