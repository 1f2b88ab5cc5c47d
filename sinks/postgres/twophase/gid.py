"""Global transaction ids of the two-phase sink: ``eos:<sink id>:<batch>:<partition>:<nonce>:<attempt>``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from eos_core.errors import ConfigError

__all__ = [
    "GID_PREFIX",
    "MAX_GID_BYTES",
    "MAX_SINK_ID_BYTES",
    "Gid",
    "check_sink_id",
    "escape_sink_id",
    "new_nonce",
    "parse_gid",
    "sink_prefix",
    "unescape_sink_id",
]

GID_PREFIX = "eos"
MAX_GID_BYTES = 199  # Postgres: a gid "must be less than 200 bytes long"
MAX_SINK_ID_BYTES = 120  # escaped; leaves room for 19-digit batch and attempt numbers
NONCE_LEN = 12

# Characters kept as they are in a gid; everything else (':' and '%' first) is %XX-escaped, so
# the ':' separators stay unambiguous and a sink id round-trips exactly.
_SAFE = re.compile(r"[A-Za-z0-9._\-@+=/]")
_NONCE = re.compile(rf"^[0-9a-f]{{{NONCE_LEN}}}$")
_GID = re.compile(rf"^eos:([^:]+):(\d+):(\d+):([0-9a-f]{{{NONCE_LEN}}}):(\d+)$")


def escape_sink_id(sink_id: str) -> str:
    """The sink id as it appears in gids: safe characters kept, others %XX (UTF-8)."""
    out = []
    for ch in sink_id:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def unescape_sink_id(text: str) -> str:
    """Inverse of :func:`escape_sink_id`."""
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            raw.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(text[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8")


def check_sink_id(sink_id: object, option: str = "sink.id") -> str:
    """Validate a sink id (non-empty, printable, short enough once escaped); returns it."""
    if not isinstance(sink_id, str) or not sink_id.strip():
        raise ConfigError(
            f"postgres-2pc: option '{option}' is required: a name unique to this query (and stable across its "
            "restarts), e.g. 'orders-to-pg'; it names the sink in the decision log and in every prepared transaction",
            option=option,
        )
    if sink_id != sink_id.strip() or any(not ch.isprintable() for ch in sink_id):
        raise ConfigError(
            f"postgres-2pc: option '{option}' is {sink_id!r}: no leading/trailing spaces or control characters",
            option=option,
        )
    escaped = escape_sink_id(sink_id)
    if len(escaped) > MAX_SINK_ID_BYTES:
        raise ConfigError(
            f"postgres-2pc: option '{option}' is too long ({len(escaped)} bytes once escaped, at most "
            f"{MAX_SINK_ID_BYTES}): Postgres limits a transaction id to 199 bytes; use a shorter name "
            "of letters, digits and . _ - (other characters take 3 bytes each)",
            option=option,
        )
    return sink_id


def sink_prefix(sink_id: str) -> str:
    """The prefix every gid of this sink starts with (``starts_with(gid, prefix)`` finds them)."""
    return f"{GID_PREFIX}:{escape_sink_id(sink_id)}:"


def new_nonce() -> str:
    """A fresh attempt nonce: one per writer built on the driver, shared by the batch's tasks."""
    import secrets

    return secrets.token_hex(NONCE_LEN // 2)


@dataclass(frozen=True, order=True)
class Gid:
    """One prepared transaction of the sink: which batch, partition, batch attempt and task attempt.

    ``nonce`` separates attempts of a batch by different writer instances (a replay after a crash
    gets a new one; the tasks of one attempt share it). ``attempt`` is Spark's task attempt id,
    unique within the application, which separates task retries (and stage retries, where the
    per-stage attempt number would start again at 0).
    """

    sink_id: str
    batch: int
    partition: int
    nonce: str
    attempt: int

    def __post_init__(self) -> None:
        check_sink_id(self.sink_id)
        for name in ("batch", "partition", "attempt"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"gid {name} must be a non-negative int, got {value!r}")
        if value_too_big(self.batch) or value_too_big(self.attempt) or self.partition >= 2**31:
            raise ValueError(
                f"gid numbers out of range: batch={self.batch} partition={self.partition} attempt={self.attempt}"
            )
        if not _NONCE.match(self.nonce):
            raise ValueError(f"gid nonce must be {NONCE_LEN} lowercase hex digits, got {self.nonce!r}")
        if len(str(self).encode()) > MAX_GID_BYTES:  # cannot happen with the limits above; kept as a guard
            raise ValueError(f"gid {self} is longer than {MAX_GID_BYTES} bytes")

    def __str__(self) -> str:
        return f"{sink_prefix(self.sink_id)}{self.batch}:{self.partition}:{self.nonce}:{self.attempt}"

    @property
    def text(self) -> str:
        return str(self)


def value_too_big(n: int) -> bool:
    return n >= 2**63


def parse_gid(text: str) -> Gid | None:
    """The Gid a prepared transaction's id stands for, or None when it is not one of ours."""
    m = _GID.match(text)
    if not m:
        return None
    try:
        sink_id = unescape_sink_id(m.group(1))
        return Gid(sink_id, int(m.group(2)), int(m.group(3)), m.group(4), int(m.group(5)))
    except (ValueError, ConfigError, UnicodeDecodeError, IndexError):
        return None
