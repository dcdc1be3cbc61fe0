"""The clicks pipeline spec: JSON clicks from Kafka into a PostgreSQL table, exactly once, no transform.

Input: JSON ``{"user_id": ..., "page": ..., "ms": ...}`` on the topic ``clicks``. Each decoded click
becomes a row of the table ``clicks`` (two-phase commit), with its partition and offset; records that are
not clicks are dead letters. Without transform and state it also runs without Spark
(``onceflow run --executor local``, or ``ONCEFLOW_EXECUTOR=local`` for its DAG's process tasks).

``ONCEFLOW_CLICKS_SUFFIX`` is appended to the pipeline, topic and table names (empty by default), and
``ONCEFLOW_CLICKS_PG_DSN`` points the sink at another database (default: ONCEFLOW_PG_DSN).
"""

from __future__ import annotations

import os

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

SUFFIX = os.environ.get("ONCEFLOW_CLICKS_SUFFIX", "")
NAME = f"clicks{SUFFIX}"
INPUT_TOPIC = f"clicks{SUFFIX}"
CLICKS_TABLE = f"clicks{SUFFIX}".replace("-", "_")

_dsn = {"dsn": os.environ["ONCEFLOW_CLICKS_PG_DSN"]} if os.environ.get("ONCEFLOW_CLICKS_PG_DSN") else {}

CLICKS = Pipeline(
    name=NAME,
    source=KafkaSource(topics=(INPUT_TOPIC,)),
    format=JsonFormat(schema={"user_id": "string", "page": "string", "ms": "int"}),
    sinks=(
        SinkSpec(
            "clicks_pg",
            "postgres_2pc",
            {
                **_dsn,
                "table": CLICKS_TABLE,
                "columns": {
                    "user_id": "text",
                    "page": "text",
                    "ms": "bigint",
                    "_partition": "integer",
                    "_offset": "bigint",
                },
            },
        ),
    ),
)
