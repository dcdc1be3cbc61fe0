"""Run a bench pipeline epoch after epoch until the whole data set is committed, timing every step.

The loop makes the same calls as `onceflow.engine.runner.run_epoch` (recover, plan_epoch, submit_slice
per slice, commit_epoch) in the same order, with a clock around each and a memory sampler around the
spark-submit, so the per-step split comes from the engine's own code paths. The sink committers are
wrapped to time the sink's own commit apart from the ledger's decision and bookkeeping.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from local_stack.spark_runtime import SparkRuntime

from bench.memory import MEASURE, TreePeak, TreeSampler
from bench.pipelines import SPEC_ENV, SPEC_PATH
from onceflow.config import Settings
from onceflow.engine.connect import connect_sessions, pipeline_modules
from onceflow.engine.failures import cause_in_output
from onceflow.engine.slice_job import run_slice
from onceflow.engine.submit import submit_slice
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import Pipeline
from onceflow.protocol.coordinator import Coordinator
from onceflow.protocol.planning import committers_for
from onceflow.sinks.base import Committable, SinkCommitter


class TimedCommitter:
    """Delegates to a sink committer and adds up the seconds spent in its ``commit``."""

    def __init__(self, inner: SinkCommitter) -> None:
        self.inner = inner
        self.commit_s = 0.0

    def commit(self, committables: Sequence[Committable]) -> None:
        started = time.perf_counter()
        try:
            self.inner.commit(committables)
        finally:
            self.commit_s += time.perf_counter() - started

    def abort(self, committables: Sequence[Committable]) -> None:
        self.inner.abort(committables)

    def orphans(self, pipeline: str) -> list[Committable]:
        return self.inner.orphans(pipeline)


@dataclass
class EpochTiming:
    """Seconds per step of one epoch. ``decide_s`` is commit_epoch minus the sinks' own commit: the
    ledger's decision (compare-and-set) and its marking and finishing of the epoch."""

    epoch: int
    records: int
    recover_s: float
    plan_s: float
    spark_s: float
    decide_s: float
    commit_s: float
    memory: TreePeak

    @property
    def total_s(self) -> float:
        return self.recover_s + self.plan_s + self.spark_s + self.decide_s + self.commit_s

    @property
    def coordination_s(self) -> float:
        """What the coordinator adds around the Spark job and the sinks: recover, plan and decide."""
        return self.recover_s + self.plan_s + self.decide_s


@dataclass
class PipelineRun:
    name: str
    records: int
    wall_s: float
    epochs: list[EpochTiming] = field(default_factory=list)
    committed_rows: int = 0

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_s

    @property
    def peak(self) -> TreePeak:
        peak = TreePeak()
        for e in self.epochs:
            peak.merge(e.memory)
        return peak

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "records": self.records,
            "wall_s": self.wall_s,
            "records_per_s": self.records_per_s,
            "committed_rows": self.committed_rows,
            "epochs": [
                {
                    "epoch": e.epoch,
                    "records": e.records,
                    "recover_s": e.recover_s,
                    "plan_s": e.plan_s,
                    "spark_s": e.spark_s,
                    "decide_s": e.decide_s,
                    "commit_s": e.commit_s,
                    "peak_total_mb": e.memory.total_mb,
                    "peak_jvm_mb": e.memory.jvm_mb,
                    "peak_python_workers_mb": e.memory.python_workers_mb,
                    "peak_driver_python_mb": e.memory.driver_python_mb,
                    "memory_measure": MEASURE,
                }
                for e in self.epochs
            ],
        }


class SliceFailed(RuntimeError):
    """A spark-submit of the benchmark exited non-zero (the epoch is left for the next recover)."""


def runtime_pids() -> tuple[int, ...]:
    """Every process of the warm Spark runtime: master and workers (they hold no data of an epoch, but
    the runtime's memory is theirs too), its Connect server and the executors that the workers started;
    the executors' Python workers are their children. A lean runtime is its Connect server alone."""
    return tuple(SparkRuntime.from_env().pids())


def run_to_end(spec: Pipeline, settings: Settings, records: int, remote: str | None = None) -> PipelineRun:
    """Run epochs until the ledger's committed positions cover ``records`` offsets of the source:
    through spark-submit, or on the Spark Connect server ``remote``."""
    os.environ[SPEC_ENV] = spec.to_json()  # spark-submit inherits it and rebuilds the same spec
    committers = {name: TimedCommitter(c) for name, c in committers_for(spec, settings).items()}
    ledger = Ledger.connect(settings.ledger_url)
    run = PipelineRun(spec.name, records, 0.0)
    started = time.perf_counter()
    try:
        while _committed(ledger.committed_offsets(spec.name)) < records:
            run.epochs.append(_epoch(spec, settings, ledger, committers, remote))
        run.wall_s = time.perf_counter() - started
        run.committed_rows = sum(
            p.committable.record_count
            for e in ledger.epochs(spec.name)
            for p in ledger.participants(spec.name, e.number)
            if e.status is EpochStatus.COMMITTED
        )
    finally:
        ledger.close()
        os.environ.pop(SPEC_ENV, None)
    return run


def _committed(offsets: Mapping[tuple[str, int], int]) -> int:
    return sum(offsets.values())


def _epoch(
    spec: Pipeline,
    settings: Settings,
    ledger: Ledger,
    committers: Mapping[str, TimedCommitter],
    remote: str | None,
) -> EpochTiming:
    coordinator = Coordinator(ledger, spec.name, committers, spec=spec, settings=settings)
    t0 = time.perf_counter()
    coordinator.recover()
    t1 = time.perf_counter()
    planned = coordinator.plan(run_id=f"bench__{time.time_ns()}")
    assert planned.epoch is not None and planned.attempt_token is not None
    t2 = time.perf_counter()
    also = (os.getpid(), *runtime_pids()) if remote else ()
    sampler = TreeSampler(os.getpid(), also).start()
    try:
        if remote:
            sessions = connect_sessions(remote, pipeline_modules(spec, SPEC_PATH), planned.attempt_token)
            for number in planned.slices_with_tasks:
                run_slice(spec, planned.epoch, number, planned.attempt_token, settings, session=sessions)
        for number in planned.slices_with_tasks if not remote else ():
            result = submit_slice(
                SPEC_PATH,
                planned.epoch,
                number,
                planned.attempt_token,
                settings,
                timeout_s=spec.transaction_timeout_s,
            )
            if result.returncode != 0:
                cause = cause_in_output(result.stdout + "\n" + result.stderr)
                raise SliceFailed(f"epoch {planned.epoch} slice {number} exited {result.returncode}: {cause}")
    finally:
        memory = sampler.stop()
    t3 = time.perf_counter()
    before = sum(c.commit_s for c in committers.values())
    coordinator.commit(number=planned.epoch)
    t4 = time.perf_counter()
    sink_s = sum(c.commit_s for c in committers.values()) - before
    return EpochTiming(
        epoch=planned.epoch,
        records=planned.span,
        recover_s=t1 - t0,
        plan_s=t2 - t1,
        spark_s=t3 - t2,
        decide_s=(t4 - t3) - sink_s,
        commit_s=sink_s,
        memory=memory,
    )
