"""The page views pipeline landing in Apache Iceberg: views per (event-time minute, page) and late views,
as two tables of the default catalog (pyiceberg's SQL catalog in SQLite under ``ONCEFLOW_HOME/iceberg``).

Each epoch is one snapshot per table, whose summary names the pipeline and the epoch, so Spark SQL,
Trino, DuckDB or pyiceberg read exactly the committed epochs; ``per_minute`` is partitioned by the day of
its minute. ``python -m examples.pageviews_iceberg.query [--spark]`` prints the views per minute.
``ONCEFLOW_PAGEVIEWS_SUFFIX`` is appended to the pipeline, topic and table names, as in `examples.pageviews`.
"""

from __future__ import annotations

import os

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

SUFFIX = os.environ.get("ONCEFLOW_PAGEVIEWS_SUFFIX", "")
NAME = f"pageviews_iceberg{SUFFIX}"
TOPIC = f"pageviews{SUFFIX}"
NAMESPACE = "pageviews"
PER_MINUTE = f"{NAMESPACE}.per_minute{SUFFIX.replace('-', '_')}"
LATE = f"{NAMESPACE}.late{SUFFIX.replace('-', '_')}"

PAGEVIEWS_ICEBERG = Pipeline(
    name=NAME,
    source=KafkaSource(topics=(TOPIC,)),
    format=JsonFormat(schema={"page": "string", "user": "string", "ts": "int"}),
    transform="examples.pageviews_iceberg.transform:per_minute_at",
    sinks=(
        SinkSpec(
            "per_minute",
            "iceberg",
            {
                "table": PER_MINUTE,
                "columns": {"minute": "timestamptz", "page": "string", "views": "long"},
                "partition_by": {"minute": "day"},
            },
        ),
        SinkSpec(
            "late",
            "iceberg",
            {"table": LATE, "columns": {"page": "string", "ts": "long", "delay_ms": "long"}},
        ),
    ),
    slices=1,
)
