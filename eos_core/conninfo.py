"""Postgres connection strings: the one redaction of passwords, DSNs and driver messages, and checks
that name the option and the fix when libpq would reject or misread a string."""

from __future__ import annotations

import re

from eos_core.errors import ConfigError

__all__ = [
    "check_conninfo",
    "conninfo_error",
    "conninfo_problem",
    "conninfo_secrets",
    "is_uri",
    "redact_conninfo",
    "redact_dsn",
    "scrub",
]

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
