"""Tumbling one-minute windows of event time; records too late for their window are counted apart."""

from __future__ import annotations

from typing import Any

MINUTE_MS = 60_000
ALLOWED_LATENESS_MS = 120_000


def per_minute(frame: Any) -> dict[str, Any]:
    """{"per_minute": views per (minute, page) of on-time records, "late": the late records}.

    A record is late when Kafka received it (``_timestamp``) more than ``ALLOWED_LATENESS_MS`` after its
    event time: a deterministic rule, so a replayed epoch classifies every record the same way.
    """
    from pyspark.sql import functions as F

    delay = F.col("_timestamp") - F.col("ts")
    marked = frame.withColumn("delay_ms", delay)
    on_time = marked.where(F.col("delay_ms") <= ALLOWED_LATENESS_MS)
    late = marked.where(F.col("delay_ms") > ALLOWED_LATENESS_MS)
    minute = (F.floor(F.col("ts") / MINUTE_MS) * MINUTE_MS).cast("long")
    counts = on_time.groupBy(minute.alias("minute"), "page").agg(F.count(F.lit(1)).alias("views"))
    return {
        "per_minute": counts.select("minute", "page", "views"),
        "late": late.select("page", F.col("ts").cast("long").alias("ts"), F.col("delay_ms").cast("long")),
    }
