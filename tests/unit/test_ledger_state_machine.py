"""Random interleavings of the protocol against the ledger, checking every invariant after each step.

The machine plays planner, Spark tasks (honest, duplicate and zombie), coordinator, operator and recovery
at once, keeps its own model of what each call must do, and reads the ledger's real tables (plain SQL) to
check the invariants of docs/architecture.md after every step. `run_machine` is shared with the
PostgreSQL run in tests/integration/test_ledger_postgres.py.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

from onceflow.ledger import (
    EpochInFlight,
    EpochNotPlanned,
    EpochStatus,
    IllegalTransition,
    Ledger,
    OffsetGap,
    ParticipantsMissing,
    PrecommitRefused,
    StaleAttemptToken,
    UnexpectedParticipant,
)
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import Committable
from onceflow.testing import RecordingCommitter, coordinator_for_tests, key_of

TOPIC = "in"
PARTITIONS = (0, 1)
PAIRS = (("db", "t0"), ("db", "t1"), ("files", "t0"))
OPEN = {"PLANNED", "COMMITTING", "ABORTING"}


@dataclass
class ModelEpoch:
    number: int
    status: str
    expected: tuple[tuple[str, str], ...]
    ranges: dict[int, tuple[int, int]]
    token: str
    winners: dict[tuple[str, str], str] = field(default_factory=dict)


class LedgerMachine(RuleBasedStateMachine):
    ledger: Ledger  # set by run_machine

    def __init__(self) -> None:
        super().__init__()
        self.p = f"sm-{uuid.uuid4().hex[:12]}"
        self.sinks = {"db": RecordingCommitter(), "files": RecordingCommitter()}
        self.epochs: list[ModelEpoch] = []
        self.position: dict[int, int] = {}

    # ------------------------------------------------------------------------------------ helpers

    @property
    def last(self) -> ModelEpoch | None:
        return self.epochs[-1] if self.epochs else None

    @property
    def open(self) -> ModelEpoch | None:
        last = self.last
        return last if last is not None and last.status in OPEN else None

    def committable(self, e: ModelEpoch, sink: str, task: str, attempt: str) -> Committable:
        return Committable(self.p, e.number, 0, task, attempt, sink, handle={"path": f"/s/{task}/{attempt}"})

    def task_attempt(self, e: ModelEpoch, pair: tuple[str, str], attempt: str, token: str) -> None:
        """A slice of one Spark task: stage, register; a refused or losing attempt rolls back its own
        staging. Checks the model's verdict."""
        sink, task = pair
        c = self.committable(e, sink, task, attempt)
        committer = self.sinks[sink]
        if key_of(c) not in committer.visible:
            committer.stage(c)
        winner = e.winners.get(pair)
        refusal: type[Exception] | None = None
        if e.status in ("COMMITTING", "COMMITTED") and winner == attempt:
            pass
        elif e.status != "PLANNED":
            refusal = EpochNotPlanned
        elif token != e.token:
            refusal = StaleAttemptToken
        elif pair not in e.expected:
            refusal = UnexpectedParticipant
        loses = refusal is None and winner is not None and winner != attempt
        try:
            done = self.ledger.precommit_slice(self.p, e.number, token, [c])
        except PrecommitRefused as exc:
            assert refusal is not None and isinstance(exc, refusal), (exc, refusal)
            done = None
        else:
            assert refusal is None, f"pre-commit accepted, expected {refusal}"
            assert list(done.lost) == ([c] if loses else []), (done, loses)
        if done is None or loses:
            if key_of(c) not in committer.visible:
                committer.abort([c])
            return
        e.winners[pair] = attempt

    def ready(self, e: ModelEpoch) -> bool:
        return all(pair in e.winners for pair in e.expected)

    def apply_commit_outcome(self, e: ModelEpoch) -> None:
        e.status = "COMMITTED"
        for partition, (_, until) in e.ranges.items():
            self.position[partition] = until

    # -------------------------------------------------------------------------------------- rules

    @rule(
        advance=st.tuples(st.integers(0, 4), st.integers(0, 4)),
        expected=st.sets(st.sampled_from(PAIRS), min_size=1),
    )
    def plan(self, advance: tuple[int, int], expected: set[tuple[str, str]]) -> None:
        ranges = {
            p: (self.position.get(p, 0), self.position.get(p, 0) + a)
            for p, a in zip(PARTITIONS, advance, strict=True)
        }
        offsets = [OffsetRange(TOPIC, p, a, b) for p, (a, b) in ranges.items()]
        if self.open is not None:
            with pytest.raises(EpochInFlight):
                self.ledger.plan_epoch(self.p, offsets, sorted(expected))
            return
        e = self.ledger.plan_epoch(self.p, offsets, sorted(expected))
        assert e.number == len(self.epochs) + 1
        self.epochs.append(ModelEpoch(e.number, "PLANNED", e.expected, ranges, e.attempt_token))

    @precondition(lambda self: bool(self.position))
    @rule(skew=st.sampled_from([-1, 1, 3]))
    def plan_with_a_gap(self, skew: int) -> None:
        partition, position = next(iter(self.position.items()))
        if position + skew < 0:
            return
        bad = [OffsetRange(TOPIC, partition, position + skew, position + skew + 1)]
        with pytest.raises(EpochInFlight if self.open is not None else OffsetGap):
            self.ledger.plan_epoch(self.p, bad, [PAIRS[0]])

    @precondition(lambda self: self.last is not None)
    @rule(pair=st.sampled_from(PAIRS), attempt=st.sampled_from(["a0", "a1"]))
    def precommit(self, pair: tuple[str, str], attempt: str) -> None:
        e = self.last
        assert e is not None
        self.task_attempt(e, pair, attempt, e.token)

    @precondition(lambda self: self.last is not None and bool(self.last.winners))
    @rule(data=st.data())
    def duplicate_precommit(self, data: st.DataObject) -> None:
        e = self.last
        assert e is not None
        pair = data.draw(st.sampled_from(sorted(e.winners)))
        self.task_attempt(e, pair, e.winners[pair], e.token)

    @precondition(lambda self: self.last is not None)
    @rule(pair=st.sampled_from(PAIRS), which=st.integers(0, 10))
    def zombie_with_stale_token(self, pair: tuple[str, str], which: int) -> None:
        e = self.last
        assert e is not None
        stale = [m.token for m in self.epochs if m.token != e.token] or ["not-a-token"]
        self.task_attempt(e, pair, "zombie", stale[which % len(stale)])

    @precondition(lambda self: any(m.status == "ABORTED" for m in self.epochs))
    @rule(pair=st.sampled_from(PAIRS), which=st.integers(0, 10))
    def zombie_of_an_aborted_epoch(self, pair: tuple[str, str], which: int) -> None:
        aborted = [m for m in self.epochs if m.status == "ABORTED"]
        e = aborted[which % len(aborted)]
        self.task_attempt(e, pair, "zombie", e.token)

    @precondition(lambda self: self.last is not None)
    @rule()
    def zombie_unexpected_task(self) -> None:
        e = self.last
        assert e is not None
        self.task_attempt(e, ("db", "t9"), "a0", e.token)

    @precondition(lambda self: self.last is not None)
    @rule()
    def decide(self) -> None:
        e = self.last
        assert e is not None
        if e.status in ("ABORTING", "ABORTED"):
            with pytest.raises(IllegalTransition):
                self.ledger.record_commit_decision(self.p, e.number)
        elif e.status == "PLANNED" and not self.ready(e):
            with pytest.raises(ParticipantsMissing):
                self.ledger.record_commit_decision(self.p, e.number)
        else:
            self.ledger.record_commit_decision(self.p, e.number)
            if e.status == "PLANNED":
                e.status = "COMMITTING"

    @precondition(lambda self: self.last is not None)
    @rule(crash_after_first_sink=st.booleans())
    def commit(self, crash_after_first_sink: bool) -> None:
        e = self.last
        assert e is not None
        if e.status in ("ABORTING", "ABORTED"):
            with pytest.raises(IllegalTransition):
                coordinator_for_tests(self.ledger, self.p, self.sinks).commit(number=e.number)
        elif e.status == "PLANNED" and not self.ready(e):
            with pytest.raises(ParticipantsMissing):
                coordinator_for_tests(self.ledger, self.p, self.sinks).commit(number=e.number)
        elif crash_after_first_sink and e.status != "COMMITTED":
            # The coordinator dies after deciding and committing one sink's output, before marking it.
            self.ledger.record_commit_decision(self.p, e.number)
            e.status = "COMMITTING"
            first = sorted({s for s, _ in e.expected})[0]
            parts = [p.committable for p in self.ledger.participants(self.p, e.number) if p.sink == first]
            self.sinks[first].commit(parts)
        else:
            assert (
                coordinator_for_tests(self.ledger, self.p, self.sinks).commit(number=e.number).status
                is EpochStatus.COMMITTED
            )
            self.apply_commit_outcome(e)

    @precondition(lambda self: self.last is not None)
    @rule(crash_before_rollback=st.booleans())
    def abort(self, crash_before_rollback: bool) -> None:
        e = self.last
        assert e is not None
        if e.status in ("COMMITTING", "COMMITTED"):
            with pytest.raises(IllegalTransition):
                coordinator_for_tests(self.ledger, self.p, self.sinks).abort(
                    number=e.number, reason="random abort"
                )
            with pytest.raises(IllegalTransition):
                self.ledger.record_abort_decision(self.p, e.number, "random abort")
        elif crash_before_rollback and e.status != "ABORTED":
            self.ledger.record_abort_decision(self.p, e.number, "crash follows")
            e.status = "ABORTING"
        else:
            assert (
                coordinator_for_tests(self.ledger, self.p, self.sinks)
                .abort(number=e.number, reason="random")
                .status
                is EpochStatus.ABORTED
            )
            e.status = "ABORTED"

    @rule(epoch_offset=st.integers(0, 3), pair=st.sampled_from(PAIRS))
    def stray_staging(self, epoch_offset: int, pair: tuple[str, str]) -> None:
        """Output staged by a task that crashed before reporting, for a known or an unknown epoch."""
        number = max(len(self.epochs) - 1, 0) + epoch_offset + 1
        c = Committable(self.p, number, 0, pair[1], f"stray{epoch_offset}", pair[0])
        self.sinks[pair[0]].stage(c)

    @rule()
    def recover(self) -> None:
        e = self.open
        report = coordinator_for_tests(self.ledger, self.p, self.sinks).recover()
        if e is None:
            assert report.epoch is None
        elif e.status == "COMMITTING":
            assert (report.epoch, report.outcome) == (e.number, "committed")
            self.apply_commit_outcome(e)
        else:
            assert (report.epoch, report.outcome) == (e.number, "aborted")
            e.status = "ABORTED"
        # Invariant 9: every epoch is final now, so nothing staged may remain in any sink.
        assert all(not s.orphans(self.p) for s in self.sinks.values())

    # --------------------------------------------------------------------------------- invariants

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        with self.ledger.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql), {"p": self.p}).all()]

    @invariant()
    def invariants_hold_in_the_tables(self) -> None:
        epochs = {
            int(n): (str(status), json.loads(str(exp)), decided)
            for n, status, exp, decided in self.rows(
                "SELECT epoch, status, expected_participants, decided_at FROM epochs WHERE pipeline = :p"
            )
        }
        parts: dict[int, dict[tuple[str, str], tuple[str, str, str]]] = {}
        for n, sink, task, attempt, status, token in self.rows(
            "SELECT epoch, sink, task, attempt, status, attempt_token FROM participants WHERE pipeline = :p"
        ):
            parts.setdefault(int(n), {})[(str(sink), str(task))] = (str(attempt), str(status), str(token))
        offsets = {
            (int(n), int(part)): (int(a), int(b))
            for n, part, a, b in self.rows(
                "SELECT epoch, partition, from_offset, until_offset FROM epoch_offsets WHERE pipeline = :p"
            )
        }
        visible = {k for s in self.sinks.values() for k in s.visible if k[0] == self.p}

        # The tables agree with the model, epoch by epoch, and numbers are 1..n.
        assert sorted(epochs) == [m.number for m in self.epochs]
        for m in self.epochs:
            assert epochs[m.number][0] == m.status, (m.number, epochs[m.number][0], m.status)
            winners = {pair: attempt for pair, (attempt, _, _) in parts.get(m.number, {}).items()}
            assert winners == m.winners
        # 1. at most one epoch is not final
        assert sum(status in OPEN for status, _, _ in epochs.values()) <= 1
        # 2. each committed epoch starts where the previous committed one ended
        position: dict[int, int] = {}
        for n in sorted(epochs):
            if epochs[n][0] != "COMMITTED":
                continue
            for part in PARTITIONS:
                a, b = offsets[(n, part)]
                assert a == position.get(part, 0), (n, part, a, position)
                position[part] = b
        # 7. ... and that is the position the ledger reports and the model expects
        assert self.ledger.committed_offsets(self.p) == {(TOPIC, p): o for p, o in position.items()}
        assert position == self.position
        for n, (status, expected, decided) in epochs.items():
            mine = parts.get(n, {})
            token_of_epoch = next(m.token for m in self.epochs if m.number == n)
            for pair, (_, _, token) in mine.items():
                # 3. only expected tasks with the token of this epoch were accepted
                assert list(pair) in expected and token == token_of_epoch
            statuses = {pstatus for _, pstatus, _ in mine.values()}
            if status in ("COMMITTING", "COMMITTED"):
                # 4. decided only with every expected participant pre-committed
                assert decided is not None and len(mine) == len(expected)
                # 5. a decided epoch never loses a participant to an abort
                assert "ABORTED" not in statuses
            if status == "COMMITTED":
                assert statuses <= {"COMMITTED"}
                for pair, (attempt, _, _) in mine.items():
                    assert (self.p, n, pair[0], pair[1], attempt) in visible
            if status in ("PLANNED", "ABORTING", "ABORTED"):
                # 6. nothing of an undecided or aborted epoch is visible downstream
                assert "COMMITTED" not in statuses and not any(k[1] == n for k in visible)
            if status == "ABORTED":
                assert statuses <= {"ABORTED"}
        # Visible output is exactly some winners of decided epochs, never a loser or a zombie.
        for _, n, sink, task, attempt in visible:
            assert epochs[n][0] in ("COMMITTING", "COMMITTED")
            assert parts[n][(sink, task)][0] == attempt


def run_machine(ledger: Ledger, max_examples: int) -> None:
    machine = type("BoundLedgerMachine", (LedgerMachine,), {"ledger": ledger})
    run_state_machine_as_test(
        machine,  # type: ignore[arg-type]
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_random_interleavings_keep_every_invariant_on_sqlite(tmp_path: Path) -> None:
    ledger = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    ledger.upgrade()
    run_machine(ledger, max_examples=40)
