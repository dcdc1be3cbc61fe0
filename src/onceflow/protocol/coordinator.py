"""The coordinator of one pipeline: the protocol's single home (Flink's CheckpointCoordinator).

Every door goes through `Coordinator`: the Airflow operators, the ``onceflow`` CLI, the runner
(``onceflow run``), the slice job's driver, the fault harness and the benchmarks. Its methods are the
protocol's steps, each with its numbered steps in the docstring and the code following them:

    plan -> process (Spark, outside) -> pre-commit (`precommit_slice`) -> commit (decide, finish)
                                                                        -> abort (decide, finish)
    recover (finish the epoch in flight the way it was decided, then sweep) ... report

Commit, abort and recover share one copy of each finishing step (`_finish_commit`, `_finish_abort`).
Decisions are pure functions in `onceflow.protocol.decisions`; durable state and its compare-and-set
transitions live in the ledger, which knows nothing of sinks. What the steps need besides the protocol lives
in modules of its own: who owns an epoch (`onceflow.protocol.owners`), what the steps return
(`onceflow.protocol.step_results`), the ranges and participants of a plan (`onceflow.protocol.planning`), the
position shown to Kafka's tools (`onceflow.protocol.positions`), retention (`onceflow.protocol.retaining`)
and the report (`onceflow.protocol.epoch_report`). Every step is idempotent and recorded in the ledger before
the next one, so running any of them again after a crash anywhere picks up where the last run stopped
(invariant 8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from onceflow.committables import Committable
from onceflow.config import Settings
from onceflow.decoding.records import DeadLetter
from onceflow.errors import ConfigError
from onceflow.faults import crash_point
from onceflow.ledger import (
    Epoch,
    EpochStatus,
    IllegalTransition,
    Ledger,
    MissingCommitter,
    ParticipantStatus,
    PrecommitRefused,
    Refused,
    UnknownEpoch,
)
from onceflow.ledger.ledger import Registration
from onceflow.ledger.models import utcnow
from onceflow.ledger.refusals import abort_refusal, commit_refusal
from onceflow.ledger.retention import RetentionResult
from onceflow.logs import Log, quiet
from onceflow.pipeline import Pipeline
from onceflow.protocol.committer_calls import call_committer
from onceflow.protocol.decisions import decide_plan, decide_recovery, slice_refusal
from onceflow.protocol.epoch_report import report_lines
from onceflow.protocol.leases import renewing
from onceflow.protocol.owners import OwnerAlive, owner_of_this_process, process_alive
from onceflow.protocol.planning import (
    committers_for,
    describe_slices,
    expected_participants,
    next_ranges,
    plan_result,
    planned_lines,
    replaced_epochs,
    run_plan_checks,
    slices_of,
)
from onceflow.protocol.positions import publish_position
from onceflow.protocol.retaining import retain, retain_after_commit
from onceflow.protocol.schema_changes import ReaderSchema, check_reader_schema
from onceflow.protocol.step_results import PlanResult, PlanStatus, RecoveryReport, SliceGate
from onceflow.protocol.sweeper import sweep_orphans
from onceflow.sinks.base import SinkCommitter
from onceflow.sources.kafka_planning import EpochPlan, SlicePlan


@dataclass(frozen=True)
class _Outcome:
    """Where a commit or an abort leads: the final status, and how an epoch already there is shown."""

    verb: str
    status: EpochStatus
    done: Callable[[Epoch], str]


_COMMITTED = _Outcome("commit", EpochStatus.COMMITTED, lambda e: f"committed (at {e.finished_at})")
_ABORTED = _Outcome("abort", EpochStatus.ABORTED, lambda e: f"aborted (reason: {e.abort_reason})")


class EpochOwned(IllegalTransition):
    """Another live runner owns the pipeline's epoch in flight; epochs run one at a time."""


class Coordinator:
    """The protocol for one pipeline, over a ledger, the pipeline's committers and its Kafka source.

    Build it with `for_pipeline` from a spec and settings (what every door does), or from a ledger,
    settings and committers alone to drive epochs that something else planned (the CLI's manual steps,
    tests, tools; `onceflow.testing.coordinator_for_tests`). It always has the deployment's settings: the
    lease, retention and Kafka follow them. ``log`` receives one line per thing done, for a task log or a
    terminal.
    """

    def __init__(
        self,
        ledger: Ledger,
        pipeline: str,
        committers: Mapping[str, SinkCommitter] | None = None,
        *,
        settings: Settings,
        spec: Pipeline | None = None,
        log: Log = quiet,
    ) -> None:
        if spec is not None and spec.name != pipeline:
            raise ConfigError(f"coordinator for {pipeline!r} given the spec of {spec.name!r}")
        self.ledger = ledger
        self.pipeline = pipeline
        self.spec = spec
        self.settings = settings
        self.log = log
        self._committers = None if committers is None else dict(committers)

    @classmethod
    def for_pipeline(
        cls, spec: Pipeline, ledger: Ledger, settings: Settings, *, log: Log = quiet
    ) -> Coordinator:
        return cls(ledger, spec.name, spec=spec, settings=settings, log=log)

    # ---------------------------------------------------------------------------------- helpers

    @property
    def committers(self) -> dict[str, SinkCommitter]:
        """Built on first use: the slice driver and `plan` never need them."""
        if self._committers is None:
            if self.spec is None:
                raise MissingCommitter(f"pipeline {self.pipeline!r}: no committers and no spec to build them")
            self._committers = committers_for(self._need_spec("commit or abort"), self.settings)
        return self._committers

    @property
    def _at_most_once(self) -> bool:
        return self.spec is not None and self.spec.commits_before_processing

    def _need_spec(self, step: str) -> Pipeline:
        if self.spec is None:
            raise ConfigError(f"{step} of pipeline {self.pipeline!r} needs its spec")
        return self.spec

    def _require(self, sinks: Sequence[str], epoch: Epoch) -> None:
        missing = [sink for sink in sinks if sink not in self.committers]
        if missing:
            raise MissingCommitter(
                f"{epoch}: no committer for sink(s) {', '.join(missing)}; nothing was changed"
            )

    def _registered_sinks(self, epoch: Epoch) -> list[str]:
        return sorted({p.sink for p in self.ledger.participants(self.pipeline, epoch.number)})

    def _by_sink(self, epoch: Epoch) -> dict[str, list[Committable]]:
        grouped: dict[str, list[Committable]] = {}
        for p in self.ledger.participants(self.pipeline, epoch.number):
            if p.status is ParticipantStatus.PRECOMMITTED:
                grouped.setdefault(p.sink, []).append(p.committable)
        return grouped

    def target(self, *, number: int | None = None, run_id: str | None = None) -> Epoch | None:
        """The epoch named by number, or the latest one the orchestrator run ``run_id`` planned."""
        if number is not None:
            return self.ledger.epoch(self.pipeline, number)
        if run_id is None:
            raise ValueError("name the epoch or the run that planned it")
        return self.ledger.epoch_of_run(self.pipeline, run_id)

    def _find(self, outcome: _Outcome, number: int | None, run_id: str | None) -> Epoch | None:
        """The epoch a commit or abort acts on; says so when there is none, or it already has ``outcome``."""
        epoch = self.target(number=number, run_id=run_id)
        if epoch is None:
            self.log(f"run {run_id} planned no epoch of {self.pipeline!r}: nothing to {outcome.verb}")
        elif epoch.status is outcome.status:
            self.log(f"{epoch} is already {outcome.done(epoch)}: nothing changed")
        return epoch

    # ------------------------------------------------------------------------------------- plan

    def preview(
        self,
        *,
        data_interval: tuple[datetime, datetime] | None = None,
        max_records_per_partition: int | None = None,
    ) -> tuple[EpochPlan, tuple[SlicePlan, ...]]:
        """The ranges and slices the next epoch would get, after the same checks as `plan`; the ledger
        is not written."""
        spec = self._need_spec("preview")
        plan, slices, _ = self._next_plan(spec, data_interval, max_records_per_partition, apply=False)
        return plan, slices

    def _next_plan(
        self,
        spec: Pipeline,
        data_interval: tuple[datetime, datetime] | None,
        max_records_per_partition: int | None,
        *,
        apply: bool,
    ) -> tuple[EpochPlan, tuple[SlicePlan, ...], ReaderSchema]:
        """Steps 2 and 3 of `plan`, which `preview` shares: the next ranges, their slices, the checks
        (``apply``: and the sinks' tables made ready; a preview changes nothing)."""
        settings = self.settings
        reader = check_reader_schema(spec, self.ledger, settings)  # before the sinks add columns
        plan = next_ranges(
            spec,
            self.ledger,
            settings,
            data_interval=data_interval,
            max_records_per_partition=max_records_per_partition,
        )
        slices = slices_of(spec, plan.ranges)
        run_plan_checks(spec, settings, parallel_tasks=sum(len(s.tasks) for s in slices), apply=apply)
        return plan, slices, reader

    def plan(
        self,
        *,
        run_id: str,
        owner: str | None = None,
        data_interval: tuple[datetime, datetime] | None = None,
        max_records_per_partition: int | None = None,
        preview: bool = False,
    ) -> PlanResult:
        """Plan this run's epoch, or find why there is nothing to plan.

        1. Ask the ledger about this run's own epoch, its data interval and the epoch in flight, and
           decide (`decisions.decide_plan`): reuse, replace, nothing to do, wait for a live owner, or plan.
        2. Read the committed positions and Kafka's offsets, and bound the ranges by the data interval.
        3. Check the spec: its reader schema against the last planned epoch's (`schema_changes`: a
           refused change stops here), then against its sinks for the epoch's tasks (guarantee, transform
           importable, sink kinds' plan-time checks such as PostgreSQL's room for prepared transactions;
           the table sinks add the reader schema's new columns here, before any task writes).
        4. A preview stops here: it prints the ranges the epoch would read; the ledger is not touched.
        5. Record the ranges, the participants and the owner's lease in the ledger: from here on the
           epoch is durable (like Spark's offset log, before anything runs), and the reader schema it
           reads with. An at-most-once epoch is committed right away (its position moves before
           processing).
        """
        spec = self._need_spec("plan")
        owner = owner or owner_of_this_process(run_id)
        # 1.
        interval_done = None
        if data_interval is not None:
            done = [
                e
                for e in self.ledger.find_by_interval(spec.name, *data_interval)
                if e.status in (EpochStatus.COMMITTED, EpochStatus.COMMITTING)
            ]
            interval_done = done[-1] if done else None
        own = self.ledger.epoch_of_run(spec.name, run_id)
        in_flight = self.ledger.open_epoch(spec.name)
        decision = decide_plan(
            own=own,
            interval_done=interval_done,
            in_flight=in_flight if in_flight is not None and in_flight.run_id != run_id else None,
            replaces_intervals=spec.on_rerun == "replace",
        )
        if decision.action == "replace" and decision.epoch is not None:
            return self._plan_replacement(decision.epoch, run_id, owner)
        if decision.action in ("reuse", "already_committed") and decision.epoch is not None:
            self.log(decision.line)
            status: PlanStatus = "planned" if decision.action == "reuse" else "already_committed"
            if decision.action == "reuse":
                self.renew_lease(decision.epoch.number)
            return plan_result(spec, status, decision.epoch, [decision.line])
        if decision.action == "wait":
            raise EpochOwned(decision.line)
        # 2. and 3.
        epoch_plan, slices, reader = self._next_plan(
            spec, data_interval, max_records_per_partition, apply=not preview
        )
        # 4.
        if preview:
            lines = [
                f"preview (dry run) of {spec.name!r}: the next epoch would read {epoch_plan.span} offsets "
                f"in {len(epoch_plan.ranges)} partitions (nothing was written to the ledger)",
                *epoch_plan.notes,
                *describe_slices(epoch_plan, slices),
            ]
            for line in lines:
                self.log(line)
            return PlanResult("preview", spec.name, lines=tuple(lines))
        # 5.
        epoch = self._record(epoch_plan, slices, run_id, owner, data_interval, None, reader.text)
        lines = [
            *reader.lines(spec.name),
            *planned_lines(epoch, epoch_plan, slices, owner, data_interval),
            *epoch_plan.notes,
        ]
        for line in lines:
            self.log(line)
        return plan_result(spec, "planned", epoch, lines, epoch_plan.backlog)

    def _record(
        self,
        epoch_plan: EpochPlan,
        slices: tuple[SlicePlan, ...],
        run_id: str,
        owner: str,
        data_interval: tuple[datetime, datetime] | None,
        replaces: int | None,
        reader_schema: str | None = None,
    ) -> Epoch:
        spec = self._need_spec("plan")
        epoch = self.ledger.plan_epoch(
            spec.name,
            epoch_plan.ranges,
            expected_participants(spec, slices),
            run_id=run_id,
            data_interval=data_interval,
            replaces=replaces,
            owner=owner,
            lease_s=self.settings.lease_s,
            reader_schema=reader_schema,
        )
        if spec.commits_before_processing:
            epoch = self.commit(number=epoch.number) or epoch  # at_most_once: the position moves now
        crash_point("after_plan")
        return epoch

    def _plan_replacement(self, done: Epoch, run_id: str, owner: str) -> PlanResult:
        """on_rerun="replace": plan the interval's ranges again; its output will replace ``done``'s."""
        spec = self._need_spec("plan")
        assert done.data_interval_start is not None and done.data_interval_end is not None
        interval = (done.data_interval_start, done.data_interval_end)
        epoch_plan = EpochPlan(done.ranges)
        slices = slices_of(spec, epoch_plan.ranges)
        epoch = self._record(epoch_plan, slices, run_id, owner, interval, done.number)
        line = (
            f"{epoch}: re-runs data interval {done.data_interval_start} .. {done.data_interval_end} "
            f"over the ranges of {done}, and will replace its output when it commits (on_rerun='replace')"
        )
        self.log(line)
        return plan_result(spec, "planned", epoch, [line, *describe_slices(epoch_plan, slices)])

    # ---------------------------------------------------------------------------------- process

    def slice_to_process(self, planned: PlanResult, slice_number: int) -> SliceGate:
        """Whether a process task has work: process, skip, or fail because the epoch was aborted.

        1. The plan said there is nothing to process (a preview, an interval already committed): skip.
        2. The slice has no read task in this epoch: skip.
        3. The epoch moved on (`decisions.slice_refusal`): an aborted one fails the task (its run cannot
           commit), a decided, committed or retention-deleted one is skipped (a cleared or retried task
           must not redo it).
        """
        # 1.
        if planned.status != "planned" or planned.epoch is None:
            return SliceGate("skip", f"nothing to process: plan said {planned.status}")
        # 2.
        if slice_number not in planned.slices_with_tasks:
            return SliceGate("skip", f"epoch {planned.epoch}: slice {slice_number} has no read task")
        # 3.
        try:
            epoch = self.ledger.epoch(self.pipeline, planned.epoch)
        except UnknownEpoch:  # only a final epoch is ever deleted
            return SliceGate(
                "skip", f"epoch {planned.epoch} was finished and removed by ledger retention: nothing to do"
            )
        refusal = slice_refusal(epoch, at_most_once=self._at_most_once)
        if refusal is None:
            return SliceGate("process", f"{epoch}, slice {slice_number}: processing", epoch)
        if epoch.status in (EpochStatus.ABORTING, EpochStatus.ABORTED):
            return SliceGate("aborted", refusal + " (aborted; the next run replays its range)", epoch)
        return SliceGate("skip", refusal, epoch)

    def replaced_epochs(self, epoch: Epoch) -> tuple[int, ...]:
        return replaced_epochs(self._need_spec("process"), self.ledger, epoch)

    def precommit_slice(
        self,
        epoch: Epoch,
        attempt_token: str,
        committables: Sequence[Committable],
        dead_letters: Sequence[DeadLetter] = (),
        *,
        tasks: Sequence[str] = (),
    ) -> Registration:
        """Pre-commit a slice: register what its tasks staged, and roll back every attempt that lost.

        1. Register every committable and dead letter in one ledger transaction, fenced by the epoch's
           attempt token (invariant 3). Refused as a whole: roll back every committable, then re-raise.
        2. Roll back the attempts that lost to an attempt registered earlier (a re-submitted slice).
        3. Roll back the attempts that staged but never reported (a speculative copy whose result Spark
           discarded, a task killed after staging): orphans of this epoch's ``tasks`` that are not the
           registered winner. After a crash before this step the sweeper does the same.
        """
        # 1.
        try:
            done = self.ledger.precommit_slice(
                self.pipeline,
                epoch.number,
                attempt_token,
                [] if self._at_most_once else committables,
                dead_letters,
                after_commit=self._at_most_once,
            )
        except (PrecommitRefused, IllegalTransition):
            self._roll_back(list(committables))
            raise
        # 2.
        self._roll_back(list(done.lost))
        # 3.
        if tasks and not self._at_most_once:
            sweep_orphans(self.ledger, self.pipeline, self.committers, only=(epoch.number, set(tasks)))
        return done

    def _roll_back(self, committables: list[Committable]) -> None:
        for sink in sorted({c.sink for c in committables}):
            self.committers[sink].abort([c for c in committables if c.sink == sink])

    def renew_lease(self, number: int) -> bool:
        """Keep the owner's lease on an epoch in flight; False once the epoch is final."""
        return self.ledger.renew_lease(self.pipeline, number, self.settings.lease_s)

    def renewing_lease(self, number: int) -> AbstractContextManager[None]:
        """`renew_lease` in the background while the block runs (a runner's heartbeat)."""
        return renewing(
            lambda: self.renew_lease(number), self.settings.lease_s / 3, self.log, f"lease of epoch {number}"
        )

    # ----------------------------------------------------------------------------------- commit

    def commit(self, *, number: int | None = None, run_id: str | None = None) -> Epoch | None:
        """Commit the epoch (Flink's notifyCheckpointComplete); idempotent, safe to repeat after a crash.

        1. Find the epoch (by number, or the run's); a committed one is left as it is, an aborted one is
           refused (invariant 6).
        2. Check that every sink of the epoch has a committer, before anything durable happens.
        3. Decide: PLANNED -> COMMITTING, written only when every expected participant pre-committed
           (invariant 4); a no-op once decided.
        4.-7. Finish the commit (`_finish_commit`): commit every participant, complete, show the
           position, retain.
        """
        # 1.
        epoch = self._find(_COMMITTED, number, run_id)
        if epoch is None or epoch.status is EpochStatus.COMMITTED:
            return epoch
        refusal = commit_refusal(epoch)
        if refusal is not None:
            raise Refused(refusal)
        if epoch.status is EpochStatus.COMMITTING:
            self.log(f"{epoch}: the decision to commit is durable; committing the remaining participants")
        # 2.
        self._require(epoch.sinks, epoch)
        # 3.
        crash_point("before_decision")
        epoch = self.ledger.record_commit_decision(self.pipeline, epoch.number)
        crash_point("after_decision")
        # 4.-7.
        done, _ = self._finish_commit(epoch)
        return done

    def _finish_commit(self, epoch: Epoch) -> tuple[Epoch, int]:
        """Steps 4-7 of `commit`, for a decided epoch (commit, or recover finishing one); returns the
        completed epoch and how many participants this call committed.

        4. For each sink: commit its still-PRECOMMITTED committables through its committer (idempotent,
           so a retry after a crash between commit and mark is harmless), then mark them COMMITTED.
        5. Complete: COMMITTING -> COMMITTED, which is what moves the source position and the state
           forward (invariant 7).
        6. Show the new position to Kafka's tools as consumer group ``onceflow-<pipeline>`` (a copy of
           the ledger's, best effort: a failure is logged and `onceflow status` reports the difference).
        7. Retain: every `retaining.retention_interval` epochs, delete the history older than the last
           ``retain_epochs`` committed epochs that no step needs, so the ledger stays bounded without a
           scheduled job; best effort, after the commit is complete.
        """
        # 4.
        committed = 0
        for i, (sink, committables) in enumerate(sorted(self._by_sink(epoch).items())):
            if i:
                crash_point("between_commits")
            call_committer(self.committers[sink], epoch, sink, "commit", committables, self.log)
            crash_point("participant_committed")
            committed += self.ledger.mark_committed(self.pipeline, epoch.number, sink)
        crash_point("before_complete")
        # 5.
        done = self.ledger.complete_commit(self.pipeline, epoch.number)
        self.log(f"{done}: every participant committed")
        # 6. (a coordinator without the spec does not know the pipeline's topics)
        if self.spec is not None:
            publish_position(self.ledger, self.spec, self.settings, self.log)
        # 7.
        retain_after_commit(self.ledger, self.pipeline, done.number, self.settings, self.log)
        return done, committed

    # ------------------------------------------------------------------------------------ abort

    def abort(self, *, reason: str, number: int | None = None, run_id: str | None = None) -> Epoch | None:
        """Abort an undecided epoch (Flink's abort); its range is replayed by the next epoch.

        1. Find the epoch; an aborted one is left as it is, a decided one is refused (invariant 5); an
           at-most-once epoch is committed at plan time, so there is nothing to roll back.
        2. Check that every sink with a registered participant has a committer.
        3.-5. Finish the abort (`_finish_abort`): decide, roll back every participant, complete.
        """
        # 1.
        epoch = self._find(_ABORTED, number, run_id)
        if epoch is None or epoch.status is EpochStatus.ABORTED:
            return epoch
        if self._at_most_once and epoch.status is EpochStatus.COMMITTED:
            self.log(
                f"{epoch}: at_most_once committed its offsets before processing; nothing to roll back, and "
                "the records it did not deliver are not replayed"
            )
            return epoch
        refusal = abort_refusal(epoch)
        if refusal is not None:
            raise Refused(refusal)
        # 2.
        self._require(self._registered_sinks(epoch), epoch)
        # 3.-5.
        done, _ = self._finish_abort(epoch, reason)
        self.log(f"{done}: rolled back ({reason}); its ranges are replayed by the next epoch")
        return done

    def _finish_abort(self, epoch: Epoch, reason: str) -> tuple[Epoch, int]:
        """Steps 3-5 of `abort`, for an undecided or aborting epoch (abort, or recover rolling one back);
        returns the aborted epoch and how many participants this call rolled back.

        3. Decide: PLANNED -> ABORTING with the reason (who aborted, and why); a no-op once aborting.
        4. For each sink: roll back every registered participant's staging (idempotent), mark them ABORTED.
        5. Complete: ABORTING -> ABORTED; nothing of the epoch becomes visible (invariant 6).
        """
        # 3.
        epoch = self.ledger.record_abort_decision(self.pipeline, epoch.number, reason)
        crash_point("during_abort")
        # 4.
        aborted = 0
        for sink, committables in sorted(self._by_sink(epoch).items()):
            call_committer(self.committers[sink], epoch, sink, "abort", committables, self.log)
            aborted += self.ledger.mark_aborted(self.pipeline, epoch.number, sink)
        # 5.
        return self.ledger.complete_abort(self.pipeline, epoch.number), aborted

    # ---------------------------------------------------------------------------------- recover

    def recover(
        self, *, by: str = "recover", force: bool = False, owner_alive: OwnerAlive = process_alive
    ) -> RecoveryReport:
        """Bring the pipeline back to a clean state after a crash anywhere (Flink's initializeState).

        1. Find the epoch in flight, if any (at most one: invariant 1), and decide
           (`decisions.decide_recovery`): an undecided epoch whose owner is alive is kept, never rolled
           back (unless ``force``).
        2. COMMITTING: the decision is durable, so finish the commit (`_finish_commit`, invariant 5).
        3. PLANNED with its owner gone, or ABORTING: finish the abort (`_finish_abort`), recording who
           aborted and why; the next epoch replays the range (invariants 2, 6).
        4. Sweep: roll back staged output the ledger does not own (invariant 9); see `sweep`.
        """
        report = RecoveryReport(pipeline=self.pipeline)
        # 1.
        epoch = self.ledger.open_epoch(self.pipeline)
        alive = owner_alive(epoch.owner or "") if epoch is not None and epoch.owner else None
        action, why = decide_recovery(epoch, now=utcnow(), owner_alive=alive, force=force)
        if epoch is not None and action == "keep":
            self.log(f"{epoch}: kept, {why}")
            report = RecoveryReport(self.pipeline, epoch.number, "kept", why)
        elif epoch is not None and action == "commit":
            # 2.
            self._require(epoch.sinks, epoch)
            crash_point("during_recover")
            _, committed = self._finish_commit(epoch)
            report = RecoveryReport(self.pipeline, epoch.number, "committed", why, committed)
        elif epoch is not None and action == "abort":
            # 3.
            self._require(self._registered_sinks(epoch), epoch)
            reason = f"aborted by {by}: {why}" if epoch.status is EpochStatus.PLANNED else why
            crash_point("during_recover")
            _, aborted = self._finish_abort(epoch, reason)
            report = RecoveryReport(
                self.pipeline, epoch.number, "aborted", reason, participants_aborted=aborted
            )
        # 4.
        report = self.sweep(report)
        self.log(report.summary())
        return report

    def sweep(self, report: RecoveryReport | None = None) -> RecoveryReport:
        """Roll back every orphan the ledger does not own (invariant 9); re-commit a committed winner.

        1. List every committer's orphans first, then read the ledger (so that an epoch planned meanwhile
           is seen as in flight and its staging is kept).
        2. Classify each (`decisions.classify_orphan`): unknown and aborted epochs, unexpected tasks and
           losing attempts are rolled back; staging a live epoch may still register is kept.
        """
        return sweep_orphans(self.ledger, self.pipeline, self.committers, report)

    # ------------------------------------------------------------------------ retention, report

    def retain(
        self, *, keep_epochs: int | None = None, dead_letter_days: float | None = None
    ) -> RetentionResult:
        """Delete the pipeline's ledger history that no step can still need (`retaining.retain`)."""
        return retain(
            self.ledger,
            self.pipeline,
            self.settings,
            self.log,
            keep_epochs=keep_epochs,
            dead_letter_days=dead_letter_days,
        )

    def report(self, *, run_id: str) -> list[str]:
        """The run's epoch in a few lines: status, ranges, records per sink, dead letters."""
        lines = report_lines(self.ledger, self.pipeline, run_id)
        for line in lines:
            self.log(line)
        return lines


__all__ = ["Coordinator", "EpochOwned", "Refused"]
