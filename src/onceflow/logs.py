"""The one shape of a step's log: a function that takes one line (a task log, a terminal, or nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

Log: TypeAlias = Callable[[str], None]


def quiet(_: str) -> None:
    """The log of a caller that wants no lines."""
    return None
