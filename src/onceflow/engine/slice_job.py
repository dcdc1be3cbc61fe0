"""The driver of one slice of one epoch: the steps below, whichever way the Spark session is reached.

Two drivers run them: `spark_jobs/onceflow_process.py` (one spark-submit per slice, `submitted_session`)
and a Spark Connect client in the caller's process (`onceflow.engine.connect`), which sends the same
queries to a long-lived server. Only the session differs; the ledger connection stays in the driver.

Steps:
1. Open the ledger once (the slice's only connection: tasks never touch it) and check that the epoch is
   still PLANNED under this job's attempt token (a retried or late job must not touch an epoch that has
   moved on); keep the owner's lease alive while the slice runs.
2. Recompute the slice's read tasks from the epoch's ranges (a pure function, so all processes agree).
3. Executors read exactly those ranges and decode them; rows and dead letters come back apart.
4. Apply the pipeline's transform (DataFrame in, DataFrame or {sink: DataFrame} out); a stateful
   pipeline then folds the output into the last committed state (`onceflow.state.fold`), and its sinks
   receive the new value of every key the epoch touched.
5. For each sink, and the state snapshot, write one output partition per read task: each task stages
   its output, pre-commits and returns its committable to this driver.
6. Pre-commit the slice: register every committable and dead letter in one ledger transaction, which
   accepts one attempt per (sink, task); roll back the attempts that lost or never reported. A refusal
   (the epoch was aborted or re-planned) rolls back the whole slice and fails the job, so that the
   orchestrator aborts the epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from onceflow.config import Settings
from onceflow.coordinator import Coordinator
from onceflow.decisions import slice_refusal
from onceflow.engine.failures import failure_line
from onceflow.engine.jvm_read import DEAD_LETTER_COLUMN, decoded_read
from onceflow.errors import ConfigError, OnceflowError
from onceflow.executor.arrow_rows import arrow_schema
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import TaskReport, write_task_batches
from onceflow.faults import crash_point
from onceflow.ledger import Epoch, IllegalTransition, Ledger, PrecommitRefused
from onceflow.pipeline import Pipeline, SinkSpec, load_pipeline
from onceflow.planning import slices_of
from onceflow.records import DeadLetter
from onceflow.sinks.registry import sink_kind
from onceflow.sources.kafka_planning import ReadTask
from onceflow.state.store import committed_state_files, state_sink

# Output partitions are participants: their number is fixed when the query is planned. Adaptive
# execution changes it at run time (coalescing, local shuffle readers after a join turns into a
# broadcast, skew splits), so a partition could have no participant: it is off for every slice.
SLICE_SQL_CONF: dict[str, str] = {"spark.sql.adaptive.enabled": "false"}

# Gives a slice its Spark session for steps 3 to 5 (and ends whatever it must when the slice is done).
SessionFor = Callable[[Pipeline, SliceRef], AbstractContextManager[Any]]


class SliceFailed(OnceflowError):
    """The slice could not be pre-committed; the epoch must be aborted and replayed."""


def log(message: str) -> None:
    print(f"[onceflow process] {message}", file=sys.stderr, flush=True)


def sink_columns(sink: SinkSpec) -> list[str] | None:
    """The columns a sink accepts, in order, when its kind or configuration names them."""
    return sink_kind(sink.kind).columns(sink.config)


def open_slice(
    coordinator: Coordinator, epoch_number: int, slice_number: int, attempt_token: str
) -> tuple[Epoch, SliceRef, list[ReadTask]]:
    """Steps 1 and 2, shared by the Spark job and the local executor: check the epoch, list the tasks."""
    spec, settings = coordinator.spec, coordinator.settings
    assert spec is not None and settings is not None
    # 1. The epoch must still be PLANNED under this token.
    epoch = coordinator.ledger.epoch(spec.name, epoch_number)
    refusal = slice_refusal(epoch, at_most_once=spec.commits_before_processing, attempt_token=attempt_token)
    if refusal is not None:
        raise SliceFailed(refusal)
    # 2. The slice's read tasks.
    plan = slices_of(spec, epoch.ranges)[slice_number]
    log(f"{epoch}: slice {slice_number} has {len(plan.tasks)} read tasks over {len(plan.ranges)} partitions")
    ref = SliceRef(
        pipeline=spec,
        epoch=epoch_number,
        slice=slice_number,
        slice_ranges=plan.ranges,
        bootstrap=settings.kafka_bootstrap,
        replaces=coordinator.replaced_epochs(epoch),
        settings=settings,
    )
    return epoch, ref, list(plan.tasks)


def precommit_slice(
    coordinator: Coordinator,
    slice_number: int,
    epoch: Epoch,
    attempt_token: str,
    reports: Sequence[TaskReport],
    dead_letters: Sequence[DeadLetter],
    task_ids: Sequence[str],
) -> dict[str, Any]:
    """Step 6, shared by the Spark job and the local executor; returns the slice's summary."""
    crash_point("slice_after_tasks")
    try:
        done = coordinator.precommit_slice(
            epoch,
            attempt_token,
            [r.to_committable() for r in reports],
            dead_letters,
            tasks=task_ids,
        )
    except (PrecommitRefused, IllegalTransition) as refused:
        raise SliceFailed(f"the slice's pre-commits were refused and rolled back: {refused}") from refused
    crash_point("slice_after_precommits")
    lost = {(c.sink, c.task, c.attempt) for c in done.lost}
    results = []
    for r in reports:
        accepted = (r.sink, r.task, r.attempt) not in lost
        log(
            f"sink {r.sink} task {r.task}: {r.records} records, "
            + ("pre-committed" if accepted else "rolled back (another attempt won)")
        )
        results.append({**r.__dict__, "accepted": accepted})
    if dead_letters:
        log(f"{len(dead_letters)} dead letters recorded ({done.dead_letters_added} new)")
    return {
        "slice": slice_number,
        "tasks": len(task_ids),
        "results": [{k: v for k, v in r.items() if k != "committable"} for r in results],
        "dead_letters": len(dead_letters),
    }


@contextmanager
def submitted_session(spec: Pipeline, ref: SliceRef) -> Iterator[Any]:
    """The spark-submit driver's session: this JVM's, stopped with the slice (the process ends next)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"onceflow-{spec.name}-e{ref.epoch}-s{ref.slice}")
    for key, value in SLICE_SQL_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


def run_slice(
    spec: Pipeline,
    epoch_number: int,
    slice_number: int,
    attempt_token: str,
    settings: Settings,
    *,
    session: SessionFor = submitted_session,
) -> dict[str, Any]:
    """Process one slice on Spark; returns a summary (records written per sink, dead letters)."""
    with ExitStack() as stack:
        ledger = stack.enter_context(Ledger.connect(settings.ledger_url))
        coordinator = Coordinator.for_pipeline(spec, ledger, settings, log=log)
        epoch, ref, tasks = open_slice(coordinator, epoch_number, slice_number, attempt_token)
        if not tasks:
            return {"slice": slice_number, "tasks": 0, "results": []}
        stack.enter_context(coordinator.renewing_lease(epoch.number))
        try:
            with session(spec, ref) as spark:
                reports, dead = process_on_spark(spark, spec, settings, ref, tasks)
        except Exception as exc:
            raise _failed(coordinator, epoch, slice_number, exc) from exc
        task_ids = [t.task_id for t in tasks]
        return precommit_slice(coordinator, slice_number, epoch, attempt_token, reports, dead, task_ids)


def _failed(coordinator: Coordinator, epoch: Epoch, slice_number: int, exc: Exception) -> SliceFailed:
    """A slice cannot pre-commit once its processing raised, so its epoch cannot commit: abort it now,
    with the first exception of the transform or sink (and its frame) as the reason, where the runner,
    the Airflow abort task and `onceflow epochs` all find it. The abort is idempotent, so an orchestrator
    that aborts after this finds the epoch aborted already."""
    cause = failure_line(exc)
    try:
        coordinator.abort(number=epoch.number, reason=f"process failed: slice {slice_number}: {cause}")
    except (
        Exception
    ) as abort_failed:  # a refusal (already decided) or the ledger gone: the cause still travels
        log(f"could not record the cause in the ledger ({failure_line(abort_failed)})")
    return SliceFailed(f"slice {slice_number} of {epoch}: {cause}")


def process_on_spark(
    spark: Any, spec: Pipeline, settings: Settings, ref: SliceRef, tasks: list[ReadTask]
) -> tuple[list[TaskReport], list[DeadLetter]]:
    """Steps 3 to 5 on Spark: read, transform, write; the committables and dead letters come back.

    Uses only DataFrame operations that a classic session and a Spark Connect session both have.
    """
    from pyspark.sql import functions as F

    started = time.monotonic()
    # 3. Exact reads of the slice's ranges, decoded in the JVM where every check passes and by the
    # Python decoder otherwise (`onceflow.engine.jvm_read`); a rejected record travels in the
    # dead-letter column. The read is cached until the slice's writes are done.
    with decoded_read(spark, ref, tasks) as read:
        log(f"slice {ref.slice}: {read.path} read path ({read.reason})")
        raw = read.frame
        dead_column = F.col(DEAD_LETTER_COLUMN)
        dead = [
            DeadLetter.from_json(r[0])
            for r in raw.where(dead_column.isNotNull()).select(dead_column).collect()
        ]
        frame = raw.where(dead_column.isNull()).drop(DEAD_LETTER_COLUMN)
        offsets = sum(r.until_offset - r.from_offset for r in ref.slice_ranges)
        log(
            f"slice {ref.slice}: read offsets {offsets:,} ({len(dead)} dead letters) in "
            f"{time.monotonic() - started:.1f} s"
        )

        # 4. The transform, then the fold into keyed state.
        output = spec.load_transform()(frame)
        writes = _outputs(spark, spec, settings, output)

        # 5. One output partition per read task, for each sink and the state snapshot.
        reports: list[TaskReport] = []
        for sink, frame_out in writes:
            written = _write_sink(ref, sink, frame_out, [t.task_id for t in tasks])
            rows = sum(r.records for r in written)
            seconds = time.monotonic() - started
            log(
                f"slice {ref.slice}: sink {sink.name}: {rows:,} rows staged by {len(written)} tasks; "
                f"{seconds:.1f} s into the slice ({offsets / max(seconds, 1e-9):,.0f} offsets/s)"
            )
            reports += written
    return reports, dead


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


def output_partitions(frame: Any) -> int | None:
    """How many partitions a DataFrame's query has, when the session can tell without running it.

    A classic session plans it (``DataFrame.rdd``); a Spark Connect session has no RDDs, so the
    count is unknown there and the writer repartitions to one partition per task.
    """
    from pyspark.errors import PySparkNotImplementedError

    try:
        return int(frame.rdd.getNumPartitions())
    except PySparkNotImplementedError:  # a Spark Connect DataFrame
        return None


def _write_sink(ref: SliceRef, sink: SinkSpec, frame: Any, task_ids: list[str]) -> list[TaskReport]:
    from pyspark import TaskContext as SparkTaskContext
    from pyspark.sql import types as T

    columns = sink_columns(sink)
    if columns is not None:
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise SliceFailed(
                f"sink {sink.name!r} needs columns {missing} that the transform's output "
                f"({frame.columns}) does not have"
            )
        frame = frame.select(*columns)
    if output_partitions(frame) != len(task_ids):
        frame = frame.repartition(len(task_ids))

    text = T.StringType()
    fields = {"sink": text, "task": text, "attempt": text, "records": T.LongType(), "committable": text}
    report_schema = T.StructType([T.StructField(n, t, False) for n, t in fields.items()])
    report_arrow = arrow_schema(report_schema)

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
        report = write_task_batches(ref, sink, task_ids[index], attempt, batches)
        yield pa.RecordBatch.from_pylist([report.__dict__], schema=report_arrow)

    return [TaskReport(**row.asDict()) for row in frame.mapInArrow(write, report_schema).collect()]


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
        if exc.__cause__ is not None:  # the whole traceback for the task log; the cause line comes last
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        log(f"failed: {exc}")
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
