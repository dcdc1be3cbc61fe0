"""The soak's keyed-state pipeline: running sums of the workload's ids by parity, on the soak's shared topic.

It reads the very records the harness's records and table pipelines read (`tests.faults.pipelines`), so
one workload is the expected input of every sink kind and of the keyed state. Named from the same
``ONCEFLOW_FAULTS_*`` variables, so spark-submit and the driver processes build the same spec.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from onceflow.pipeline import KafkaSource, Pipeline, SinkSpec, StateSpec
from tests.faults.pipelines import FORMAT, MAX_RECORD_BYTES

KEYED_PATH = "tests.faults.soak_pipelines:KEYED"


def parity(frame: Any) -> Any:
    """(parity, id) rows; the keyed state sums the ids of each parity. Runs on Spark executors."""
    from pyspark.sql import functions as F

    return frame.select(F.when(F.col("id") % 2 == 0, "even").otherwise("odd").alias("parity"), "id")


def keyed_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """Keyed state (reducer ``sum``) whose per-parity totals go to PostgreSQL by upsert."""
    source = os.environ if env is None else env
    table = source.get("ONCEFLOW_FAULTS_TABLE", "faults_keyed")
    return Pipeline(
        name=source.get("ONCEFLOW_FAULTS_NAME", "faults-keyed"),
        source=KafkaSource(topics=(source.get("ONCEFLOW_FAULTS_TOPIC", "faults-in"),)),
        format=FORMAT,
        transform=f"{__name__}:parity",
        state=StateSpec(keys=("parity",), reducer="sum", column="id", output="total"),
        sinks=(
            SinkSpec(
                "sums",
                "postgres_upsert",
                {
                    "table": f"{table}_sums",
                    "columns": {"parity": "text", "total": "bigint"},
                    "key_columns": ["parity"],
                },
            ),
        ),
        max_record_bytes=MAX_RECORD_BYTES,
    )


def expected_sums(ids: Iterable[int]) -> dict[str, int]:
    """What a fault-free run holds: each good id counted once, in its parity's total."""
    sums: dict[str, int] = {}
    for i in ids:
        key = "even" if i % 2 == 0 else "odd"
        sums[key] = sums.get(key, 0) + i
    return sums


KEYED = keyed_pipeline()
