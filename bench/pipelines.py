"""The benchmark pipelines as onceflow specs, importable by spark-submit as ``bench.pipelines:SPEC``.

The runner builds a spec in Python and passes it to the Spark job as JSON in ONCEFLOW_BENCH_SPEC
(spark-submit inherits the environment), so every run can use a fresh pipeline name, table and folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.dataset import MIN_AMOUNT, NESTED_PROJECTED, PROJECTED, SCHEMA
from onceflow.pipeline import Guarantee, JsonFormat, KafkaSource, Pipeline, RecordFormat, SinkSpec

SPEC_ENV = "ONCEFLOW_BENCH_SPEC"
SPEC_PATH = "bench.pipelines:SPEC"
TRANSFORM = "bench.pipelines:filter_project"
NESTED_TRANSFORM = "bench.pipelines:filter_project_nested"
PG_COLUMNS = {"id": "bigint", "amount": "double precision", "customer": "text"}
# The projected rows' columns in the table formats' type names (the Iceberg and Delta sinks share them).
TABLE_COLUMNS = {"id": "long", "amount": "double", "customer": "string"}

# What each measured configuration writes to: (guarantee, sink kind).
SINKS: dict[str, tuple[Guarantee, str]] = {
    "files": ("exactly_once", "files"),
    "postgres_2pc": ("exactly_once", "postgres_2pc"),
    "kafka": ("exactly_once", "kafka"),
    "plain": ("at_least_once", "plain"),
    "iceberg": ("exactly_once", "iceberg"),
    "delta": ("exactly_once", "delta"),
    # The same sinks with their output in the stack's bucket (`s3_root`) instead of the scratch folder.
    "files_s3": ("exactly_once", "files"),
    "iceberg_s3": ("exactly_once", "iceberg"),
}


def s3_root(workdir: Path) -> str:
    """The run's prefix in the stack's bucket (ONCEFLOW_S3_BUCKET): named after the run's scratch folder,
    so that no two runs share it, and deleted with it (`bench.run`)."""
    return f"s3://{os.environ.get('ONCEFLOW_S3_BUCKET', 'onceflow')}/{workdir.name}"


def filter_project(frame: Any) -> Any:
    """The benchmark's work after decoding: keep amount >= MIN_AMOUNT, project three columns."""
    return frame.where(frame.amount >= MIN_AMOUNT).select(*PROJECTED)


def filter_project_nested(frame: Any) -> Any:
    """The nested data set's work: the same filter, the three columns and the items as they came."""
    return frame.where(frame.amount >= MIN_AMOUNT).select(*NESTED_PROJECTED)


def kafka_records(frame: Any) -> Any:
    """The Kafka sink's rows: the projected record as JSON value, its id as key."""
    from pyspark.sql import functions as F

    projected = filter_project(frame)
    return projected.select(
        F.col("id").cast("string").alias("key"), F.to_json(F.struct(*PROJECTED)).alias("value")
    )


def sink_spec(config: str, name: str, workdir: Path, output_topic: str | None = None) -> SinkSpec:
    """One sink of the given configuration; ``name`` makes its table, folder or topic unique."""
    kind = SINKS[config][1]
    table = name.replace("-", "_")
    in_bucket = config.endswith("_s3")
    if kind == "files":
        root = f"{s3_root(workdir)}/files" if in_bucket else str(workdir / "files")
        return SinkSpec("out", kind, {"root": root, "table": table})
    if kind == "kafka":
        assert output_topic is not None, "a Kafka sink needs its output topic"
        return SinkSpec("out", kind, {"topic": output_topic, "staging_root": str(workdir / "kafka-staging")})
    if kind == "iceberg":
        from onceflow.sinks.iceberg import default_catalog_properties

        # A catalog of the run's own, in its scratch folder, named after it: a table per pipeline. In the
        # bucket: the same SQLite catalog file, another catalog in it, whose warehouse is the run's prefix.
        properties = default_catalog_properties(workdir)
        if in_bucket:
            properties["warehouse"] = f"{s3_root(workdir)}/iceberg"
        catalog = {
            "table": f"bench.{table}",
            "catalog": f"bench_{workdir.name.replace('-', '_')}{'_s3' if in_bucket else ''}",
            "catalog_properties": properties,
            "columns": TABLE_COLUMNS,
        }
        return SinkSpec("out", kind, catalog)
    if kind == "delta":
        return SinkSpec("out", kind, {"path": str(workdir / "delta" / table), "columns": TABLE_COLUMNS})
    return SinkSpec("out", kind, {"table": table, "columns": PG_COLUMNS})


def bench_pipeline(
    config: str,
    name: str,
    topic: str,
    workdir: Path,
    *,
    batch_per_partition: int,
    output_topic: str | None = None,
    fmt: RecordFormat | None = None,
    transform: str | None = None,
    max_records_per_task: int | None = None,
) -> Pipeline:
    """``fmt``: the data set's format where it is not the flat JSON one (the Avro step's Avro, the
    nested step's JSON), with its ``transform``; ``max_records_per_task``: the pipeline's default unless
    given (the cuts step sets it)."""
    guarantee = SINKS[config][0]
    tasks = {} if max_records_per_task is None else {"max_records_per_task": max_records_per_task}
    return Pipeline(
        name=name,
        source=KafkaSource(topics=(topic,)),
        format=fmt or JsonFormat(schema=SCHEMA),
        transform=transform or ("bench.pipelines:kafka_records" if config == "kafka" else TRANSFORM),
        sinks=(sink_spec(config, name, workdir, output_topic),),
        guarantee=guarantee,
        max_records_per_partition=batch_per_partition,
        **tasks,
    )


def _from_env() -> Pipeline | None:
    text = os.environ.get(SPEC_ENV)
    return Pipeline.from_json(text) if text else None


SPEC = _from_env()
