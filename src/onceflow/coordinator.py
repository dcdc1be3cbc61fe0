"""The coordinator of one pipeline: the protocol's single home (Flink's CheckpointCoordinator).

Every door goes through `Coordinator`: the Airflow operators, the ``onceflow`` CLI, the runner
(``onceflow run``), the slice job's driver, the fault harness and the benchmarks. Its methods are the
protocol's steps, each with its numbered steps in the docstring and the code following them:

    plan -> process (Spark, outside) -> pre-commit (`register_slice`) -> commit (decide, commit, complete)
                                                                      -> abort (decide, roll back, complete)
    recover (finish or roll back the epoch in flight, then sweep) ... report

Decisions are pure functions in `onceflow.decisions`; durable state and its compare-and-set transitions
live in the ledger, which knows nothing of sinks. Every step is idempotent and recorded in the ledger
before the next one, so running any of them again after a crash anywhere picks up where the last run
stopped (invariant 8).
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from onceflow.committables import Committable
from onceflow.config import Settings
from onceflow.decisions import (
    abort_refusal,
    commit_refusal,
    decide_plan,
    decide_recovery,
    where,
)
from onceflow.engine.planning import (
    describe_slices,
    expected_participants,
    participant_sinks,
    replaced_epochs,
    run_plan_checks,
    slices_of,
)
from onceflow.errors import ConfigError, one_line
from onceflow.faults import crash_point
from onceflow.ledger import (
    Epoch,
    EpochStatus,
    IllegalTransition,
    Ledger,
    MissingCommitter,
    Participant,
    ParticipantStatus,
    PrecommitRefused,
    SinkCallFailed,
    UnknownEpoch,
)
from onceflow.ledger.ledger import Registration
from onceflow.ledger.models import utcnow
from onceflow.ledger.retention import RetentionPolicy, RetentionResult
from onceflow.pipeline import Pipeline
from onceflow.records import DeadLetter
from onceflow.sinks.base import SinkCommitter
from onceflow.sinks.registry import sink_kind
from onceflow.sources.kafka_planning import EpochPlan, SlicePlan

Log = Callable[[str], None]
PlanStatus = Literal["planned", "preview", "already_committed"]
OrphanAction = Literal["abort", "commit", "keep"]
OwnerAlive = Callable[[str], "bool | None"]


class Refused(IllegalTransition):
    """The invariants forbid what was asked (commit of an aborted epoch, abort of a decided one);
    nothing was changed. The message is the same whichever door asked."""


class EpochOwned(IllegalTransition):
    """Another live runner owns the pipeline's epoch in flight; epochs run one at a time."""


def _quiet(_: str) -> None:
    return None


# ------------------------------------------------------------------------------------------- owners

_OWNER = re.compile(r"\(pid (\d+) on (\S+)\)$")


def owner_of_this_process(name: str) -> str:
    """An epoch owner's name as stored in the ledger: who, and which process on which host."""
    return f"{name} (pid {os.getpid()} on {socket.gethostname()})"


def process_alive(owner: str) -> bool | None:
    """Whether the owner's process still runs: known only for a process on this host."""
    found = _OWNER.search(owner or "")
    if found is None or found.group(2) != socket.gethostname():
        return None
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class PlanResult:
    """What ``plan`` decided, small enough for an Airflow XCom (see `to_dict`)."""

    status: PlanStatus
    pipeline: str
    epoch: int | None = None
    attempt_token: str | None = None
    slices_with_tasks: tuple[int, ...] = ()
    lines: tuple[str, ...] = field(default=())
    span: int = 0  # offsets the epoch reads
    backlog: int = 0  # offsets left for later epochs when it was planned

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "attempt_token": self.attempt_token,
            "slices_with_tasks": list(self.slices_with_tasks),
            "lines": list(self.lines),
            "span": self.span,
            "backlog": self.backlog,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanResult:
        return cls(
            status=data["status"],
            pipeline=data["pipeline"],
            epoch=data.get("epoch"),
            attempt_token=data.get("attempt_token"),
            slices_with_tasks=tuple(data.get("slices_with_tasks", ())),
            lines=tuple(data.get("lines", ())),
            span=int(data.get("span", 0)),
            backlog=int(data.get("backlog", 0)),
        )


@dataclass(frozen=True)
class RecoveryReport:
    """What ``recover`` did, for the task log and ``onceflow recover --json``."""

    pipeline: str
    epoch: int | None = None
    outcome: Literal["nothing in flight", "committed", "aborted", "kept"] = "nothing in flight"
    reason: str = ""
    participants_committed: int = 0
    participants_aborted: int = 0
    orphans_aborted: tuple[Committable, ...] = field(default=())
    orphans_recommitted: tuple[Committable, ...] = field(default=())
    orphans_kept: tuple[Committable, ...] = field(default=())

    def summary(self) -> str:
        if self.epoch is None:
            head = f"pipeline {self.pipeline!r}: nothing in flight"
        elif self.outcome == "kept":
            head = f"pipeline {self.pipeline!r}: epoch {self.epoch} kept ({self.reason})"
        else:
            head = (
                f"pipeline {self.pipeline!r}: epoch {self.epoch} {self.outcome} "
                f"({self.participants_committed} participants committed, "
                f"{self.participants_aborted} aborted)"
            )
        kept = f", {len(self.orphans_kept)} kept (epoch in flight)" if self.orphans_kept else ""
        return (
            f"{head}; orphans: {len(self.orphans_aborted)} rolled back, "
            f"{len(self.orphans_recommitted)} re-committed{kept}"
        )

    def to_dict(self) -> dict[str, Any]:
        def ids(cs: Sequence[Committable]) -> list[dict[str, Any]]:
            return [{"epoch": c.epoch, "sink": c.sink, "task": c.task, "attempt": c.attempt} for c in cs]

        return {
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "outcome": self.outcome,
            "reason": self.reason,
            "participants_committed": self.participants_committed,
            "participants_aborted": self.participants_aborted,
            "orphans_aborted": ids(self.orphans_aborted),
            "orphans_recommitted": ids(self.orphans_recommitted),
            "orphans_kept": ids(self.orphans_kept),
        }


def classify_orphan(orphan: Committable, epoch: Epoch | None, winner: Participant | None) -> OrphanAction:
    """What the sweeper does with staged output a sink reports (invariant 9).

    ``winner`` is the participant the ledger registered for the orphan's (sink, task), if any. Staging of
    a PLANNED epoch that is expected and not beaten by another attempt is kept: its slice's driver may be
    about to register it. A winner of a COMMITTED epoch is committed again (a no-op if it was), never
    rolled back.
    """
    if epoch is None or epoch.status in (EpochStatus.ABORTING, EpochStatus.ABORTED):
        return "abort"
    owned = winner is not None and winner.attempt == orphan.attempt
    if epoch.status is EpochStatus.PLANNED:
        if (orphan.sink, orphan.task) not in epoch.expected:
            return "abort"
        return "keep" if owned or winner is None else "abort"
    if not owned:
        return "abort"  # a losing or unregistered attempt can never join a decided epoch
    return "commit" if epoch.status is EpochStatus.COMMITTED else "keep"


def retention_interval(retain_epochs: int) -> int:
    """How often a commit applies retention: every tenth of the kept epochs, so its cost (finding the
    epochs that hold a position reads every kept offset row) is paid once per that many epochs, and a
    pipeline keeps at most ``retain_epochs`` plus that many committed epochs."""
    return max(1, retain_epochs // 10)


def committers_for(spec: Pipeline, settings: Settings) -> dict[str, SinkCommitter]:
    """A committer per participant sink of the pipeline (its sinks, plus its keyed state's)."""
    committers = {}
    for sink in participant_sinks(spec, settings):
        kind = sink_kind(sink.kind)
        committers[sink.name] = kind.build_committer(kind.config_for(sink, settings))
    return committers


# ------------------------------------------------------------------------------------- coordinator


class Coordinator:
    """The protocol for one pipeline, over a ledger, the pipeline's committers and its Kafka source.

    Build it with `for_pipeline` from a spec (what every door does), or from a ledger and committers
    alone to drive epochs that something else planned (tests, tools). ``log`` receives one line per
    thing done, for a task log or a terminal.
    """

    def __init__(
        self,
        ledger: Ledger,
        pipeline: str,
        committers: Mapping[str, SinkCommitter] | None = None,
        *,
        spec: Pipeline | None = None,
        settings: Settings | None = None,
        log: Log = _quiet,
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
        cls, spec: Pipeline, ledger: Ledger, settings: Settings, *, log: Log = _quiet
    ) -> Coordinator:
        return cls(ledger, spec.name, spec=spec, settings=settings, log=log)

    # ---------------------------------------------------------------------------------- helpers

    @property
    def committers(self) -> dict[str, SinkCommitter]:
        """Built on first use: the slice driver and `plan` never need them."""
        if self._committers is None:
            if self.spec is None:
                raise MissingCommitter(f"pipeline {self.pipeline!r}: no committers and no spec to build them")
            self._committers = committers_for(*self._need_spec("commit or abort"))
        return self._committers

    def _need_spec(self, step: str) -> tuple[Pipeline, Settings]:
        if self.spec is None or self.settings is None:
            raise ConfigError(f"{step} of pipeline {self.pipeline!r} needs its spec and settings")
        return self.spec, self.settings

    def _require(self, sinks: Sequence[str], epoch: Epoch) -> None:
        missing = [sink for sink in sinks if sink not in self.committers]
        if missing:
            raise MissingCommitter(
                f"{epoch}: no committer for sink(s) {', '.join(missing)}; nothing was changed"
            )

    def _call(self, epoch: Epoch, sink: str, action: str, committables: list[Committable]) -> None:
        committer = self.committers[sink]
        try:
            (committer.commit if action == "commit" else committer.abort)(committables)
        except Exception as exc:
            raise SinkCallFailed(
                f"{epoch}: {action} of {len(committables)} committable(s) of sink {sink!r} failed "
                f"({type(exc).__name__}: {one_line(exc)}); "
                f"the epoch stays {epoch.status} and the {action} is retried by the next commit, abort or "
                "recover"
            ) from exc

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

    def _find(self, verb: str, number: int | None, run_id: str | None) -> Epoch | None:
        """The epoch a commit or abort acts on; says so when there is none, or it is already done."""
        epoch = self.target(number=number, run_id=run_id)
        if epoch is None:
            self.log(f"run {run_id} planned no epoch of {self.pipeline!r}: nothing to {verb}")
        elif verb == "commit" and epoch.status is EpochStatus.COMMITTED:
            self.log(f"{epoch} is already committed (at {epoch.finished_at}): nothing changed")
        elif verb == "abort" and epoch.status is EpochStatus.ABORTED:
            self.log(f"{epoch} is already aborted (reason: {epoch.abort_reason}): nothing changed")
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
        spec, settings = self._need_spec("preview")
        from onceflow.sources.kafka_metadata import KafkaMetadata

        committed = self.ledger.committed_offsets(spec.name)
        interval_end_ms = int(data_interval[1].timestamp() * 1000) if data_interval else None
        with KafkaMetadata(settings.kafka_bootstrap) as metadata:
            plan = metadata.plan(
                spec.source,
                committed,
                max_records_per_partition=max_records_per_partition or spec.max_records_per_partition,
                interval_end_ms=interval_end_ms,
            )
        slices = slices_of(spec, plan.ranges)
        run_plan_checks(spec, settings, parallel_tasks=sum(len(s.tasks) for s in slices))
        return plan, slices

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
        2. Preview: print the ranges the epoch would read; the ledger is not touched (a dry run).
        3. Read the committed positions and Kafka's offsets, and bound the ranges by the data interval.
        4. Check the spec against its sinks for the epoch's tasks (guarantee, transform importable, sink
           kinds' plan-time checks such as PostgreSQL's room for prepared transactions).
        5. Record the ranges, the participants and the owner's lease in the ledger: from here on the
           epoch is durable (like Spark's offset log, before anything runs). An at-most-once epoch is
           committed right away (its position moves before processing).
        """
        spec, _ = self._need_spec("plan")
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
                self.ledger.renew_lease(spec.name, decision.epoch.number, self._lease_s())
            return self._result(status, decision.epoch, [decision.line])
        if decision.action == "wait":
            raise EpochOwned(decision.line)
        # 2.
        if preview:
            epoch_plan, slices = self.preview(
                data_interval=data_interval, max_records_per_partition=max_records_per_partition
            )
            lines = [
                f"preview (dry run) of {spec.name!r}: the next epoch would read {epoch_plan.span} offsets "
                f"in {len(epoch_plan.ranges)} partitions (nothing was written to the ledger)",
                *describe_slices(epoch_plan, slices),
            ]
            for line in lines:
                self.log(line)
            return PlanResult("preview", spec.name, lines=tuple(lines))
        # 3. and 4.
        epoch_plan, slices = self.preview(
            data_interval=data_interval, max_records_per_partition=max_records_per_partition
        )
        # 5.
        epoch = self._record(epoch_plan, slices, run_id, owner, data_interval, None)
        lines = [
            f"{epoch}: {epoch_plan.span} offsets in {len(epoch_plan.ranges)} partitions, "
            f"{len(epoch.expected)} participants, owner {owner}"
            + (
                f", data interval {data_interval[0].isoformat()} .. {data_interval[1].isoformat()}"
                if data_interval
                else ""
            ),
            *describe_slices(epoch_plan, slices),
        ]
        if data_interval is not None and epoch_plan.is_empty:
            lines.append(
                "  nothing new up to the interval's end (a later interval's epoch may have read it already)"
            )
        for line in lines:
            self.log(line)
        return self._result("planned", epoch, lines, epoch_plan.backlog)

    def _lease_s(self) -> float:
        return (self.settings or Settings.from_env()).lease_s

    def _record(
        self,
        epoch_plan: EpochPlan,
        slices: tuple[SlicePlan, ...],
        run_id: str,
        owner: str,
        data_interval: tuple[datetime, datetime] | None,
        replaces: int | None,
    ) -> Epoch:
        spec, _ = self._need_spec("plan")
        epoch = self.ledger.plan_epoch(
            spec.name,
            epoch_plan.ranges,
            expected_participants(spec, slices),
            run_id=run_id,
            data_interval=data_interval,
            replaces=replaces,
            owner=owner,
            lease_s=self._lease_s(),
        )
        if spec.commits_before_processing:
            epoch = self.commit(number=epoch.number) or epoch  # at_most_once: the position moves now
        crash_point("after_plan")
        return epoch

    def _plan_replacement(self, done: Epoch, run_id: str, owner: str) -> PlanResult:
        """on_rerun="replace": plan the interval's ranges again; its output will replace ``done``'s."""
        spec, _ = self._need_spec("plan")
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
        return self._result("planned", epoch, [line, *describe_slices(epoch_plan, slices)])

    def _result(self, status: PlanStatus, epoch: Epoch, lines: list[str], backlog: int = 0) -> PlanResult:
        spec, _ = self._need_spec("plan")
        slices = slices_of(spec, epoch.ranges)
        return PlanResult(
            status=status,
            pipeline=spec.name,
            epoch=epoch.number,
            attempt_token=epoch.attempt_token,
            slices_with_tasks=tuple(s.slice for s in slices if s.tasks),
            lines=tuple(lines),
            span=sum(r.span for r in epoch.ranges),
            backlog=backlog,
        )

    # ---------------------------------------------------------------------------------- process

    def slice_to_process(self, planned: PlanResult, slice_number: int) -> tuple[Epoch | None, str]:
        """Whether a process task has work: the epoch to process, or why not (the slice gate).

        1. The plan said there is nothing to process (a preview, an interval already committed).
        2. The slice has no read task in this epoch.
        3. The epoch moved on (decided, committed or aborted, or deleted by retention since): a cleared or
           retried task must not redo it.
           An at-most-once epoch is committed when planned and is processed all the same.
        """
        # 1.
        if planned.status != "planned" or planned.epoch is None:
            return None, f"nothing to process: plan said {planned.status}"
        # 2.
        if slice_number not in planned.slices_with_tasks:
            return None, f"epoch {planned.epoch}: slice {slice_number} has no read task"
        # 3.
        try:
            epoch = self.ledger.epoch(self.pipeline, planned.epoch)
        except UnknownEpoch:  # only a final epoch is ever deleted
            return None, f"epoch {planned.epoch} was finished and removed by ledger retention: nothing to do"
        at_most_once = self.spec is not None and self.spec.commits_before_processing
        if epoch.status is EpochStatus.PLANNED or (at_most_once and epoch.status is EpochStatus.COMMITTED):
            return epoch, f"{epoch}, slice {slice_number}: processing"
        return None, f"{epoch} is {epoch.status}: the slice has nothing left to do"

    def replaced_epochs(self, epoch: Epoch) -> tuple[int, ...]:
        spec, _ = self._need_spec("process")
        return replaced_epochs(spec, self.ledger, epoch)

    def register_slice(
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
        at_most_once = self.spec is not None and self.spec.commits_before_processing
        # 1.
        try:
            done = self.ledger.register_slice(
                self.pipeline,
                epoch.number,
                attempt_token,
                [] if at_most_once else committables,
                dead_letters,
                after_commit=at_most_once,
            )
        except (PrecommitRefused, IllegalTransition):
            self._roll_back(list(committables))
            raise
        # 2.
        self._roll_back(list(done.lost))
        # 3.
        if tasks and not at_most_once:
            self._sweep_epoch(epoch.number, set(tasks))
        return done

    def _roll_back(self, committables: list[Committable]) -> None:
        for sink in sorted({c.sink for c in committables}):
            self.committers[sink].abort([c for c in committables if c.sink == sink])

    def renew(self, number: int) -> bool:
        """Keep the owner's lease on an epoch in flight; False once the epoch is final."""
        return self.ledger.renew_lease(self.pipeline, number, self._lease_s())

    @contextmanager
    def lease_kept(self, number: int) -> Iterator[None]:
        """Renew the epoch's lease in the background while the block runs (a runner's heartbeat)."""
        stop = threading.Event()
        period = max(self._lease_s() / 3, 0.5)

        def beat() -> None:
            while not stop.wait(period):
                try:
                    if not self.renew(number):
                        return
                except Exception as exc:  # a ledger hiccup: the next beat tries again
                    self.log(f"lease renewal of epoch {number} failed ({exc}); retrying")

        thread = threading.Thread(target=beat, name=f"onceflow-lease-{number}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)

    # ----------------------------------------------------------------------------------- commit

    def commit(self, *, number: int | None = None, run_id: str | None = None) -> Epoch | None:
        """Commit the epoch (Flink's notifyCheckpointComplete); idempotent, safe to repeat after a crash.

        1. Find the epoch (by number, or the run's); a committed one is left as it is, an aborted one is
           refused (invariant 6).
        2. Check that every sink of the epoch has a committer, before anything durable happens.
        3. Decide: PLANNED -> COMMITTING, written only when every expected participant pre-committed
           (invariant 4); a no-op once decided.
        4. For each sink: commit its still-PRECOMMITTED committables through its committer (idempotent,
           so a retry after a crash between commit and mark is harmless), then mark them COMMITTED.
        5. Complete: COMMITTING -> COMMITTED with the epoch's staged state, in one transaction, which is
           what moves the source position and the state forward (invariant 7).
        6. Show the new position to Kafka's tools as consumer group ``onceflow-<pipeline>`` (a copy of
           the ledger's, best effort: a failure is logged and `onceflow status` reports the difference).
        7. Retain: every `retention_interval` epochs, delete the history older than the last
           ``retain_epochs`` committed epochs that no step needs (`retain`), so the ledger stays bounded
           without a scheduled job; best effort, after the commit is complete, and skipped when the
           coordinator has no settings or retention is off.
        """
        # 1.
        epoch = self._find("commit", number, run_id)
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
        epoch = self.ledger.decide_commit(self.pipeline, epoch.number)
        crash_point("after_decision")
        # 4.
        self._commit_participants(epoch)
        crash_point("before_complete")
        # 5.
        done = self.ledger.complete_commit(self.pipeline, epoch.number)
        self.log(f"{done}: every participant committed")
        # 6.
        self.show_position()
        # 7.
        self._retain_after_commit(done.number)
        return done

    def position_group(self) -> str | None:
        """The consumer group this coordinator keeps in step with the ledger: ``onceflow-<pipeline>``,
        unless one of the pipeline's sinks commits that group inside its own transaction."""
        from onceflow.sources.consumer_group import position_group

        if self.spec is None or self.settings is None:
            return None
        group = position_group(self.pipeline)
        for sink in self.spec.sinks:
            kind = sink_kind(sink.kind)
            if kind.consumer_group(kind.config_for(sink, self.settings), self.pipeline) == group:
                return None
        return group

    def show_position(self) -> None:
        """Step 6 of `commit`: write the ledger's committed positions to the position group."""
        from onceflow.sources.consumer_group import publish_positions

        group = self.position_group()
        if group is None or self.settings is None:
            return
        try:
            publish_positions(
                self.settings.kafka_bootstrap, group, self.ledger.committed_offsets(self.pipeline)
            )
        except Exception as exc:  # a copy for Kafka's tools: it never fails a commit that is done
            self.log(
                f"pipeline {self.pipeline!r}: consumer group {group!r} not updated ({exc}); the ledger "
                "holds the position, and the next committed epoch writes the group again"
            )

    def _commit_participants(self, epoch: Epoch) -> int:
        done = 0
        for i, (sink, committables) in enumerate(sorted(self._by_sink(epoch).items())):
            if i:
                crash_point("between_commits")
            self._call(epoch, sink, "commit", committables)
            crash_point("participant_committed")
            done += self.ledger.mark_committed(self.pipeline, epoch.number, sink)
        return done

    # ------------------------------------------------------------------------------------ abort

    def abort(self, *, reason: str, number: int | None = None, run_id: str | None = None) -> Epoch | None:
        """Abort an undecided epoch (Flink's abort); its range is replayed by the next epoch.

        1. Find the epoch; an aborted one is left as it is, a decided one is refused (invariant 5); an
           at-most-once epoch is committed at plan time, so there is nothing to roll back.
        2. Check that every sink with a registered participant has a committer.
        3. Decide: PLANNED -> ABORTING with the reason (who aborted, and why); a no-op once aborting.
        4. For each sink: roll back every registered participant's staging (idempotent), mark them ABORTED.
        5. Complete: ABORTING -> ABORTED, discarding the epoch's staged state in the same transaction.
        """
        # 1.
        epoch = self._find("abort", number, run_id)
        if epoch is None or epoch.status is EpochStatus.ABORTED:
            return epoch
        if (
            self.spec is not None
            and self.spec.commits_before_processing
            and epoch.status is EpochStatus.COMMITTED
        ):
            self.log(
                f"{epoch}: at_most_once committed its offsets before processing; nothing to roll back, and "
                "the records it did not deliver are not replayed"
            )
            return epoch
        refusal = abort_refusal(epoch)
        if refusal is not None:
            raise Refused(refusal)
        # 2.
        registered = sorted({p.sink for p in self.ledger.participants(self.pipeline, epoch.number)})
        self._require(registered, epoch)
        # 3.
        epoch = self.ledger.decide_abort(self.pipeline, epoch.number, reason)
        crash_point("during_abort")
        # 4.
        self._abort_participants(epoch)
        # 5.
        done = self.ledger.complete_abort(self.pipeline, epoch.number)
        self.log(f"{done}: rolled back ({reason}); its ranges are replayed by the next epoch")
        return done

    def _abort_participants(self, epoch: Epoch) -> int:
        done = 0
        for sink, committables in sorted(self._by_sink(epoch).items()):
            self._call(epoch, sink, "abort", committables)
            done += self.ledger.mark_aborted(self.pipeline, epoch.number, sink)
        return done

    # ---------------------------------------------------------------------------------- recover

    def recover(
        self, *, by: str = "recover", force: bool = False, owner_alive: OwnerAlive = process_alive
    ) -> RecoveryReport:
        """Bring the pipeline back to a clean state after a crash anywhere (Flink's initializeState).

        1. Find the epoch in flight, if any (at most one: invariant 1), and decide
           (`decisions.decide_recovery`): an undecided epoch whose owner is alive is kept, never rolled
           back (unless ``force``).
        2. COMMITTING: the decision is durable, so commit every participant and complete (invariant 5).
        3. PLANNED with its owner gone, or ABORTING: roll back every registered participant and complete
           the abort, recording who aborted and why; the next epoch replays the range (invariants 2, 6).
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
            committed = self._commit_participants(epoch)
            crash_point("during_recover")
            self.ledger.complete_commit(self.pipeline, epoch.number)
            self.show_position()
            report = RecoveryReport(self.pipeline, epoch.number, "committed", why, committed)
        elif epoch is not None and action == "abort":
            # 3.
            registered = sorted({p.sink for p in self.ledger.participants(self.pipeline, epoch.number)})
            self._require(registered, epoch)
            reason = f"aborted by {by}: {why}" if epoch.status is EpochStatus.PLANNED else why
            epoch = self.ledger.decide_abort(self.pipeline, epoch.number, reason)
            aborted = self._abort_participants(epoch)
            crash_point("during_recover")
            self.ledger.complete_abort(self.pipeline, epoch.number)
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
        2. Classify each (`classify_orphan`): unknown and aborted epochs, unexpected tasks and losing
           attempts are rolled back; staging a live epoch may still register is kept.
        """
        return self._sweep(report or RecoveryReport(pipeline=self.pipeline), None, None)

    def _sweep_epoch(self, number: int, tasks: set[str]) -> RecoveryReport:
        return self._sweep(RecoveryReport(pipeline=self.pipeline), number, tasks)

    def _sweep(
        self, report: RecoveryReport, only_epoch: int | None, tasks: set[str] | None
    ) -> RecoveryReport:
        # 1.
        found: dict[tuple[int, str, str, str], tuple[Committable, SinkCommitter]] = {}
        for sink, committer in sorted(self.committers.items()):
            for orphan in self._orphans(sink, committer):
                if only_epoch is not None and (
                    orphan.epoch != only_epoch or orphan.task not in (tasks or ())
                ):
                    continue
                found.setdefault(
                    (orphan.epoch, orphan.sink, orphan.task, orphan.attempt), (orphan, committer)
                )
        if not found:
            return report
        if only_epoch is None:
            epochs = {e.number: e for e in self.ledger.epochs(self.pipeline)}
        else:
            epochs = {only_epoch: self.ledger.epoch(self.pipeline, only_epoch)}
        winners: dict[int, dict[tuple[str, str], Participant]] = {}
        actions: dict[OrphanAction, list[tuple[Committable, SinkCommitter]]] = {
            "abort": [],
            "commit": [],
            "keep": [],
        }
        # 2.
        for orphan, committer in found.values():
            epoch = epochs.get(orphan.epoch)
            if epoch is not None and epoch.number not in winners:
                winners[epoch.number] = {
                    (p.sink, p.task): p for p in self.ledger.participants(self.pipeline, epoch.number)
                }
            winner = None if epoch is None else winners[epoch.number].get((orphan.sink, orphan.task))
            action = classify_orphan(orphan, epoch, winner)
            # Re-commit with the committable the ledger holds: it is the full handle the writer reported.
            chosen = winner.committable if action == "commit" and winner is not None else orphan
            actions[action].append((chosen, committer))
        for orphan, committer in actions["abort"]:
            committer.abort([orphan])
        for orphan, committer in actions["commit"]:
            committer.commit([orphan])
        return replace(
            report,
            orphans_aborted=tuple(c for c, _ in actions["abort"]),
            orphans_recommitted=tuple(c for c, _ in actions["commit"]),
            orphans_kept=tuple(c for c, _ in actions["keep"]),
        )

    def _orphans(self, sink: str, committer: SinkCommitter) -> list[Committable]:
        try:
            return list(committer.orphans(self.pipeline))
        except Exception as exc:
            raise SinkCallFailed(
                f"pipeline {self.pipeline!r}: the sweep could not list the staged work of sink {sink!r} "
                f"({type(exc).__name__}: {one_line(exc)}); nothing was changed: check that the sink's "
                "service is reachable, then run again"
            ) from exc

    # -------------------------------------------------------------------------------- retention

    def retain(
        self, *, keep_epochs: int | None = None, dead_letter_days: float | None = None
    ) -> RetentionResult:
        """Delete the pipeline's ledger history that no step can still need; rows deleted per kind.

        1. Take the policy from the arguments, else from the settings (``retain_epochs``,
           ``dead_letter_days``); with retention off (0 epochs) and no ``keep_epochs``, do nothing.
        2. Let the ledger delete in batches, one transaction each (`Ledger.retain`): old final epochs
           with their rows, except those holding a partition's position, the latest state snapshot, the
           data interval in flight and young dead letters; superseded state snapshot rows; old dead
           letters of finished epochs.
        3. Log one line per kind.
        """
        # 1.
        settings = self.settings or Settings.from_env()
        keep = settings.retain_epochs if keep_epochs is None else keep_epochs
        days = settings.dead_letter_days if dead_letter_days is None else dead_letter_days
        if keep == 0:
            self.log(f"pipeline {self.pipeline!r}: retention is off (ONCEFLOW_RETAIN_EPOCHS=0)")
            return RetentionResult(self.pipeline)
        # 2.
        result = self.ledger.retain(self.pipeline, self._retention_policy(keep, days))
        # 3.
        for line in result.lines():
            self.log(line)
        return result

    def _retention_policy(self, keep_epochs: int, dead_letter_days: float) -> RetentionPolicy:
        try:
            return RetentionPolicy(keep_epochs=keep_epochs, dead_letter_age=timedelta(days=dead_letter_days))
        except ValueError as exc:
            raise ConfigError(f"retention of pipeline {self.pipeline!r}: {exc}") from exc

    def _retain_after_commit(self, number: int) -> None:
        """Step 7 of `commit`: retention as configured; a failure never fails a complete commit."""
        if self.settings is None or self.settings.retain_epochs == 0:
            return
        every = retention_interval(self.settings.retain_epochs)
        if number % every:
            return
        try:
            policy = self._retention_policy(self.settings.retain_epochs, self.settings.dead_letter_days)
            result = self.ledger.retain(self.pipeline, policy)
        except Exception as exc:  # the commit is done; a later one retains again
            self.log(
                f"pipeline {self.pipeline!r}: retention skipped ({one_line(exc)}); the commit of epoch "
                f"{number + every} tries again, or run `onceflow retain {self.pipeline}`"
            )
            return
        if result.total:
            counts = ", ".join(f"{rows} {kind}" for kind, rows in result.deleted.items() if rows)
            self.log(f"pipeline {self.pipeline!r}: retention deleted {counts}")

    # ----------------------------------------------------------------------------------- report

    def report(self, *, run_id: str) -> list[str]:
        """The run's epoch in a few lines: status, ranges, records per sink, dead letters."""
        epoch = self.ledger.epoch_of_run(self.pipeline, run_id)
        if epoch is None:
            lines = [f"run {run_id} planned no epoch of {self.pipeline!r}"]
        else:
            per_sink: dict[str, int] = {}
            for p in self.ledger.participants(self.pipeline, epoch.number):
                per_sink[p.sink] = per_sink.get(p.sink, 0) + p.record_count
            letters = self.ledger.dead_letters(self.pipeline, epoch=epoch.number, include_uncommitted=True)
            lines = [
                f"{epoch}" + (f" (abort reason: {epoch.abort_reason})" if epoch.abort_reason else ""),
                "  input: " + (", ".join(str(r) for r in epoch.ranges if not r.is_empty) or "nothing new"),
                *(f"  sink {sink}: {count} records" for sink, count in sorted(per_sink.items())),
                f"  dead letters: {len(letters)}",
            ]
        for line in lines:
            self.log(line)
        return lines


__all__ = [
    "Coordinator",
    "EpochOwned",
    "PlanResult",
    "RecoveryReport",
    "Refused",
    "classify_orphan",
    "committers_for",
    "owner_of_this_process",
    "process_alive",
    "retention_interval",
    "where",
]
