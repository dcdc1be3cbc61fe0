"""The Spark driver of one slice of one epoch (what `spark_jobs/onceflow_process.py` runs).

Steps:
1. Read the epoch from the ledger; do nothing unless it is PLANNED with the given attempt token (a
   retried or late job must not touch an epoch that has moved on).
2. Recompute the slice's read tasks from the epoch's ranges (a pure function, so all processes agree).
3. Executors read exactly those ranges and decode them; bad records go to the ledger as dead letters.
4. Apply the pipeline's transform (DataFrame in, DataFrame or {sink: DataFrame} out); a stateful
   pipeline then folds the output into the last committed state (`onceflow.state.fold`), and its sinks
   receive the new value of every key the epoch touched.
5. For each sink, and the state snapshot, write one output partition per read task; each task stages
   its output and reports its pre-commit to the ledger, which accepts one attempt per (sink, task).
6. Fail (non-zero exit) when any task was refused for a reason other than losing to another attempt,
   so that the orchestrator aborts the epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from onceflow.config import Settings
from onceflow.engine.arrow_rows import arrow_schema, batch_rows, row_batches
from onceflow.engine.planning import replaced_epochs, slices_of
from onceflow.engine.task_io import LOST_TO_ANOTHER_ATTEMPT, EpochRef, TaskResult, read_tasks, write_task
from onceflow.errors import ConfigError, OnceflowError
from onceflow.faults import crash_point
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import Pipeline, SinkSpec, load_pipeline
from onceflow.records import spark_schema
from onceflow.sources.kafka_planning import ReadTask
from onceflow.state.store import committed_state_files, state_sink


class SliceFailed(OnceflowError):
    """Some task of the slice was refused by the ledger; the epoch must be aborted and replayed."""


def sink_columns(sink: SinkSpec) -> list[str] | None:
    """The columns a sink accepts, when its configuration names them (rows must match exactly)."""
    if sink.kind == "kafka":
        return None if sink.config.get("value_format") == "json" else ["key", "value"]
    columns = sink.config.get("columns")
    if isinstance(columns, Mapping):
        return list(columns)
    if isinstance(columns, list):
        return [c[0] if isinstance(c, list | tuple) else str(c) for c in columns]
    return None


def _log(message: str) -> None:
    print(f"[onceflow slice] {message}", file=sys.stderr, flush=True)


def slice_tasks(
    spec: Pipeline, epoch_number: int, slice_number: int, attempt_token: str, settings: Settings
) -> tuple[EpochRef, list[ReadTask]]:
    """Steps 1 and 2, shared by the Spark job and the local executor: check the epoch, list the tasks."""
    # 1. The epoch must still be PLANNED under this token.
    ledger = Ledger.connect(settings.ledger_url)
    try:
        epoch = ledger.epoch(spec.name, epoch_number)
        replaces = replaced_epochs(spec, ledger, epoch)
    finally:
        ledger.close()
    runnable = epoch.status == EpochStatus.PLANNED or (
        spec.commits_before_processing and epoch.status == EpochStatus.COMMITTED
    )
    if not runnable or epoch.attempt_token != attempt_token:
        raise SliceFailed(
            f"{epoch} is {epoch.status} with another attempt token than this job's; nothing was processed"
            if epoch.attempt_token != attempt_token
            else f"{epoch} is {epoch.status}; a slice job only runs for a PLANNED epoch"
        )
    # 2. The slice's read tasks.
    plan = slices_of(spec, epoch.ranges)[slice_number]
    _log(f"{epoch}: slice {slice_number} has {len(plan.tasks)} read tasks over {len(plan.ranges)} partitions")
    ref = EpochRef(
        pipeline=spec,
        epoch=epoch_number,
        attempt_token=attempt_token,
        slice=slice_number,
        slice_ranges=plan.ranges,
        bootstrap=settings.kafka_bootstrap,
        ledger_url=settings.ledger_url,
        replaces=replaces,
    )
    return ref, list(plan.tasks)


def judge(slice_number: int, tasks: int, results: list[TaskResult]) -> dict[str, Any]:
    """Step 6: log each task's outcome; raise `SliceFailed` if any task was refused."""
    refused = [r for r in results if not r.accepted and r.reason != LOST_TO_ANOTHER_ATTEMPT]
    for r in results:
        _log(
            f"sink {r.sink} task {r.task}: {r.records} records, "
            + ("pre-committed" if r.accepted else f"not accepted ({r.reason})")
        )
    if refused:
        raise SliceFailed(
            f"{len(refused)} tasks of slice {slice_number} were refused by the ledger: "
            + "; ".join(f"{r.sink}/{r.task}: {r.reason}" for r in refused)
        )
    return {"slice": slice_number, "tasks": tasks, "results": [r.__dict__ for r in results]}


def run_slice(
    spec: Pipeline, epoch_number: int, slice_number: int, attempt_token: str, settings: Settings
) -> dict[str, Any]:
    """Process one slice; returns a summary (records read, written per sink, dead letters, refusals)."""
    from pyspark.sql import SparkSession

    ref, tasks = slice_tasks(spec, epoch_number, slice_number, attempt_token, settings)
    if not tasks:
        return {"slice": slice_number, "tasks": 0, "results": []}

    spark = (
        SparkSession.builder.appName(f"onceflow-{spec.name}-e{epoch_number}-s{slice_number}")
        # Output partitions are participants: their number is fixed when the query is planned. Adaptive
        # execution changes it at run time (coalescing, local shuffle readers after a join turns into a
        # broadcast, skew splits), so a partition could have no participant: it is off in slice jobs.
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    try:
        # 3. Exact reads, decoded on the executors: Spark task i reads read task i, and its rows cross
        # to the JVM as Arrow batches.
        schema = spark_schema(spec.format)
        batch_schema = arrow_schema(schema)

        def read(batches: Iterable[Any]) -> Iterator[Any]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from row_batches(read_tasks(ref, [tasks[index]]), batch_schema)

        frame = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(read, schema)

        # 4. The transform, then the fold into keyed state.
        output = spec.load_transform()(frame)
        writes = _outputs(spark, spec, settings, output)
        if len(writes) > 1:
            frame.persist()  # each write is a Spark action: read Kafka once, not once per sink

        # 5. One output partition per read task, for each sink and the state snapshot.
        results: list[TaskResult] = []
        for sink, frame_out in writes:
            results += _write_sink(ref, sink, frame_out, [t.task_id for t in tasks])
    finally:
        spark.stop()
    crash_point("slice_after_precommits")

    # 6. Judge the outcome.
    return judge(slice_number, len(tasks), results)


def _outputs(spark: Any, spec: Pipeline, settings: Settings, output: Any) -> list[tuple[SinkSpec, Any]]:
    """What each participant writes: the transform's output per sink, then the new state snapshot."""
    snapshot_sink = state_sink(spec, settings)
    if spec.state is None or snapshot_sink is None:
        outputs = output if isinstance(output, dict) else {sink.name: output for sink in spec.sinks}
        missing = [sink.name for sink in spec.sinks if sink.name not in outputs]
        if missing:
            raise SliceFailed(f"the transform returned no DataFrame for sinks {missing}")
        return [(sink, outputs[sink.name]) for sink in spec.sinks]
    if isinstance(output, dict):
        raise SliceFailed("a stateful pipeline's transform must return one DataFrame, not one per sink")
    from onceflow.state.fold import fold_epoch

    try:
        touched, snapshot = fold_epoch(spark, spec.state, output, committed_state_files(spec, settings))
    except ConfigError as exc:
        raise SliceFailed(str(exc)) from exc
    return [*((sink, touched) for sink in spec.sinks), (snapshot_sink, snapshot)]


def _write_sink(ref: EpochRef, sink: SinkSpec, frame: Any, task_ids: list[str]) -> list[TaskResult]:
    from pyspark import TaskContext as SparkTaskContext

    columns = sink_columns(sink)
    if columns is not None:
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise SliceFailed(
                f"sink {sink.name!r} needs columns {missing} that the transform's output "
                f"({frame.columns}) does not have"
            )
        frame = frame.select(*columns)
    if frame.rdd.getNumPartitions() != len(task_ids):
        frame = frame.repartition(len(task_ids))

    result_schema = _result_schema()
    result_arrow = arrow_schema(result_schema)

    def write(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        context = SparkTaskContext.get()
        assert context is not None, "write() runs inside a Spark task"
        index = context.partitionId()
        if index >= len(task_ids):
            raise SliceFailed(
                f"output partition {index} of sink {sink.name!r} has no participant: the query ran with "
                f"more partitions than its {len(task_ids)} tasks (was adaptive execution re-enabled?)"
            )
        attempt = f"{context.stageId()}.{index}.{context.taskAttemptId()}"
        result = write_task(ref, sink, task_ids[index], attempt, batch_rows(batches))
        yield pa.RecordBatch.from_pylist([dataclasses.asdict(result)], schema=result_arrow)

    return [TaskResult(**row.asDict()) for row in frame.mapInArrow(write, result_schema).collect()]


def _result_schema() -> Any:
    """What each output task reports back to the driver: a `TaskResult` as a Spark row."""
    from pyspark.sql import types as T

    text, count = T.StringType(), T.LongType()
    fields = {"sink": text, "task": text, "attempt": text, "records": count, "accepted": T.BooleanType()}
    return T.StructType(
        [*(T.StructField(n, t, False) for n, t in fields.items()), T.StructField("reason", text)]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Process one slice of one onceflow epoch.")
    parser.add_argument("--pipeline", required=True, help="the pipeline spec as module:attribute")
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--slice", type=int, required=True)
    parser.add_argument("--attempt-token", required=True)
    args = parser.parse_args(argv)
    spec = load_pipeline(args.pipeline)
    try:
        summary = run_slice(spec, args.epoch, args.slice, args.attempt_token, Settings.from_env())
    except OnceflowError as exc:
        _log(f"failed: {exc}")
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
