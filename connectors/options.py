"""Typed option specs, parsed once into frozen dataclasses, with errors that name the option."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from connectors.errors import ConfigError

__all__ = [
    "REQUIRED",
    "Option",
    "OptionSet",
    "check_conninfo",
    "conninfo_error",
    "conninfo_problem",
    "conninfo_secrets",
    "is_uri",
    "parse_bool",
    "parse_duration",
    "parse_spark_time_ms",
    "redact",
    "redact_conninfo",
    "redact_dsn",
    "scrub",
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


@dataclass(frozen=True)
class Option:
    """One option: its documented name, type, default and description.

    ``kind`` is one of str, int, float, bool, duration (seconds, float), time_ms (Spark's time
    string as whole milliseconds: a bare number is milliseconds), json, list (comma
    separated, stripped, empties dropped) or choice (one of ``choices``, compared
    case-insensitively and returned in the spelling of ``choices``).
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
    check: Callable[[Any], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in _PARSERS:
            raise TypeError(f"option {self.name}: unknown kind {self.kind!r}")
        if self.kind == "choice" and not self.choices:
            raise TypeError(f"option {self.name}: kind choice needs choices")
        if not self.attr:
            object.__setattr__(self, "attr", _snake(self.name))

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


class OptionSet:
    """The options of one connector: parse a raw string map into a frozen dataclass.

    Keys are matched case-insensitively. Keys under ``passthrough`` prefixes (e.g. ``kafka.``) are
    collected, prefix kept, into the field named ``passthrough_attr``. ``ignored`` keys (options
    Spark itself adds, like ``path``) are accepted and dropped. Anything else is an error that
    suggests the closest known option.
    """

    def __init__(
        self,
        context: str,
        options: Sequence[Option],
        *,
        passthrough: Iterable[str] = (),
        passthrough_attr: str = "passthrough",
        ignored: Iterable[str] = ("path",),
    ) -> None:
        self.context = context
        self.options = tuple(options)
        self.by_key = {o.name.lower(): o for o in self.options}
        if len(self.by_key) != len(self.options):
            raise TypeError(f"{context}: duplicate option names")
        self.passthrough = tuple(p.lower() for p in passthrough)
        self.passthrough_attr = passthrough_attr
        self.ignored = {k.lower() for k in ignored}

    def parse(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Return {attr: value} for every option (defaults filled), plus the passthrough map."""
        values: dict[str, Any] = {}
        extra: dict[str, str] = {}
        seen: dict[str, str] = {}
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

    def parse_into(self, cls: type[T], raw: Mapping[str, Any], **extra_fields: Any) -> T:
        values = self.parse(raw)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs = {k: v for k, v in values.items() if k in names}
        kwargs.update(extra_fields)
        return cls(**kwargs)

    def _unknown(self, key: str) -> str:
        known = [o.name for o in self.options]
        close = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
        hint = ""
        if close:
            hint = f"; did you mean '{self.by_key[close[0]].name}'?"
        prefixes = (
            f" (or any option starting with {', '.join(repr(p) for p in self.passthrough)})" if self.passthrough else ""
        )
        return f"{self.context}: unknown option '{key}'{hint} Known options: {', '.join(sorted(known))}{prefixes}"

    def markdown(self) -> str:
        """A markdown table of the options (the docs pages embed it: scripts/docs_options.py)."""
        rows = ["| option | type | default | description |", "|---|---|---|---|"]
        for o in self.options:
            default = "required" if o.required else ("" if o.default is None else f"`{o.default}`")
            kind = o.valid_values() if o.kind == "choice" else o.kind
            rows.append(f"| `{o.name}` | {kind} | {default} | {o.description} |")
        return "\n".join(rows)


# ---- secrets: the one redaction of passwords, DSNs and messages built from driver errors ---------
#
# Everything that shows a password-bearing value goes through here (``sinks.postgres.options`` and
# ``connectors.services.base`` re-export these names):
#
# - ``redact(value)``: a secret option's value as shown anywhere (``***``).
# - ``redact_conninfo(text)``: ``text`` with the password of any URL (``user:pw@``, ``?password=``)
#   or keyword conninfo (``password=...``, quoted or not, even unterminated) replaced by ``***``.
# - ``redact_dsn(dsn)``: a whole DSN for display; ``<unparsable DSN>`` when it is not valid.
# - ``scrub(text, *secrets, conninfo=...)``: the second line of defence for any message built from a
#   driver error: ``redact_conninfo`` plus removal of each secret, every fragment of it of 3 or more
#   characters (split at whitespace, quotes, ``=``, ``@``, ``/``, ``\``), raw, percent-encoded and
#   conninfo-escaped. ``conninfo`` adds the password(s) found in a (possibly malformed) conninfo.
# - ``check_conninfo(conninfo, option=..., context=...)``: raise a ``ConfigError`` that names the
#   option, the form (URI or keyword), the likely cause and the fix when libpq would reject the
#   string or would silently misread it (an ``@`` or ``/`` in a URI password). libpq's own message
#   is never passed on: it quotes the offending piece of the string, which is often the password.

_SCRUBBED = "***"
_MIN_FRAGMENT = 3
_FRAGMENT_SPLIT = re.compile(r"""[\s\x00'"=@/\\]+""")
_URI_START = re.compile(r"^\s*postgres(?:ql)?://", re.I)
_URI_SCHEME = re.compile(r"postgres(?:ql)?://", re.I)
_URI_USERINFO = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)(?:[^@\s]*@)+", re.I)
_URI_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.I)
_URI_QUERY_PASSWORD_LENIENT = re.compile(r"[?&]password=([^&#\n]*)", re.I)
_LIBPQ_KEYWORDS = frozenset(
    """host hostaddr port dbname user password passfile require_auth channel_binding connect_timeout
    client_encoding options application_name fallback_application_name keepalives keepalives_idle
    keepalives_interval keepalives_count tcp_user_timeout replication gssencmode sslmode sslnegotiation
    sslcompression sslcert sslkey sslkeylogfile sslpassword sslcertmode sslrootcert sslcrl sslcrldir sslsni
    requirepeer ssl_min_protocol_version ssl_max_protocol_version krbsrvname gsslib gssdelegation service
    target_session_attrs load_balance_hosts min_protocol_version max_protocol_version oauth_issuer
    oauth_client_id oauth_client_secret oauth_scope""".split()
)
# A keyword password: single-quoted (escapes honoured; unterminated runs to the end) or unquoted,
# which here also swallows the following words up to the next known ``keyword=`` (a value with
# spaces someone forgot to quote is still the password, "=" and all).
_NEXT_KEYWORD = "|".join(sorted(_LIBPQ_KEYWORDS, key=len, reverse=True))
_UNQUOTED = rf"[^\s']\S*(?:\s+(?!(?:{_NEXT_KEYWORD})\s*=)\S+)*"
_KEYWORD_PASSWORD = re.compile(rf"(?<![?&])(password\s*=\s*)('(?:[^'\\]|\\.)*(?:'|\\?$)|{_UNQUOTED})", re.I)
_URI_HOW = (
    "in the URI form percent-encode special characters of the user name and password "
    "(space %20, @ %40, / %2F, : %3A, % %25, ? %3F, # %23)"
)
_KEYWORD_HOW = (
    "in the keyword form single-quote a value with spaces, quotes, '=' or backslashes "
    "(user='a b', and the same for the password), writing ' as \\' and \\ as \\\\ inside the quotes"
)


def is_uri(conninfo: str) -> bool:
    """Whether ``conninfo`` is a ``postgresql://`` / ``postgres://`` URI (else the keyword form)."""
    return bool(_URI_START.match(conninfo))


def redact_conninfo(text: str) -> str:
    """``text`` with any URL or keyword-conninfo password replaced by ``***``, for messages."""
    text = _URI_USERINFO.sub(rf"\1{_SCRUBBED}@", text)
    text = _URI_QUERY_PASSWORD.sub(rf"\1{_SCRUBBED}", text)
    return _KEYWORD_PASSWORD.sub(rf"\1{_SCRUBBED}", text)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (URL or key=value form); safe to print or log.

    Key order and spacing stay as written, so the user recognises their DSN. A DSN that libpq would
    reject (or misread) shows as ``<unparsable DSN>``: what could not be parsed may hold a password.
    """
    if conninfo_problem(dsn) is not None:
        return "<unparsable DSN>"
    return redact_conninfo(dsn)


def conninfo_secrets(conninfo: str | None) -> tuple[str, ...]:
    """Every string that may be the password of ``conninfo``, read leniently (malformed input too).

    More than the truth on purpose: ``password=a b c`` yields ``a`` (libpq's reading) and ``a b c``;
    a URI ``u:x@y@h`` yields ``x`` and ``x@y``. For ``scrub``, never for connecting.
    """
    if not conninfo:
        return ()
    found: list[str] = []
    for m in _URI_SCHEME.finditer(conninfo):
        rest = conninfo[m.end() :].split("\n", 1)[0]
        for at in (i for i, ch in enumerate(rest) if ch == "@"):
            userinfo = rest[:at]
            if ":" in userinfo:
                found.append(userinfo.split(":", 1)[1])
    for m in _URI_QUERY_PASSWORD_LENIENT.finditer(conninfo):
        found.extend((m.group(1), m.group(1).split(" ", 1)[0]))
    for m in _KEYWORD_PASSWORD.finditer(conninfo):
        value = m.group(2)
        found.append(value)
        if value.startswith("'"):
            for inner in (value[1:], value[1:-1]):  # closed or not: both readings
                found.extend((inner, re.sub(r"\\(.)", r"\1", inner)))
        else:
            found.append(value.split()[0])
    return tuple(dict.fromkeys(s for s in found if s))


def _forms(secret: str) -> set[str]:
    """The secret raw, percent-decoded, percent-encoded and conninfo-escaped, and their fragments."""
    from urllib.parse import quote, unquote

    whole = {secret, unquote(secret), quote(secret, safe=""), quote(secret), quote(unquote(secret), safe="")}
    whole |= {w.replace("\\", "\\\\").replace("'", "\\'") for w in list(whole)}
    forms = set(whole)
    for w in whole:
        forms.update(_FRAGMENT_SPLIT.split(w))
    return {f for f in forms if len(f) >= _MIN_FRAGMENT and f != _SCRUBBED}


def scrub(text: str, *secrets: str | None, conninfo: str | None = None) -> str:
    """``text`` without any password: ``redact_conninfo``, then every secret and each fragment of it
    of 3+ characters (raw and percent-encoded) replaced by ``***``. ``conninfo`` adds its passwords.

    For any message built from a driver error or from user input that may hold a password.
    """
    pieces: set[str] = set()
    for secret in (*secrets, *conninfo_secrets(conninfo)):
        if secret:
            pieces |= _forms(str(secret))
    text = redact_conninfo(str(text))
    for piece in sorted(pieces, key=len, reverse=True):
        text = text.replace(piece, _SCRUBBED)
    return text


def _option_name(key: str | None) -> str:
    if key and key.lower() in _LIBPQ_KEYWORDS:
        return f"'{key}'"
    return "a word (not shown: it may be part of a value)"


def _keyword_problem(text: str) -> str | None:
    """Why libpq's keyword parser rejected ``text``, described without quoting any of it."""
    i, n, last = 0, len(text), None
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return None
        start = i
        while i < n and text[i] != "=" and not text[i].isspace():
            i += 1
        key = text[start:i]
        while i < n and text[i].isspace():
            i += 1
        after = f" after the value of {_option_name(last)}" if last else " at the start"
        if i >= n or text[i] != "=":
            return f"it has a word without '='{after}, most likely an unquoted value with spaces"
        if not key:
            return f"it has a stray '='{after}, most likely an unquoted value with spaces or '='"
        if key.lower() not in _LIBPQ_KEYWORDS:
            return f"it names an unknown option{after} (not shown: it may be part of an unquoted value)"
        i += 1
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == "'":
            i += 1
            while i < n and text[i] != "'":
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return f"the quoted value of {_option_name(key)} has no closing quote (a ' inside it must be \\')"
            i += 1
        else:
            while i < n and not text[i].isspace():
                i += 2 if text[i] == "\\" else 1
        last = key


def _uri_problem(text: str) -> str | None:
    """Why libpq rejected the URI ``text``, described without quoting any of it."""
    if any(ch.isspace() for ch in text.strip()):
        return "it contains a raw space"
    if re.search(r"%(?![0-9A-Fa-f]{2})", text):
        return "it has a '%' not followed by two hex digits (write % itself as %25)"
    return None


def _misread(text: str) -> str | None:
    """What libpq accepts but reads wrongly, so that a piece of the password becomes a host or a database."""
    if "\x00" in text:
        return "it contains a NUL character (libpq would cut the value short there)"
    if not is_uri(text):
        return None
    head, slash, path = _URI_START.sub("", text, count=1).partition("/")
    if head.count("@") > 1:
        return "it has more than one '@' before the host (an '@' in the user name or password must be %40)"
    if slash and "@" in path.split("?", 1)[0]:
        return "it has an '@' after a '/' (a '/' in the password must be %2F; an '@' in the database name %40)"
    return None


def conninfo_problem(conninfo: str) -> str | None:
    """Why libpq would reject or misread ``conninfo`` (never quoting it), or None when it is fine."""
    misread = _misread(conninfo)
    if misread is not None:
        return misread
    from psycopg.conninfo import conninfo_to_dict

    rejected = False
    try:
        conninfo_to_dict(conninfo)
    except Exception:  # psycopg.ProgrammingError, whose text can quote the password: dropped here
        rejected = True
    if not rejected:
        return None
    return (_uri_problem if is_uri(conninfo) else _keyword_problem)(conninfo) or "libpq rejects it"


def conninfo_error(conninfo: str, *, option: str = "dsn", context: str = "postgres") -> ConfigError:
    """The ConfigError for a connection string libpq rejects: option, form, likely cause, the fix."""
    uri = is_uri(conninfo)
    cause = conninfo_problem(conninfo) or "libpq rejects it"
    form = "uri" if uri else "keyword"
    shown = "URI form (postgresql://...)" if uri else "keyword form (key=value ...)"
    return ConfigError(
        f"{context}: option '{option}' is not a valid connection string: read as the {shown}, {cause}; "
        f"{_URI_HOW if uri else _KEYWORD_HOW}. (libpq's own message is withheld: it can quote the password.)",
        option=option,
        form=form,
    )


def check_conninfo(conninfo: str | None, *, option: str = "dsn", context: str = "postgres") -> None:
    """Raise ``conninfo_error`` when libpq would reject or misread ``conninfo`` (None/empty pass).

    Raised outside any ``except`` block: no driver exception is chained as ``__context__``.
    """
    if conninfo and conninfo_problem(conninfo) is not None:
        raise conninfo_error(conninfo, option=option, context=context)
