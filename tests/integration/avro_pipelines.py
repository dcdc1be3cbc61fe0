"""An Avro pipeline for spark-submit tests, built from environment variables so that the child process
(which imports this module by its dotted path) sees the same topic, name and folder as the test."""

from __future__ import annotations

import os

from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec

AVRO_ORDERS = Pipeline(
    name=os.environ.get("AVRO_TEST_PIPELINE", "avro-test"),
    source=KafkaSource(topics=(os.environ.get("AVRO_TEST_TOPIC", "avro-test"),)),
    format=AvroFormat(subject="orders-value", key_field="order_key"),
    transform="tests.integration.avro_pipelines:big_orders",
    sinks=(
        SinkSpec(
            "orders",
            "files",
            {"root": os.environ.get("AVRO_TEST_FILES", "/tmp/onceflow-avro-test"), "table": "orders"},
        ),
    ),
)


def big_orders(frame):  # type: ignore[no-untyped-def]
    """Orders of at least 1.00, on Spark: the decoded decimal column compares as a number."""
    from pyspark.sql import functions as F

    return frame.where(F.col("amount") >= F.lit(1)).select("id", "amount", "at", "coupon", "order_key")
