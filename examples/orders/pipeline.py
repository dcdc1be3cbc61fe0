"""The orders pipeline spec.

Input: JSON orders on the topic ``orders``: ``order_id``, ``customer``, ``amount``, ``currency``, when
it was placed (``placed_at``, ISO-8601 text with its offset, read as a UTC timestamp) and its
``items``, an array of objects (``sku``, ``qty``, ``price``). Records that are not such JSON are
dead-lettered by the decoder (with their reason, in the ledger); orders that decode but break a
business rule are routed by the transform to the ``orders_rejected`` table, with their reason. Valid
orders go, exactly once, to

* the PostgreSQL table ``orders`` (two-phase commit: PREPARE TRANSACTION per task, COMMIT PREPARED by
  the coordinator), and
* the Kafka topic ``orders-enriched`` (staged, published by the coordinator in one transaction per slice),
  as JSON with the amount converted to EUR and a size class.

The PostgreSQL table keeps ``items`` as the number of lines and ``quantity`` as the units over them,
both computed by the transform from the nested items.

Names come from environment variables so that a demo or a test can run on fresh topics and tables:
``ONCEFLOW_ORDERS_SUFFIX`` is appended to the pipeline, topic and table names (empty by default), and
``ONCEFLOW_ORDERS_PG_DSN`` points the sinks at another database (default: ONCEFLOW_PG_DSN).
"""

from __future__ import annotations

import os
from pathlib import Path

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

SUFFIX = os.environ.get("ONCEFLOW_ORDERS_SUFFIX", "")
NAME = f"orders{SUFFIX}"
INPUT_TOPIC = f"orders{SUFFIX}"
ENRICHED_TOPIC = f"orders-enriched{SUFFIX}"
ORDERS_TABLE = f"orders{SUFFIX}".replace("-", "_")
REJECTED_TABLE = f"orders_rejected{SUFFIX}".replace("-", "_")
STAGING = Path(os.environ.get("ONCEFLOW_HOME") or Path.cwd() / ".onceflow") / "staging" / NAME

_dsn = {"dsn": os.environ["ONCEFLOW_ORDERS_PG_DSN"]} if os.environ.get("ONCEFLOW_ORDERS_PG_DSN") else {}

ORDERS = Pipeline(
    name=NAME,
    source=KafkaSource(topics=(INPUT_TOPIC,)),
    format=JsonFormat(
        schema={
            "order_id": "int",
            "customer": "string",
            "amount": "float",
            "currency": "string",
            "placed_at": "timestamp",
            "items": [{"sku": "string", "qty": "int", "price": "float"}],
        }
    ),
    transform="examples.orders.transform:validate_and_enrich",
    sinks=(
        SinkSpec(
            "orders_pg",
            "postgres_2pc",
            {
                **_dsn,
                "table": ORDERS_TABLE,
                "columns": {
                    "order_id": "bigint",
                    "customer": "text",
                    "amount": "double precision",
                    "currency": "text",
                    "placed_at": "timestamptz",
                    "items": "integer",
                    "quantity": "bigint",
                    "amount_eur": "double precision",
                },
            },
        ),
        SinkSpec(
            "orders_rejected",
            "postgres_2pc",
            {
                **_dsn,
                "table": REJECTED_TABLE,
                "columns": {"order_id": "bigint", "reason": "text", "_topic": "text", "_offset": "bigint"},
            },
        ),
        SinkSpec(
            "orders_enriched",
            "kafka",
            {"topic": ENRICHED_TOPIC, "staging_root": str(STAGING / "kafka")},
        ),
    ),
    slices=2,
    max_records_per_partition=5_000,
    max_records_per_task=2_000,
)
