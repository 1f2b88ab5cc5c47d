"""Restart strategies for ``spark-eos run``, as in Flink: fixed delay, exponential backoff, failure rate.

A strategy is written as one string::

    none                                              never restart
    fixed-delay:ATTEMPTS:DELAY                        e.g. fixed-delay:3:10s
    exponential-backoff:INITIAL:MAX:MULTIPLIER        e.g. exponential-backoff:1s:5m:2
    failure-rate:MAX_FAILURES:INTERVAL:DELAY          e.g. failure-rate:3:5m:10s

``strategy.on_failure(now)`` returns the delay before the next restart, or ``None`` when the
strategy gives up (the run then ends with the query's error). ``now`` comes from a clock the
caller passes (``time.monotonic`` in production, a fake clock in tests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from eos_core.errors import ConfigError
from eos_core.options import parse_duration

__all__ = [
    "ExponentialBackoff",
    "FailureRate",
    "FixedDelay",
    "NoRestart",
    "RestartStrategy",
    "parse_strategy",
]

FORMS = (
    "none",
    "fixed-delay:ATTEMPTS:DELAY",
    "exponential-backoff:INITIAL:MAX:MULTIPLIER",
    "failure-rate:MAX_FAILURES:INTERVAL:DELAY",
)


class RestartStrategy:
    """Decides, after each failure, whether and when the pipeline restarts."""

    text: str = "none"

    def on_failure(self, now: float) -> float | None:
        """Record a failure at ``now`` (seconds); the delay before restarting, or None to give up."""
        raise NotImplementedError

    def on_healthy(self, now: float) -> None:
        """The restarted query made progress (a batch committed): strategies that reset do it here."""

    def __str__(self) -> str:
        return self.text


@dataclass
class NoRestart(RestartStrategy):
    text: str = "none"

    def on_failure(self, now: float) -> float | None:
        return None


@dataclass
class FixedDelay(RestartStrategy):
    """Up to ``attempts`` restarts in the whole run, ``delay`` seconds apart (Flink's fixed-delay)."""

    attempts: int
    delay: float
    text: str = ""
    used: int = 0

    def on_failure(self, now: float) -> float | None:
        if self.used >= self.attempts:
            return None
        self.used += 1
        return self.delay


@dataclass
class ExponentialBackoff(RestartStrategy):
    """Restart forever; the delay grows by ``multiplier`` up to ``maximum`` and resets once healthy."""

    initial: float
    maximum: float
    multiplier: float
    text: str = ""
    current: float = 0.0

    def on_failure(self, now: float) -> float | None:
        self.current = self.initial if self.current == 0.0 else min(self.maximum, self.current * self.multiplier)
        return self.current

    def on_healthy(self, now: float) -> None:
        self.current = 0.0


@dataclass
class FailureRate(RestartStrategy):
    """Restart after ``delay`` unless more than ``max_failures`` failures fall within ``interval`` seconds."""

    max_failures: int
    interval: float
    delay: float
    text: str = ""
    failures: deque[float] = field(default_factory=deque)

    def on_failure(self, now: float) -> float | None:
        self.failures.append(now)
        while self.failures and self.failures[0] <= now - self.interval:
            self.failures.popleft()
        if len(self.failures) > self.max_failures:
            return None
        return self.delay


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(
        f"restart strategy {text!r}: {why}; expected one of: {', '.join(FORMS)} (durations like 500ms, 10s, 5m, 1h)",
        option="restart",
    )


def _int(text: str, part: str, name: str, minimum: int) -> int:
    try:
        value = int(part)
    except ValueError:
        raise _bad(text, f"{name} {part!r} is not a whole number") from None
    if value < minimum:
        raise _bad(text, f"{name} must be at least {minimum}, got {value}")
    return value


def _duration(text: str, part: str, name: str) -> float:
    try:
        value = parse_duration(part)
    except ValueError:
        raise _bad(text, f"{name} {part!r} is not a duration") from None
    if value < 0:
        raise _bad(text, f"{name} must not be negative")
    return value


def parse_strategy(text: str) -> RestartStrategy:
    """Parse a strategy string (see the module docstring); ConfigError naming the form otherwise."""
    raw = str(text).strip()
    kind, *parts = [p.strip() for p in raw.split(":")]
    kind = kind.lower()
    arity: dict[str, int] = {"none": 0, "fixed-delay": 2, "exponential-backoff": 3, "failure-rate": 3}
    if kind not in arity:
        raise _bad(raw, f"unknown strategy {kind!r}")
    if len(parts) != arity[kind]:
        raise _bad(raw, f"{kind} takes {arity[kind]} parameters, got {len(parts)}")
    if kind == "none":
        return NoRestart()
    if kind == "fixed-delay":
        return FixedDelay(_int(raw, parts[0], "ATTEMPTS", 0), _duration(raw, parts[1], "DELAY"), text=raw)
    if kind == "exponential-backoff":
        initial, maximum = _duration(raw, parts[0], "INITIAL"), _duration(raw, parts[1], "MAX")
        try:
            mult = float(parts[2])
        except ValueError:
            raise _bad(raw, f"MULTIPLIER {parts[2]!r} is not a number") from None
        if initial <= 0 or maximum < initial:
            raise _bad(raw, "INITIAL must be > 0 and MAX >= INITIAL")
        if mult < 1:
            raise _bad(raw, f"MULTIPLIER must be >= 1, got {mult}")
        return ExponentialBackoff(initial, maximum, mult, text=raw)
    return FailureRate(
        _int(raw, parts[0], "MAX_FAILURES", 0),
        _duration(raw, parts[1], "INTERVAL"),
        _duration(raw, parts[2], "DELAY"),
        text=raw,
    )


Clock = Callable[[], float]
