"""The page views transform, with each minute as a timestamp: a table that engines partition by day."""

from __future__ import annotations

from typing import Any

from examples.pageviews.transform import per_minute


def per_minute_at(frame: Any) -> dict[str, Any]:
    """`examples.pageviews.transform.per_minute`, its ``minute`` (ms) as a UTC timestamp."""
    from pyspark.sql import functions as F

    outputs = per_minute(frame)
    counts = outputs["per_minute"]
    return {**outputs, "per_minute": counts.withColumn("minute", F.timestamp_millis("minute"))}
