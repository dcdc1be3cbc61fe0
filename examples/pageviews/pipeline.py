"""The page views spec: JSON views (``page``, ``user``, ``ts`` = event time in ms) from Kafka to two
Parquet tables under ``<ONCEFLOW_HOME>/examples/pageviews<suffix>/``:

* ``per_minute``: views per (event-time minute, page). Each epoch adds its counts for the minutes it saw,
  as new files in one atomic commit, so a minute whose views arrive over two epochs has two rows; a reader
  sums them (`read_views_per_minute`). Exactly-once delivery makes that sum exact.
* ``late``: views that reached Kafka more than ``ALLOWED_LATENESS_MS`` after their event time; they are
  kept, with their delay, instead of being counted into minutes that readers may have used already.

``ONCEFLOW_PAGEVIEWS_SUFFIX`` is appended to the pipeline, topic and folder names (empty by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

SUFFIX = os.environ.get("ONCEFLOW_PAGEVIEWS_SUFFIX", "")
NAME = f"pageviews{SUFFIX}"
TOPIC = f"pageviews{SUFFIX}"
ROOT = Path(os.environ.get("ONCEFLOW_HOME") or Path.cwd() / ".onceflow") / "examples" / NAME

PAGEVIEWS = Pipeline(
    name=NAME,
    source=KafkaSource(topics=(TOPIC,)),
    format=JsonFormat(schema={"page": "string", "user": "string", "ts": "int"}),
    transform="examples.pageviews.transform:per_minute",
    sinks=(
        SinkSpec(
            "per_minute",
            "files",
            {
                "root": str(ROOT),
                "table": "per_minute",
                "columns": {"minute": "int64", "page": "string", "views": "int64"},
            },
        ),
        SinkSpec(
            "late",
            "files",
            {
                "root": str(ROOT),
                "table": "late",
                "columns": {"page": "string", "ts": "int64", "delay_ms": "int64"},
            },
        ),
    ),
    slices=1,
)


def read_views_per_minute(root: Path = ROOT) -> dict[tuple[int, str], int]:
    """Committed views per (minute start in ms, page), summed over the epochs that contributed."""
    from onceflow.sinks.files import read_committed_table

    table: Any = read_committed_table(root, "per_minute")
    totals: dict[tuple[int, str], int] = {}
    if table.num_rows == 0:
        return totals
    for row in table.to_pylist():
        key = (int(row["minute"]), str(row["page"]))
        totals[key] = totals.get(key, 0) + int(row["views"])
    return totals


def read_late(root: Path = ROOT) -> list[dict[str, Any]]:
    from onceflow.sinks.files import read_committed_table

    table: Any = read_committed_table(root, "late")
    return [] if table.num_rows == 0 else list(table.to_pylist())
