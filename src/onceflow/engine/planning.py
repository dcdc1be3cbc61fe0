"""What the plan step computes: slices and read tasks, participants, and the checks made before planning.

Pure functions of the spec and the ranges (so every process agrees on the same slices and tasks), plus
the plan-time checks that refuse a spec whose sinks would certainly fail or weaken its guarantee later.
The coordinator (`onceflow.coordinator.Coordinator.plan`) runs them and writes the plan to the ledger.
"""

from __future__ import annotations

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.ledger import Epoch, EpochStatus, Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import STATE_SINK, Pipeline, SinkSpec
from onceflow.sinks.registry import sink_kind
from onceflow.sources.kafka_planning import EpochPlan, SlicePlan, assign_slices
from onceflow.state.store import state_sink


def slices_of(spec: Pipeline, ranges: tuple[OffsetRange, ...]) -> tuple[SlicePlan, ...]:
    """Slices and read tasks of an epoch; a pure function of its ranges, so every process agrees."""
    return assign_slices(ranges, spec.slices, spec.max_records_per_task)


def participant_sinks(spec: Pipeline, settings: Settings) -> tuple[SinkSpec, ...]:
    """The user's sinks plus, for a stateful pipeline, the internal sink of its state snapshot."""
    state = state_sink(spec, settings)
    return spec.sinks if state is None else (*spec.sinks, state)


def expected_participants(spec: Pipeline, slices: tuple[SlicePlan, ...]) -> list[tuple[str, str]]:
    """Every (sink, task) pair that must pre-commit before the epoch may be decided."""
    if spec.commits_before_processing:
        return []  # nothing to wait for: the epoch is committed when it is planned
    names = [sink.name for sink in spec.sinks] + ([STATE_SINK] if spec.state is not None else [])
    return [(name, task.task_id) for s in slices for task in s.tasks for name in names]


def describe_slices(plan: EpochPlan, slices: tuple[SlicePlan, ...]) -> list[str]:
    """One line per slice (its read tasks and ranges), then what was skipped or left for later."""
    lines = []
    for s in slices:
        ranges = ", ".join(str(r) for r in s.ranges if not r.is_empty) or "nothing to read"
        lines.append(f"  slice {s.slice}: {len(s.tasks)} read tasks; {ranges}")
    if plan.skipped:
        lines.append(f"  skipped (deleted by retention): {', '.join(str(s) for s in plan.skipped)}")
    if plan.backlog:
        lines.append(f"  left for later epochs: {plan.backlog} offsets")
    return lines


def check_guarantee(spec: Pipeline) -> None:
    """Refuse a pipeline whose sinks cannot give the guarantee it declares.

    ``exactly_once`` needs every sink to be transactional or idempotent; ``at_least_once`` accepts the
    write-ahead-log and plain sinks too (same protocol: offsets advance only with a committed epoch).
    ``at_most_once`` commits the offsets before processing, so its sinks must write directly: a staged
    sink would wait for a commit that has already happened.
    """
    if spec.commits_before_processing:
        staged = [s.name for s in spec.sinks if not sink_kind(s.kind).direct]
        if staged:
            raise ConfigError(
                f"pipeline {spec.name!r} declares at_most_once, but sinks {staged} stage their output until "
                "the epoch commits, and an at-most-once epoch commits before processing; use sinks that "
                "write directly (plain, postgres_upsert) or another guarantee"
            )
    if spec.guarantee == "exactly_once":
        weaker = [s.name for s in spec.sinks if sink_kind(s.kind).guarantee != "exactly_once"]
        if weaker:
            raise ConfigError(
                f"pipeline {spec.name!r} declares exactly_once, but sinks {weaker} only give at-least-once "
                "(they write before the epoch commits); declare guarantee='at_least_once' or use a "
                "two-phase or idempotent sink"
            )


def run_plan_checks(spec: Pipeline, settings: Settings, parallel_tasks: int | None = None) -> None:
    """Every check made before an epoch is planned: the guarantee, the transform importable, then each
    sink kind's own checks, given the configs of all the pipeline's sinks of that kind and how many tasks
    of one epoch write to each (``parallel_tasks``: the epoch's read tasks once its ranges are known)."""
    check_guarantee(spec)
    if spec.transform is not None:
        spec.load_transform()  # a transform that cannot be imported fails now, not inside Spark
    parallel = max(spec.slices, 1) if parallel_tasks is None else parallel_tasks
    by_kind: dict[str, list[SinkSpec]] = {}
    for sink in spec.sinks:
        by_kind.setdefault(sink.kind, []).append(sink)
    for name, sinks in sorted(by_kind.items()):
        kind = sink_kind(name)
        kind.plan_checks(spec, [kind.config_for(sink, settings) for sink in sinks], parallel)


def replaced_epochs(spec: Pipeline, ledger: Ledger, epoch: Epoch) -> tuple[int, ...]:
    """The committed epochs whose output ``epoch`` replaces: earlier ones of its data interval."""
    if spec.on_rerun != "replace" or epoch.data_interval_start is None or epoch.data_interval_end is None:
        return ()
    same = ledger.find_by_interval(spec.name, epoch.data_interval_start, epoch.data_interval_end)
    return tuple(e.number for e in same if e.number < epoch.number and e.status is EpochStatus.COMMITTED)
