"""The odd/even running sums pipeline spec.

Input: JSON ``{"n": <int>}`` on the topic ``numbers``. Every epoch adds its numbers to the running sum
of their parity, kept as keyed state (`StateSpec`, reducer ``sum``): the state after epoch n is the
committed state of epoch n-1 plus epoch n's numbers, never more, whatever crashes or replays happen in
between. The sums go to the PostgreSQL table ``parity_sums`` by upsert (one row per parity), which is
exactly-once by idempotence: a replayed epoch writes the same totals again.

``ONCEFLOW_ODD_EVEN_SUFFIX`` is appended to the pipeline, topic and table names (empty by default), so
that a demo or a test can run on fresh ones; ``ONCEFLOW_ODD_EVEN_PG_DSN`` points the sink at another
database (default: ONCEFLOW_PG_DSN).
"""

from __future__ import annotations

import os

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec, StateSpec

SUFFIX = os.environ.get("ONCEFLOW_ODD_EVEN_SUFFIX", "")
NAME = f"odd-even{SUFFIX}"
INPUT_TOPIC = f"numbers{SUFFIX}"
SUMS_TABLE = f"parity_sums{SUFFIX}".replace("-", "_")

_dsn = {"dsn": os.environ["ONCEFLOW_ODD_EVEN_PG_DSN"]} if os.environ.get("ONCEFLOW_ODD_EVEN_PG_DSN") else {}

ODD_EVEN = Pipeline(
    name=NAME,
    source=KafkaSource(topics=(INPUT_TOPIC,)),
    format=JsonFormat(schema={"n": "int"}),
    transform="examples.odd_even.transform:parity",
    state=StateSpec(keys=("parity",), reducer="sum", column="n", output="total"),
    sinks=(
        SinkSpec(
            "sums",
            "postgres_upsert",
            {
                **_dsn,
                "table": SUMS_TABLE,
                "columns": {"parity": "text", "total": "bigint"},
                "key_columns": ["parity"],
            },
        ),
    ),
    max_records_per_partition=10_000,
)
