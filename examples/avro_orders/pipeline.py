"""Avro orders from Kafka into PostgreSQL, exactly once, while the producer moves to a new schema.

Input: orders in the schema registry wire format on the topic ``avro-orders``, written with
``schemas/order-v1.avsc`` (id as int, no channel) and later ``schemas/order-v2.avsc`` (id as long, a
nullable ``channel`` with a default). The pipeline reads both with the v2 reader schema (Avro's
resolution widens the id and gives v1 orders ``channel = NULL``) into the table ``avro_orders`` (two-phase
commit), with each order's key, partition and offset. The registry is the deployment's
(``ONCEFLOW_SCHEMA_REGISTRY_URL``): a registry server (`infra/registry.sh start`), or this folder of
schemas, ``file://<checkout>/examples/avro_orders/schemas``. No transform: it also runs without Spark.

``ONCEFLOW_AVRO_ORDERS_SUFFIX`` is appended to the pipeline, topic and table names (empty by default),
and ``ONCEFLOW_AVRO_ORDERS_PG_DSN`` points the sink at another database (default: ONCEFLOW_PG_DSN).
"""

from __future__ import annotations

import os
from pathlib import Path

from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec

SCHEMAS = Path(__file__).resolve().parent / "schemas"
SUBJECT = "avro-orders-value"
SUFFIX = os.environ.get("ONCEFLOW_AVRO_ORDERS_SUFFIX", "")
NAME = f"avro_orders{SUFFIX}"
INPUT_TOPIC = f"avro-orders{SUFFIX}"
TABLE = f"avro_orders{SUFFIX}".replace("-", "_")

_dsn = (
    {"dsn": os.environ["ONCEFLOW_AVRO_ORDERS_PG_DSN"]}
    if os.environ.get("ONCEFLOW_AVRO_ORDERS_PG_DSN")
    else {}
)

AVRO_ORDERS = Pipeline(
    name=NAME,
    source=KafkaSource(topics=(INPUT_TOPIC,)),
    format=AvroFormat(schema_file=str(SCHEMAS / "order-v2.avsc"), key_field="order_key"),
    sinks=(
        SinkSpec(
            "avro_orders_pg",
            "postgres_2pc",
            {
                **_dsn,
                "table": TABLE,
                "columns": {
                    "id": "bigint",
                    "customer": "text",
                    "amount": "numeric(12,2)",
                    "placed_at": "timestamptz",
                    "channel": "text",
                    "order_key": "text",
                    "_partition": "integer",
                    "_offset": "bigint",
                },
            },
        ),
    ),
)
