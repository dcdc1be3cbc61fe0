"""A PostgreSQL table mirrored through Debezium and Kafka into a PostgreSQL replica and an Iceberg table,
inserts, updates and deletes applied by key, exactly once, each source transaction whole.

The source is the table ``customers`` of the local PostgreSQL, captured by Debezium's PostgreSQL
connector on the stack's Kafka Connect (``python -m examples.cdc_mirror.source start`` registers it:
JSON with the converter's schemas, transaction metadata on). The pipeline reads its change topic and
Debezium's transaction topic; the sinks apply each epoch's changes by key:

* ``replica``: the table ``customers_replica`` in the sinks' PostgreSQL (`postgres_changes`);
* ``lake``: the Iceberg table ``cdc.customers`` of the default catalog (`iceberg_changes`), one
  snapshot per epoch.

``CDC_MIRROR_V2`` is the same pipeline after the source table got a column (``tier``): the plan takes
the new nullable field and adds the column to both mirrors before the epoch writes.
``ONCEFLOW_CDC_MIRROR_SUFFIX`` is appended to every name (pipeline, tables, topics, connector), so that
several runs can share a stack. The source and the replica are in the deployment's PostgreSQL
(``ONCEFLOW_PG_DSN``).
"""

from __future__ import annotations

import os
from typing import Any

from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec

SUFFIX = os.environ.get("ONCEFLOW_CDC_MIRROR_SUFFIX", "")
NAME = f"cdc_mirror{SUFFIX}"
SOURCE_TABLE = f"customers{SUFFIX.replace('-', '_')}"
REPLICA_TABLE = f"{SOURCE_TABLE}_replica"
LAKE_TABLE = f"cdc.{SOURCE_TABLE}"
TOPIC_PREFIX = f"cdc-mirror{SUFFIX}"  # the connector's topic.prefix
TOPIC = f"{TOPIC_PREFIX}.public.{SOURCE_TABLE}"
TRANSACTIONS = f"{TOPIC_PREFIX}.transaction"

# The source table's rows as the pipeline reads them, and the mirrors' columns.
SCHEMA: dict[str, Any] = {
    "id": "int",
    "name": "string",
    "email": "string?",
    "balance": "decimal(12,2)?",
    "updated_at": "timestamp",
}
PG_COLUMNS = {
    "id": "bigint",
    "name": "text",
    "email": "text",
    "balance": "numeric(12,2)",
    "updated_at": "timestamptz",
}
LAKE_COLUMNS = {
    "id": "long",
    "name": "string",
    "email": "string",
    "balance": "decimal(12,2)",
    "updated_at": "timestamptz",
}


def _pipeline(schema: dict[str, Any], pg_columns: dict[str, str], lake_columns: dict[str, str]) -> Pipeline:
    replica = {"table": REPLICA_TABLE, "columns": pg_columns, "key_columns": ["id"]}
    lake = {"table": LAKE_TABLE, "columns": lake_columns, "key_columns": ["id"]}
    return Pipeline(
        name=NAME,
        source=KafkaSource(topics=(TOPIC,)),
        format=JsonFormat(schema=schema, changes=Debezium(key=("id",), transactions=TRANSACTIONS)),
        sinks=(
            SinkSpec("replica", "postgres_changes", replica),
            SinkSpec("lake", "iceberg_changes", lake),
        ),
        slices=1,
    )


CDC_MIRROR = _pipeline(SCHEMA, PG_COLUMNS, LAKE_COLUMNS)
CDC_MIRROR_V2 = _pipeline(
    {**SCHEMA, "tier": "string?"}, {**PG_COLUMNS, "tier": "text"}, {**LAKE_COLUMNS, "tier": "string"}
)
