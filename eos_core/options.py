"""Typed option specs, parsed once into frozen dataclasses, with errors that name the option.

One declaration per option: a connector's options are a frozen dataclass whose fields are declared by
their specs, ``field: type = option("name", kind, default, description, ...)``. The spec is the one
place of the option's name, type, default, checks and description; the field's default is the
spec's; ``OptionSet(context, cls)`` derives the option table (docs: ``markdown()``) from the fields
and ``build(raw)`` parses a raw map into the class. A field may also hold another options class whose
options are read from the same map (``group(cls)``: the connection options of a sink), or reuse a spec
another class declares (``reuse(cls, field, **changes)``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from eos_core.errors import ConfigError

__all__ = [
    "REQUIRED",
    "Option",
    "OptionSet",
    "group",
    "option",
    "option_specs",
    "parse_bool",
    "parse_duration",
    "parse_spark_time_ms",
    "redact",
    "reuse",
    "spec_of",
]

T = TypeVar("T")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Default of an option that has none: leaving it out is an error."""

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_DURATION = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|millis|milliseconds|seconds?|minutes?|hours?|days?)?\s*$", re.I
)
_UNIT_SECONDS = {
    "ms": 0.001,
    "millis": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}


def parse_bool(text: str) -> bool:
    """Parse true/false (also 1/0, yes/no, on/off), case-insensitively."""
    low = str(text).strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected true or false")


def parse_duration(text: str, default_unit: str = "s") -> float:
    """Parse '500ms', '10s', '5m', '1h', '2d' (or a bare number in ``default_unit``) to seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError("expected a duration such as 500ms, 10s, 5m or 1h")
    unit = (m.group(2) or default_unit).lower()
    return float(m.group(1)) * _UNIT_SECONDS[unit]


_SPARK_TIME = re.compile(r"(-?[0-9]+)([a-z]+)?")
_SPARK_TIME_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_spark_time_ms(text: str) -> int:
    """Milliseconds of a Spark time string, parsed as Spark's ``JavaUtils.timeStringAsMs`` parses it.

    Trimmed and lower-cased, a whole number with an optional unit (us, ms, s, m, min, h, d); a bare
    number is milliseconds. Anything else (fractions, spaces inside, long unit names) is refused,
    as Spark refuses it.
    """
    m = _SPARK_TIME.fullmatch(str(text).strip().lower())
    if not m:
        raise ValueError("expected a whole number with an optional unit (us, ms, s, m, min, h, d)")
    unit = m.group(2) or "ms"
    if unit not in _SPARK_TIME_MS:
        raise ValueError(f"unknown time unit {unit!r}; use us, ms, s, m, min, h or d")
    return int(int(m.group(1)) * _SPARK_TIME_MS[unit])


def redact(value: object) -> str:
    """What a secret looks like in logs, errors and repr."""
    return "***" if value not in (None, "") else repr(value)


def redact_userinfo(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it (with or without a scheme) shown as ``***@``, up to
    the last ``@`` before the host: a password may hold one."""
    return re.sub(r"(^|://|\s)[^/\s]*@", r"\1***@", text)  # also a URL given without its scheme


@dataclass(frozen=True)
class Option:
    """One option: its documented name, type, default and description.

    ``kind`` is one of str, int, float, bool, duration (seconds, float), time_ms (Spark's time
    string as whole milliseconds: a bare number is milliseconds), json, list (comma
    separated, stripped, empties dropped) or choice (one of ``choices``, compared
    case-insensitively and returned in the spelling of ``choices``).

    ``aliases``: other names accepted for the option (the names users bring from another connector,
    e.g. Spark JDBC's ``dbtable`` for ``table``); giving an alias and the option with different
    values is an error.

    ``check(value)`` refuses a parsed value with a ValueError (its text is the reason given);
    ``convert(value, context)`` turns a given value into the field's value (a table name into a
    ``TableName``) and raises its own ConfigError; an option with one has no default but None.
    """

    name: str
    kind: str = "str"
    default: Any = None
    description: str = ""
    secret: bool = False
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    attr: str = ""
    aliases: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = field(default=None, compare=False)
    convert: Callable[[Any, str], Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in _PARSERS:
            raise TypeError(f"option {self.name}: unknown kind {self.kind!r}")
        if self.kind == "choice" and not self.choices:
            raise TypeError(f"option {self.name}: kind choice needs choices")
        if not self.attr:
            object.__setattr__(self, "attr", _snake(self.name))
        if self.convert is not None and not (self.default is None or self.required):
            raise TypeError(f"option {self.name}: an option with convert has no default but None")
        if self.default is not None and not self.required and not _fits(self.kind, self.default):
            raise TypeError(f"option {self.name}: default {self.default!r} is not a value of kind {self.kind}")
        if self.kind == "choice" and self.default is not None and self.default not in self.choices:
            raise TypeError(f"option {self.name}: default {self.default!r} is not one of {self.choices}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def shown(self, value: object) -> str:
        return redact(value) if self.secret else repr(value)

    def valid_values(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        hint = _HINTS[self.kind]
        bounds = []
        if self.min is not None:
            bounds.append(f">= {_num(self.min)}")
        if self.max is not None:
            bounds.append(f"<= {_num(self.max)}")
        return hint + (f" ({' and '.join(bounds)})" if bounds else "")

    def parse(self, raw: str, context: str) -> Any:
        try:
            value = _PARSERS[self.kind](self, raw)
        except (ValueError, TypeError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"{context}: option '{self.name}' has an invalid value {self.shown(raw)}: {exc}; "
                f"expected {self.valid_values()}",
                option=self.name,
            ) from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                raise ConfigError(
                    f"{context}: option '{self.name}' is {self.shown(raw)}, out of range; "
                    f"expected {self.valid_values()}",
                    option=self.name,
                )
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                raise ConfigError(
                    f"{context}: option '{self.name}' has an invalid value {self.shown(raw)}: {exc}",
                    option=self.name,
                ) from None
        return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _snake(name: str) -> str:
    s = re.sub(r"[.\-]", "_", name)
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", s)
    return s.lower()


def _parse_int(opt: Option, raw: str) -> int:
    text = str(raw).strip()
    if not re.fullmatch(r"[-+]?\d+", text):
        raise ValueError("not a whole number")
    return int(text)


def _parse_float(opt: Option, raw: str) -> float:
    return float(str(raw).strip())


def _parse_choice(opt: Option, raw: str) -> str:
    low = str(raw).strip().lower()
    for choice in opt.choices:
        if choice.lower() == low:
            return choice
    raise ValueError("not a known value")


def _parse_list(opt: Option, raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in str(raw).split(",") if p.strip())


_PARSERS: dict[str, Callable[[Option, str], Any]] = {
    "str": lambda opt, raw: str(raw),
    "int": _parse_int,
    "float": _parse_float,
    "bool": lambda opt, raw: parse_bool(raw),
    "duration": lambda opt, raw: parse_duration(raw),
    "time_ms": lambda opt, raw: parse_spark_time_ms(raw),
    "json": lambda opt, raw: json.loads(raw),
    "list": _parse_list,
    "choice": _parse_choice,
}
# The Python type each kind parses to (json: any).
_TYPES: dict[str, type | None] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "duration": float,
    "time_ms": int,
    "json": None,
    "list": tuple,
    "choice": str,
}


def _fits(kind: str, value: object) -> bool:
    wanted = _TYPES[kind]
    if wanted is None:
        return True
    return isinstance(value, wanted) and (wanted is bool or not isinstance(value, bool))


_HINTS = {
    "str": "a string",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "duration": "a duration such as 500ms, 10s, 5m or 1h",
    "time_ms": "a whole number of milliseconds or one with a unit (us, ms, s, m, min, h, d), e.g. 500, 30s, 15m",
    "json": "JSON",
    "list": "a comma-separated list",
}


_SPEC = "spark-eos option"
_GROUP = "spark-eos options"


def option(
    name: str,
    kind: str = "str",
    default: Any = None,
    description: str = "",
    *,
    secret: bool = False,
    choices: tuple[str, ...] = (),
    min: float | None = None,
    max: float | None = None,
    check: Callable[[Any], None] | None = None,
    convert: Callable[[Any, str], Any] | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A field of an options dataclass, declared by its spec (see ``Option``): its default is the spec's
    (``REQUIRED``: none), its name is the option's attribute, its repr hides a secret."""
    spec = Option(
        name,
        kind,
        default,
        description,
        secret=secret,
        choices=choices,
        min=min,
        max=max,
        check=check,
        convert=convert,
        aliases=aliases,
    )
    return _field(spec)


def reuse(owner: type, attr: str, **changes: Any) -> Any:
    """A field declared by the spec of ``owner``'s field ``attr`` (another connector's option), with
    ``changes`` (e.g. ``default=()`` where this connector does not require it)."""
    spec = spec_of(owner, attr)
    return _field(dataclasses.replace(spec, **changes) if changes else spec)


def group(cls: type) -> Any:
    """A field holding the options class ``cls``, whose options are read from the same map."""
    _fields_of(cls)
    return dataclasses.field(metadata={_GROUP: cls})


def spec_of(owner: type, attr: str) -> Option:
    """The spec of ``owner``'s field ``attr``."""
    for f in _fields_of(owner):
        if f.name == attr and _SPEC in f.metadata:
            spec: Option = f.metadata[_SPEC]
            return spec
    raise TypeError(f"{owner.__name__} has no option field {attr!r}")


def option_specs(cls: type) -> tuple[Option, ...]:
    """The specs of an options class in field order, its groups' in place (attr: the field's path)."""
    return tuple(_derive(cls, "", None))


def _field(spec: Option) -> Any:
    metadata = {_SPEC: spec}
    if spec.required:
        return dataclasses.field(metadata=metadata, repr=not spec.secret)
    return dataclasses.field(default=spec.default, metadata=metadata, repr=not spec.secret)


def _fields_of(cls: type) -> tuple[dataclasses.Field, ...]:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__name__}: an options class is a frozen dataclass")
    return dataclasses.fields(cls)


def _derive(cls: type, prefix: str, passthrough_attr: str | None) -> list[Option]:
    """Every spec of ``cls`` (attr: the field's path); a field that is neither an option, a group nor
    the passthrough map, or whose type does not hold its option's values, is a TypeError."""
    hints = typing.get_type_hints(cls)
    specs: list[Option] = []
    for f in _fields_of(cls):
        where = f"{cls.__name__}.{f.name}"
        if _SPEC in f.metadata:
            spec: Option = f.metadata[_SPEC]
            if spec.convert is None:
                _check_annotation(where, spec, hints[f.name])
            specs.append(dataclasses.replace(spec, attr=prefix + f.name))
        elif _GROUP in f.metadata:
            specs.extend(_derive(f.metadata[_GROUP], f"{prefix}{f.name}.", None))
        elif f.name != passthrough_attr and f.init:
            raise TypeError(f"{where}: a field of an options class is an option(), a group() or the passthrough map")
    return specs


def _check_annotation(where: str, spec: Option, annotation: Any) -> None:
    if annotation is Any:
        return
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(annotation) if union else (annotation,)
    held = {typing.get_origin(m) or m for m in members}
    wanted = _TYPES[spec.kind]
    if (wanted is not None and wanted not in held) or (spec.default is None and type(None) not in held):
        raise TypeError(
            f"{where}: its type {annotation} does not hold the values of option {spec.name} "
            f"(kind {spec.kind}, default {spec.default!r})"
        )


class OptionSet(Generic[T]):
    """The options of one connector, derived from its options class: parse a raw map into it.

    Keys are matched case-insensitively. Keys under ``passthrough`` prefixes (e.g. ``kafka.``) are
    collected, prefix kept, into the field named ``passthrough_attr``. ``ignored`` keys (options
    Spark itself adds, like ``path``) are accepted and dropped. Anything else is an error that
    suggests the closest known option.
    """

    def __init__(
        self,
        context: str,
        cls: type[T],
        *,
        passthrough: Iterable[str] = (),
        passthrough_attr: str = "passthrough",
        ignored: Iterable[str] = ("path",),
    ) -> None:
        self.context = context
        self.cls = cls
        self.passthrough = tuple(p.lower() for p in passthrough)
        self.passthrough_attr = passthrough_attr
        self.options = tuple(_derive(cls, "", passthrough_attr if self.passthrough else None))
        self.by_key = {o.name.lower(): o for o in self.options}
        names = len(self.options)
        for o in self.options:
            self.by_key.update({a.lower(): o for a in o.aliases})
            names += len(o.aliases)
        if len(self.by_key) != names:
            raise TypeError(f"{context}: duplicate option names")
        self.ignored = {k.lower() for k in ignored}

    def keywords(self) -> dict[str, str]:
        """Each option's Python keyword (its name, or an alias, in snake case: ``sink.id`` -> ``sink_id``,
        ``checkpointLocation`` -> ``checkpoint_location``) -> the option's name, for the foreachBatch helpers
        that take the options as keyword arguments."""
        return {_snake(name): o.name for o in self.options for name in (o.name, *o.aliases)}

    def from_keywords(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` keyword arguments as the options they name (a keyword of ``keywords``), anything else
        (a dotted name passed as ``**{"sink.id": ...}``, a passthrough key) kept as it is."""
        names = self.keywords()
        return {names.get(key, key): value for key, value in given.items()}

    def build(self, raw: Mapping[str, Any]) -> T:
        """Parse ``raw`` into the options class: each option's value (``convert``ed), each group built
        the same way, then the class's ``validate(context)`` if it has one (checks across options)."""
        values = self.parse(raw)
        made: T = self._make(self.cls, values, "")
        return made

    def _make(self, cls: type[Any], values: Mapping[str, Any], prefix: str) -> Any:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(_SPEC)
            if spec is not None:
                value = values[prefix + f.name]
                if spec.convert is not None and value is not None:
                    value = spec.convert(value, self.context)
                kwargs[f.name] = value
            elif _GROUP in f.metadata:
                kwargs[f.name] = self._make(f.metadata[_GROUP], values, f"{prefix}{f.name}.")
            elif not prefix and self.passthrough and f.name == self.passthrough_attr:
                kwargs[f.name] = values[f.name]
        made = cls(**kwargs)
        validate = getattr(made, "validate", None)
        if validate is not None:
            validate(self.context)
        return made

    def parse(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Return {attr: value} for every option (defaults filled), plus the passthrough map."""
        values: dict[str, Any] = {}
        extra: dict[str, str] = {}
        seen: dict[str, str] = {}
        given: dict[str, tuple[str, Any]] = {}  # attr -> (the key that set it, its raw value)
        for key, value in raw.items():
            low = str(key).lower()
            if low in seen and seen[low] != key:
                raise ConfigError(
                    f"{self.context}: option '{key}' is given twice (also as '{seen[low]}'); keep one",
                    option=key,
                )
            seen[low] = str(key)
            opt = self.by_key.get(low)
            if opt is not None:
                if value is None:
                    continue
                if opt.attr in given:
                    other, before = given[opt.attr]
                    if str(before) != str(value):
                        raise ConfigError(
                            f"{self.context}: options '{other}' and '{key}' both set '{opt.name}' "
                            f"({', '.join(repr(a) for a in opt.aliases)} {'is' if len(opt.aliases) == 1 else 'are'} "
                            f"another name for it), with different values; give one of them",
                            option=opt.name,
                        )
                    continue
                given[opt.attr] = (str(key), value)
                values[opt.attr] = opt.parse(value, self.context)
            elif any(low.startswith(p) for p in self.passthrough):
                extra[str(key)] = "" if value is None else str(value)
            elif low in self.ignored:
                continue
            else:
                raise ConfigError(self._unknown(str(key)), option=str(key))
        for opt in self.options:
            if opt.attr not in values:
                if opt.required:
                    raise ConfigError(
                        f"{self.context}: option '{opt.name}' is required ({opt.description or opt.valid_values()})",
                        option=opt.name,
                    )
                values[opt.attr] = opt.default
        if self.passthrough:
            values[self.passthrough_attr] = extra
        return values

    def _unknown(self, key: str) -> str:
        known = [o.name for o in self.options] + [a for o in self.options for a in o.aliases]
        close = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
        hint = ""
        if close:
            hint = f"; did you mean '{next(k for k in known if k.lower() == close[0])}'?"
        prefixes = (
            f" (or any option starting with {', '.join(repr(p) for p in self.passthrough)})" if self.passthrough else ""
        )
        names = sorted(o.name for o in self.options)
        return f"{self.context}: unknown option '{key}'{hint} Known options: {', '.join(names)}{prefixes}"

    def markdown(self) -> str:
        """A markdown table of the options (the docs pages embed it: scripts/docs_options.py)."""
        rows = ["| option | type | default | description |", "|---|---|---|---|"]
        for o in self.options:
            default = "required" if o.required else ("" if o.default is None else f"`{o.default}`")
            kind = o.valid_values() if o.kind == "choice" else o.kind
            also = f" (also {', '.join(f'`{a}`' for a in o.aliases)})" if o.aliases else ""
            rows.append(f"| `{o.name}`{also} | {kind} | {default} | {o.description} |")
        return "\n".join(rows)
