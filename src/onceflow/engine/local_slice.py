"""Run one slice in this process, without Spark, for pipelines that need no DataFrame work.

A pipeline without transform and without state sends its decoded records straight to its sinks. For
it, the Spark job's steps (check the epoch, read the exact ranges, decode, stage each task in every sink,
pre-commit the slice) run here task by task, with the very functions Spark executors run and the same
driver-side pre-commit. Starting a JVM costs more than that work for small epochs: this executor serves
small replication pipelines, the fault-injection harness that runs hundreds of epochs, and measurements
of the protocol's own cost. Each task is one attempt; a crash leaves its staging to the sweeper.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from onceflow.config import Settings
from onceflow.decoding.records import DeadLetter, row_columns
from onceflow.engine.slice_job import open_slice, precommit_slice, sink_columns
from onceflow.errors import ConfigError, SliceFailed
from onceflow.executor.reading import read_task, split
from onceflow.executor.writing import TaskReport, write_task
from onceflow.ledger import Ledger
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.protocol.coordinator import Coordinator


def check_local(spec: Pipeline) -> None:
    """Refuse a pipeline the local executor cannot run faithfully."""
    if spec.transform is not None or spec.state is not None:
        raise ConfigError(
            f"pipeline {spec.name!r} has a transform or keyed state, which run on Spark; "
            "the local executor runs only pipelines that send decoded records straight to their sinks"
        )


def _project(sink: SinkSpec, rows: list[dict[str, Any]]) -> list[Mapping[str, Any]]:
    columns = sink_columns(sink)
    if columns is None or not rows:
        return list(rows)
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise SliceFailed(f"sink {sink.name!r} needs columns {missing} that the decoded records do not have")
    return [{c: row[c] for c in columns} for row in rows]


def run_slice_local(
    spec: Pipeline, epoch_number: int, slice_number: int, attempt_token: str, settings: Settings
) -> dict[str, Any]:
    """The local counterpart of `slice_job.run_slice`, with the same summary and failures."""
    check_local(spec)
    with ExitStack() as stack:
        ledger = stack.enter_context(Ledger.connect(settings.ledger_url))
        coordinator = Coordinator.for_pipeline(spec, ledger, settings)
        epoch, ref, tasks = open_slice(coordinator, epoch_number, slice_number, attempt_token)
        names = [name for name, _, _ in row_columns(ref.pipeline.format)]
        attempt = f"local-{uuid.uuid4().hex[:12]}"
        reports: list[TaskReport] = []
        dead: list[DeadLetter] = []
        for task in tasks:
            values, rejected = split(read_task(ref, task))
            dead += rejected
            rows = [dict(zip(names, row, strict=True)) for row in values]
            for sink in spec.sinks:
                reports.append(write_task(ref, sink, task.task_id, attempt, iter(_project(sink, rows))))
        task_ids = [t.task_id for t in tasks]
        return precommit_slice(coordinator, slice_number, epoch, attempt_token, reports, dead, task_ids)
