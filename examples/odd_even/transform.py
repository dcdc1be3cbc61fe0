"""Label each number with its parity; the keyed state does the summing. Runs on Spark executors."""

from __future__ import annotations

from typing import Any


def parity(frame: Any) -> Any:
    """(parity, n) rows: "odd" or "even", and the number."""
    from pyspark.sql import functions as F

    return frame.select(F.when(F.col("n") % 2 == 0, "even").otherwise("odd").alias("parity"), "n")
