"""The driver of one slice of one epoch: the steps below, whichever way the Spark session is reached.

Two drivers run them: `spark_jobs/onceflow_process.py` (one spark-submit per slice, `submitted_session`)
and a Spark Connect client in the caller's process (`onceflow.engine.connect`), which sends the same
queries to a long-lived server. Only the session differs; the ledger connection stays in the driver.

Steps:
1. Open the ledger once (the slice's only connection: tasks never touch it) and check that the epoch is
   still PLANNED under this job's attempt token (a retried or late job must not touch an epoch that has
   moved on); keep the owner's lease alive while the slice runs.
2. Recompute the slice's read tasks from the epoch's ranges (a pure function, so all processes agree).
3. Executors read exactly those ranges and decode them, Spark partition i being read task i, its rows
   and dead letters in offset order.
4. Apply the pipeline's transform (DataFrame in, DataFrame or {sink: DataFrame} out); a stateful
   pipeline then folds the output into the last committed state (`onceflow.state.fold`), and its sinks
   receive the new value of every key the epoch touched.
5. Write one output partition per read task: each task stages its output, pre-commits and returns its
   committable to this driver. Where the transform keeps the read's partitions, steps 3 to 5 are one
   Spark job (one pass): the task that reads a range writes it to every sink, in source order, and the
   dead letters come back as the job's observed metric. Otherwise each sink, and the state snapshot,
   is a job of its own over the cached read.
6. Pre-commit the slice: register every committable and dead letter in one ledger transaction, which
   accepts one attempt per (sink, task); roll back the attempts that lost or never reported. A refusal
   (the epoch was aborted or re-planned) rolls back the whole slice and fails the job, so that the
   orchestrator aborts the epoch. So does an epoch that would keep more than the pipeline's
   ``max_dead_letters_per_epoch`` dead letters: it is aborted here, in one line, and replayed later.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from onceflow import redact
from onceflow.config import Settings
from onceflow.decoding.avro_records import pinned
from onceflow.decoding.records import DeadLetter
from onceflow.engine.failures import failure_line
from onceflow.engine.jvm_read import DEAD_LETTER_COLUMN
from onceflow.engine.plan_inspection import output_partitions, partition_refusal
from onceflow.engine.read_path import decoded_read
from onceflow.errors import ConfigError, OnceflowError, SliceFailed
from onceflow.executor.arrow_rows import arrow_schema
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import TaskReport, sinks_task
from onceflow.faults import crash_point
from onceflow.ledger import Epoch, IllegalTransition, Ledger, PrecommitRefused
from onceflow.pipeline import Pipeline, SinkSpec, load_pipeline
from onceflow.protocol.coordinator import Coordinator
from onceflow.protocol.decisions import slice_refusal
from onceflow.protocol.planning import slices_of
from onceflow.sinks.registry import sink_kind
from onceflow.sources.kafka_planning import ReadTask
from onceflow.state.store import committed_state_files, state_sink

# Output partitions are participants: their number is fixed when the query is planned. Adaptive
# execution changes it at run time (coalescing, local shuffle readers after a join turns into a
# broadcast, skew splits), so a partition could have no participant: it is off for every slice.
SLICE_SQL_CONF: dict[str, str] = {
    "spark.sql.adaptive.enabled": "false",
    # Spark 4 measures an Arrow batch's bytes after every row it adds, unless this is Int.MaxValue; that
    # measuring was a third of the executors' busy time in a slice (it sizes every vector, the headers'
    # lists too). Batches are then bounded by rows (spark.sql.execution.arrow.maxRecordsPerBatch,
    # 10,000), as in Spark 3, and each record by the pipeline's max_record_bytes.
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
}

# Gives a slice its Spark session for steps 3 to 5 (and ends whatever it must when the slice is done).
SessionFor = Callable[[Pipeline, SliceRef], AbstractContextManager[Any]]


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
    assert spec is not None
    # 1. The epoch must still be PLANNED under this token.
    epoch = coordinator.ledger.epoch(spec.name, epoch_number)
    refusal = slice_refusal(epoch, at_most_once=spec.commits_before_processing, attempt_token=attempt_token)
    if refusal is not None:
        raise SliceFailed(refusal)
    # 2. The slice's read tasks.
    plan = slices_of(spec, epoch.ranges)[slice_number]
    log(f"{epoch}: slice {slice_number} has {len(plan.tasks)} read tasks over {len(plan.ranges)} partitions")
    ref = SliceRef(
        pipeline=pinned(
            spec, settings.schema_registry_url, settings.schema_registry_allow_insecure_auth
        ),  # an Avro subject's schema, fixed for the slice
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
    spec = coordinator.spec
    assert spec is not None
    if dead_letters:
        # Counted before anything is kept: the letters kept already (other slices, an earlier run of
        # this one) and this slice's new ones. Slices pre-committing at the same moment each check
        # their own sum, so the bound is exact for one slice and may be passed by concurrent ones.
        total = coordinator.ledger.dead_letters_with(spec.name, epoch.number, dead_letters)
        if total > spec.max_dead_letters_per_epoch:
            raise too_many_dead_letters(coordinator, epoch, reports, total, spec.max_dead_letters_per_epoch)
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


def too_many_dead_letters(
    coordinator: Coordinator, epoch: Epoch, reports: Sequence[TaskReport], total: int, bound: int
) -> SliceFailed:
    """Past the pipeline's bound of dead letters: roll back what the slice staged, abort the epoch with
    one line that says how many and why, and fail the slice. Nothing of the epoch was committed, so its
    range is replayed by the next run: a user fixes the input, or raises the bound, meanwhile."""
    line = (
        f"{total:,} dead letters in epoch {epoch.number} of {coordinator.pipeline!r}, more than its "
        f"max_dead_letters_per_epoch ({bound:,}): the epoch is aborted, nothing of it committed, and the "
        "next run replays its range (fix the input, or raise the bound)"
    )
    staged = [r.to_committable() for r in reports]
    try:
        for sink in sorted({c.sink for c in staged}):
            coordinator.committers[sink].abort([c for c in staged if c.sink == sink])
        coordinator.abort(number=epoch.number, reason=line)
    except Exception as failed:  # the sweeper and recovery finish what is left; the cause still travels
        log(f"could not abort {epoch} ({failure_line(failed)})")
    return SliceFailed(line)


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

    One pass where the transform keeps the read's partitions (`one_pass_refusal`): one Spark job whose
    task i reads read task i's range, decodes it, transforms it and stages it in every sink, in source
    order; the committables are the job's rows and the dead letters its observed metric. Otherwise the
    read is cached and each sink is a job of its own (`_write_sink`).
    Uses only DataFrame operations that a classic session and a Spark Connect session both have.
    """
    from pyspark.sql import functions as F

    started = time.monotonic()
    task_ids = [t.task_id for t in tasks]
    offsets = sum(r.until_offset - r.from_offset for r in ref.slice_ranges)
    # 3. Exact reads of the slice's ranges, decoded in the JVM where every check passes and by the
    # Python decoder otherwise (`onceflow.engine.read_path`); a rejected record travels in the
    # dead-letter column, in its place. Partition i is read task i.
    read = decoded_read(spark, ref, tasks)
    log(f"slice {ref.slice}: {read.path} read path ({read.reason})")
    dead_column = F.col(DEAD_LETTER_COLUMN)

    if spec.state is None:
        # 4. The transform over the good rows; the dead letters are counted on the way, in the same tasks.
        observation = _observation(read.frame)
        observed = read.frame.observe(observation, F.collect_list(dead_column).alias("dead"))
        writes = _outputs(spark, spec, settings, spec.load_transform()(_rows(observed)))
        refusal = one_pass_refusal(writes, read.leaves)
        if refusal is None:
            # 5. Every sink, one job: the output's partition i is read task i's.
            staged = _write_sinks(ref, [sink for sink, _ in writes], writes[0][1], task_ids)
            dead = [DeadLetter.from_json(text) for text in observation.get["dead"]]
            for sink, _ in writes:
                rows = sum(r.records for r in staged if r.sink == sink.name)
                log(f"slice {ref.slice}: sink {sink.name}: {rows:,} rows staged by {len(task_ids)} tasks")
            seconds = time.monotonic() - started
            log(
                f"slice {ref.slice}: one pass over {offsets:,} offsets ({len(dead)} dead letters) in "
                f"{seconds:.1f} s ({offsets / max(seconds, 1e-9):,.0f} offsets/s)"
            )
            return staged, dead
        log(f"slice {ref.slice}: one job per sink: {refusal}")
    else:
        log(f"slice {ref.slice}: one job per sink: keyed state folds the epoch across its partitions")

    # The read is used once for the dead letters and once per sink: keep it, so Kafka is read once.
    from pyspark import StorageLevel

    cached = read.frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        letters = cached.where(dead_column.isNotNull()).select(dead_column)
        # Never more than the epoch may keep, plus one (which makes the slice fail in step 6).
        bound = spec.max_dead_letters_per_epoch
        dead = [DeadLetter.from_json(r[0]) for r in letters.limit(bound + 1).collect()]
        if len(dead) > bound:
            raise SliceFailed(
                f"{letters.count():,} dead letters in slice {ref.slice} of epoch {ref.epoch}, more than "
                f"max_dead_letters_per_epoch ({bound:,}): the epoch is aborted, nothing of it committed, "
                "and the next run replays its range (fix the input, or raise the bound)"
            )
        log(
            f"slice {ref.slice}: read offsets {offsets:,} ({len(dead)} dead letters) in "
            f"{time.monotonic() - started:.1f} s"
        )
        # 4. The transform, then the fold into keyed state.
        writes = _outputs(spark, spec, settings, spec.load_transform()(_rows(cached)))
        # 5. One output partition per read task, for each sink and the state snapshot.
        reports: list[TaskReport] = []
        for sink, frame_out in writes:
            written = _write_sink(ref, sink, frame_out, task_ids)
            rows = sum(r.records for r in written)
            seconds = time.monotonic() - started
            log(
                f"slice {ref.slice}: sink {sink.name}: {rows:,} rows staged by {len(written)} tasks; "
                f"{seconds:.1f} s into the slice ({offsets / max(seconds, 1e-9):,.0f} offsets/s)"
            )
            reports += written
    finally:
        # A long-lived session outlives the slice: never leave its cache holding this read.
        cached.unpersist()
    return reports, dead


def _rows(decoded: Any) -> Any:
    """The decoded records that are rows (a dead letter's row columns are all null)."""
    from pyspark.sql import functions as F

    return decoded.where(F.col(DEAD_LETTER_COLUMN).isNull()).drop(DEAD_LETTER_COLUMN)


def _observation(frame: Any) -> Any:
    """An observation of the session kind ``frame`` belongs to (Spark Connect has its own class)."""
    if type(frame).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        return ConnectObservation()
    from pyspark.sql.observation import Observation

    return Observation()


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


def one_pass_refusal(writes: Sequence[tuple[SinkSpec, Any]], read_leaves: int) -> str | None:
    """Why the sinks' outputs cannot be written in the read's own tasks, or None when they can.

    They can when every sink takes one and the same DataFrame whose plan keeps the read's partitions
    (`partition_refusal`): then output partition i holds read task i's records, in their order.
    """
    frames = {id(frame) for _, frame in writes}
    if len(frames) != 1:
        return "the transform returns a DataFrame per sink"
    frame = writes[0][1]
    for sink, _ in writes:
        _sink_frame(sink, frame)  # a sink's missing columns are the slice's failure on either path
    return partition_refusal(frame, read_leaves)


def _sink_frame(sink: SinkSpec, frame: Any) -> list[str] | None:
    """The sink's columns (None: all), checked to be in ``frame``."""
    columns = sink_columns(sink)
    if columns is not None:
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise SliceFailed(
                f"sink {sink.name!r} needs columns {missing} that the transform's output "
                f"({frame.columns}) does not have"
            )
    return columns


# The source position of a row, where the transform kept it: enough to restore source order.
POSITION_COLUMNS = ("_topic", "_partition", "_offset")


def in_source_order(frame: Any, tasks: int) -> Any:
    """``frame`` in ``tasks`` partitions for a write after a transform that moved rows between them.

    Rows that still carry their source position go to one partition per source partition, sorted by
    offset, so each source partition keeps its order; other rows (an aggregate's, a join's) have no
    source order to keep and are dealt round-robin.
    """
    if all(c in frame.columns for c in POSITION_COLUMNS):
        return frame.repartition(tasks, *POSITION_COLUMNS[:2]).sortWithinPartitions(*POSITION_COLUMNS)
    return frame.repartition(tasks)


_REPORT_FIELDS = ("sink", "task", "attempt", "records", "committable")


def _report_schema() -> Any:
    from pyspark.sql import types as T

    text = T.StringType()
    types = {"records": T.LongType()}
    return T.StructType([T.StructField(n, types.get(n, text), False) for n in _REPORT_FIELDS])


def _write_sinks(ref: SliceRef, sinks: list[SinkSpec], frame: Any, task_ids: list[str]) -> list[TaskReport]:
    """One Spark job: output partition i stages read task i's rows in every sink, in their order."""
    outputs = [(sink, _sink_frame(sink, frame)) for sink in sinks]
    if all(columns is not None for _, columns in outputs):  # only what some sink takes crosses to Python
        frame = frame.select(*dict.fromkeys(c for _, columns in outputs for c in columns or ()))
    report_schema = _report_schema()
    report_arrow = arrow_schema(report_schema)
    write = sinks_task(ref, outputs, task_ids, f"sinks {[s.name for s in sinks]}", report_arrow)
    return [TaskReport(**row.asDict()) for row in frame.mapInArrow(write, report_schema).collect()]


def _write_sink(ref: SliceRef, sink: SinkSpec, frame: Any, task_ids: list[str]) -> list[TaskReport]:
    """One Spark job for one sink's output, in one partition per read task."""
    columns = _sink_frame(sink, frame)
    # Here the transform may have moved rows between partitions: where they carry their source position,
    # restore source order; otherwise only the number of partitions must be the tasks'.
    positions = all(c in frame.columns for c in POSITION_COLUMNS)
    if positions or output_partitions(frame) != len(task_ids):
        frame = in_source_order(frame, len(task_ids))
    if columns is not None:
        frame = frame.select(*columns)
    report_schema = _report_schema()
    report_arrow = arrow_schema(report_schema)
    write = sinks_task(ref, [(sink, None)], task_ids, f"sink {sink.name!r}", report_arrow)
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
            shown = redact.text("".join(traceback.format_exception(exc.__cause__)))
            print(shown, end="", file=sys.stderr)
        log(redact.text(f"failed: {exc}"))
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
