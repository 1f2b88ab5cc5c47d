"""A call waited for at most a bound, for client calls that may not honour their own timeout.

librdkafka has calls that can outwait theirs: ``Consumer.close()`` has no timeout and waits on a group
coordinator that may be gone; ``send_offsets_to_transaction`` ignores its own when the group coordinator's
broker goes away mid-call (confluentinc/librdkafka#5456). Neither can be interrupted from Python, so the
call runs in a daemon thread of its own, and a caller that waited long enough goes on without it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["StillRunning", "within"]

T = TypeVar("T")


class StillRunning(Exception):
    """The call did not return within its bound; it goes on in its daemon thread until it returns or the
    process ends."""


def within(fn: Callable[[], T], timeout: float, *, name: str) -> T:
    """``fn()``, waited for at most ``timeout`` seconds in a daemon thread called ``name``: what it returned, or
    what it raised (in the caller's thread), or ``StillRunning`` when it is still at it."""
    result: list[T] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=call, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StillRunning(name)
    if failure:
        raise failure[0]
    return result[0]
