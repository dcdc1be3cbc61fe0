"""Medians and ratios as the report states them."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values: Iterable[float]) -> str:
    """``min–max`` of the runs behind a median, so the reader sees the noise."""
    values = list(values)
    return f"{min(values):.3g}–{max(values):.3g}" if values else "n/a"
