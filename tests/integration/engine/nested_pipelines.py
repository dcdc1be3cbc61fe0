"""Nested-record pipelines for the engine tests, built from the same environment variables as
`tests.integration.engine.pipelines` (the spark-submit child imports this module by its dotted path)."""

from __future__ import annotations

import os

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec, StateSpec
from onceflow.schemas import nullable

ORDER_SCHEMA = {
    "id": "int",
    "items": [{"sku": "string", "qty": "int"}],
    "ctx": {"ip": "string", "tags": nullable(["string"])},
    "counts": "map<string,int>?",
}


def _pipeline(suffix: str, transform: str, *, state: StateSpec | None = None) -> Pipeline:
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-{suffix}",
        source=KafkaSource(topics=(os.environ.get("ONCEFLOW_TEST_TOPIC", "engine-test"),)),
        format=JsonFormat(schema=ORDER_SCHEMA),
        transform=f"tests.integration.engine.nested_pipelines:{transform}",
        state=state,
        sinks=(
            SinkSpec(
                "out",
                "files",
                {"root": os.environ.get("ONCEFLOW_TEST_FILES", "/tmp/onceflow-engine-test"), "table": suffix},
            ),
        ),
        max_records_per_task=7,
    )


def one_row_per_item(frame):  # type: ignore[no-untyped-def]
    """explode() over the items, and fields of the nested context by their paths."""
    from pyspark.sql import functions as F

    items = frame.select("id", F.explode("items").alias("item"), F.col("ctx.ip").alias("ip"))
    return items.select("id", "item.sku", "item.qty", "ip")


def quantity_per_order(frame):  # type: ignore[no-untyped-def]
    """transform() and aggregate() over each order's items; the nested context kept for the state key."""
    from pyspark.sql import functions as F

    quantities = F.transform("items", lambda item: item["qty"])
    total = F.aggregate(quantities, F.lit(0).cast("long"), lambda acc, qty: acc + qty)
    return frame.select("ctx", total.alias("qty"))


ITEMS = _pipeline("items", "one_row_per_item")
PER_IP = _pipeline(
    "per_ip", "quantity_per_order", state=StateSpec(keys=("ctx.ip",), reducer="sum", column="qty")
)
