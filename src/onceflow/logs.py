"""The one-line log every protocol step writes to: a task log, a terminal, or nothing."""

from __future__ import annotations

from collections.abc import Callable

Log = Callable[[str], None]


def quiet(_: str) -> None:
    """A log that drops its lines, for callers that only want the results."""
    return None
