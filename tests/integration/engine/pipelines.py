"""Pipelines for the engine tests, built from environment variables so that the spark-submit child
process (which imports this module by its dotted path) sees the same unique topic and table names."""

from __future__ import annotations

import os
from dataclasses import replace

from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec


def orders_pipeline() -> Pipeline:
    name = os.environ.get("ONCEFLOW_TEST_PIPELINE", "engine-test")
    return Pipeline(
        name=name,
        source=KafkaSource(topics=(os.environ.get("ONCEFLOW_TEST_TOPIC", "engine-test"),)),
        format=JsonFormat(schema={"id": "int", "amount": "float", "customer": "string"}),
        transform="tests.integration.engine.pipelines:enrich",
        sinks=(
            SinkSpec(
                "orders_pg",
                "postgres_2pc",
                {
                    "table": os.environ.get("ONCEFLOW_TEST_TABLE", "engine_test_orders"),
                    "columns": {"id": "bigint", "amount": "double precision", "customer": "text"},
                },
            ),
            SinkSpec(
                "orders_files",
                "files",
                {
                    "root": os.environ.get("ONCEFLOW_TEST_FILES", "/tmp/onceflow-engine-test"),
                    "table": "orders",
                },
            ),
        ),
        slices=2,
        max_records_per_task=7,
    )


def enrich(frame):  # type: ignore[no-untyped-def]
    """Keep positive amounts and the columns the sinks take."""
    return frame.where(frame.amount > 0).select("id", "amount", "customer")


ORDERS = orders_pipeline()


def replicate_pipeline() -> Pipeline:
    """The orders pipeline without its transform: records go straight to the sinks, so it runs locally."""
    orders = orders_pipeline()
    return replace(
        orders,
        name=f"{orders.name}-replica",
        transform=None,
        sinks=(
            replace(orders.sinks[0], name="replica_pg"),
            replace(
                orders.sinks[1], name="replica_files", config={**orders.sinks[1].config, "table": "replica"}
            ),
        ),
    )


REPLICATE = replicate_pipeline()


def at_most_once_pipeline() -> Pipeline:
    """Decoded orders straight to a plain table, the offsets committed before processing."""
    orders = orders_pipeline()
    table = os.environ.get("ONCEFLOW_TEST_TABLE", "engine_test_orders") + "_amo"
    columns = {"id": "bigint", "amount": "double precision", "customer": "text"}
    return replace(
        orders,
        name=f"{orders.name}-amo",
        transform=None,
        guarantee="at_most_once",
        sinks=(SinkSpec("log", "plain", {"table": table, "columns": columns}),),
    )


AT_MOST_ONCE = at_most_once_pipeline()


def replacing_pipeline() -> Pipeline:
    """Orders to Parquet and an upsert table, replacing an interval's output when it is re-run."""
    replica = replicate_pipeline()
    table = os.environ.get("ONCEFLOW_TEST_TABLE", "engine_test_orders") + "_upsert"
    columns = {"id": "bigint", "amount": "double precision", "customer": "text"}
    return replace(
        replica,
        name=f"{replica.name}-replacing",
        on_rerun="replace",
        sinks=(
            replace(replica.sinks[1], config={**replica.sinks[1].config, "table": "replaced"}),
            SinkSpec(
                "upsert", "postgres_upsert", {"table": table, "columns": columns, "key_columns": ["id"]}
            ),
        ),
    )


REPLACING = replacing_pipeline()


# Seconds each partition of the slow pipeline's transform sleeps on an executor, so that a fault can
# land while its tasks run.
SLOW_PARTITION_S = 1.5


def enrich_slowly(frame):  # type: ignore[no-untyped-def]
    """`enrich`, with every partition held for SLOW_PARTITION_S on its executor."""
    pause = SLOW_PARTITION_S

    def held(batches):  # type: ignore[no-untyped-def]
        import time

        time.sleep(pause)
        yield from batches

    kept = enrich(frame)
    return kept.mapInArrow(held, kept.schema)


def slow_pipeline() -> Pipeline:
    """The orders pipeline in one slice whose tasks take seconds: for faults of the Spark cluster."""
    orders = orders_pipeline()
    return replace(
        orders,
        name=f"{orders.name}-slow",
        transform="tests.integration.engine.pipelines:enrich_slowly",
        slices=1,
        max_records_per_task=10,
    )


SLOW = slow_pipeline()


def speculative_pipeline() -> Pipeline:
    """The orders pipeline in one slice of six tasks per sink: for speculation on the cluster."""
    orders = orders_pipeline()
    return replace(orders, name=f"{orders.name}-spec", slices=1, max_records_per_task=10)


SPECULATIVE = speculative_pipeline()


def ordered_pipeline() -> Pipeline:
    """Records with their source position to Parquet files and a Kafka topic (keyed by source
    partition), through a narrow transform: for the order of each source partition in the outputs."""
    files = os.environ.get("ONCEFLOW_TEST_FILES", "/tmp/onceflow-engine-test")
    return Pipeline(
        name=os.environ.get("ONCEFLOW_TEST_PIPELINE", "engine-test") + "-ordered",
        source=KafkaSource(topics=(os.environ.get("ONCEFLOW_TEST_TOPIC", "engine-test"),)),
        format=JsonFormat(schema={"id": "int", "payload": "string"}),
        transform="tests.integration.engine.pipelines:tag",
        sinks=(
            SinkSpec("ordered_files", "files", {"root": files, "table": "ordered"}),
            SinkSpec(
                "ordered_kafka",
                "kafka",
                {
                    "topic": os.environ.get("ONCEFLOW_TEST_OUT_TOPIC", "engine-test-out"),
                    "staging_root": f"{files}/kafka-staging",
                    "value_format": "json",
                    "key_column": "_partition",
                },
            ),
        ),
        slices=1,
        max_records_per_task=9,
    )


def tag(frame):  # type: ignore[no-untyped-def]
    """Drop every id that is 4 mod 5 and add a column: a transform that keeps each partition's rows."""
    return frame.where(frame.id % 5 != 4).withColumn("twice", frame.id * 2)


def tag_and_shuffle(frame):  # type: ignore[no-untyped-def]
    """`tag`, then every row dealt round-robin to other partitions: a transform that shuffles."""
    return tag(frame).repartition(2)


ORDERED = ordered_pipeline()
ORDERED_SHUFFLED = replace(ordered_pipeline(), transform="tests.integration.engine.pipelines:tag_and_shuffle")
# The same records and sinks without a transform, for the local executor.
ORDERED_PLAIN = replace(ordered_pipeline(), transform=None)
