"""Cuts toward the machine's limit, each measured beside the code before it, in alternating rounds.

- **Batches** (`read_task`): one read task's Python work, record by record as the Python read path did
  before (a record object, a `RowDecoder` call, a row tuple and a generator step per record, then a
  transposition into Arrow columns) against a fetched batch at a time (`read_task_batches`: the
  batch's columns read straight from the Kafka client's messages, Arrow's JSON reader where it agrees
  with the record-by-record decoder). One read task of 250,000 records of the data set's first
  partition, in the bench's process, so that the figure is the Python worker's own work without Spark.
- **Larger read tasks** (`task_size`): the files pipeline end to end on the runtime, its read tasks
  50,000 offsets long (the earlier default) against 250,000 (the default now), every epoch 10^6
  records, as in the throughput step.

Every round runs both sides back to back on the same records, the second round in the other order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.dataset import PARTITIONS, Dataset
from bench.pipelines import bench_pipeline
from onceflow.config import Settings
from onceflow.offsets import OffsetRange

# Read-task lengths of the task-size cut: the earlier default, then the one now.
TASK_SIZES = (50_000, 250_000)
READ_TASK_RECORDS = 250_000


def read_task_rounds(
    settings: Settings, data: Dataset, workdir: Path, runs: int, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """``runs`` rounds of one read task, record by record and in batches (records/s of each; the two
    give the same Arrow rows, which each round checks)."""
    import pyarrow as pa

    from onceflow.engine.jvm_read import decoded_schema
    from onceflow.executor.arrow_rows import arrow_schema, row_batches
    from onceflow.executor.reading import read_task, read_task_batches
    from onceflow.executor.rejected import with_dead_letters
    from onceflow.executor.slices import SliceRef
    from onceflow.sources.kafka_planning import ReadTask

    spec = bench_pipeline("files", "bench-cuts", data.topic, workdir, batch_per_partition=READ_TASK_RECORDS)
    length = min(READ_TASK_RECORDS, data.records // PARTITIONS)
    task = ReadTask("cut-0", 0, OffsetRange(data.topic, 0, 0, length))
    ref = SliceRef(spec, 1, 0, (task.range,), settings.kafka_bootstrap, settings=settings)
    schema = decoded_schema(ref)
    batch_schema = arrow_schema(schema)
    width = len(schema.fields) - 1

    def one_by_one() -> Any:
        return pa.Table.from_batches(
            list(row_batches(with_dead_letters(read_task(ref, task), width), batch_schema)), batch_schema
        )

    def batches() -> Any:
        return pa.Table.from_batches(list(read_task_batches(ref, task, batch_schema)), batch_schema)

    sides = {"record_by_record": one_by_one, "batches": batches}
    rounds = []
    for n in range(runs):
        entry: dict[str, Any] = {"records": length}
        tables = {}
        for key, side in reversed(sides.items()) if n % 2 else sides.items():
            started = time.perf_counter()
            tables[key] = side()
            entry[key] = {"records_per_s": length / (time.perf_counter() - started)}
        if not tables["batches"].equals(tables["record_by_record"]):
            raise RuntimeError("the read task's batches differ from its rows read record by record")
        rounds.append(entry)
        rates = {key: f"{entry[key]['records_per_s']:,.0f}/s" for key in sides}
        say(f"read task, round {n + 1}: " + ", ".join(f"{key} {rate}" for key, rate in rates.items()))
    return rounds


def task_size_summary(entry: dict[str, Any]) -> str:
    """A task-size round's log line."""
    return ", ".join(
        f"tasks of {records:,}: {entry[f'tasks_{records}']['records_per_s']:,.0f}/s" for records in TASK_SIZES
    )
