"""Ledger retention on SQLite: it deletes old history, and never a row a protocol step still reads.

Each check is a plain function of a fresh ledger so that tests/integration/test_ledger_retention_postgres.py
runs the same checks on PostgreSQL. A check fails if retention deleted what the next plan (positions),
recover or a manual commit/abort (the epoch in flight), a re-run replacing an interval, or an operator
reading young dead letters would need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from onceflow.cli import main as cli
from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.ledger import DeadLetter, EpochStatus, Ledger, OffsetGap
from onceflow.ledger.records import Epoch
from onceflow.ledger.retention import RetentionPolicy
from onceflow.offsets import OffsetRange
from onceflow.protocol.retaining import retention_interval
from onceflow.sinks.base import Committable
from onceflow.testing import RecordingCommitter, coordinator_for_tests

P = "clicks"
TASKS = [("db", "t0"), ("db", "t1")]
WEEK = timedelta(days=7)


def policy(keep: int, *, batch: int = 20, dead_letter_age: timedelta = WEEK) -> RetentionPolicy:
    return RetentionPolicy(
        keep_epochs=keep, dead_letter_age=dead_letter_age, batch_epochs=batch, batch_rows=batch
    )


class History:
    """Drives epochs of one pipeline through the ledger as the coordinator does, tracking positions."""

    def __init__(self, ledger: Ledger, pipeline: str = P) -> None:
        self.ledger = ledger
        self.pipeline = pipeline
        self.committer = RecordingCommitter(require_staged=False)
        self.coordinator = coordinator_for_tests(ledger, pipeline, {"db": self.committer})

    def ranges(self, partitions: Sequence[tuple[str, int]], span: int) -> list[OffsetRange]:
        at = self.ledger.committed_offsets(self.pipeline)
        return [OffsetRange(t, p, at.get((t, p), 0), at.get((t, p), 0) + span) for t, p in partitions]

    def plan(
        self,
        partitions: Sequence[tuple[str, int]] = (("in", 0), ("in", 1)),
        *,
        span: int = 10,
        interval: tuple[datetime, datetime] | None = None,
        replaces: int | None = None,
        ranges: Sequence[OffsetRange] | None = None,
    ) -> Epoch:
        chosen = list(ranges) if ranges is not None else self.ranges(partitions, span)
        return self.ledger.plan_epoch(self.pipeline, chosen, TASKS, data_interval=interval, replaces=replaces)

    def precommit(self, epoch: Epoch, letters: Sequence[DeadLetter] = ()) -> None:
        committables = [
            Committable(self.pipeline, epoch.number, 0, task, "a0", sink, record_count=10)
            for sink, task in TASKS
        ]
        self.ledger.precommit_slice(self.pipeline, epoch.number, epoch.attempt_token, committables, letters)

    def commit(self, epoch: Epoch) -> Epoch:
        done = self.coordinator.commit(number=epoch.number)
        assert done is not None and done.status is EpochStatus.COMMITTED
        return done

    def run(self, count: int = 1, **plan: object) -> list[Epoch]:
        done = []
        for _ in range(count):
            epoch = self.plan(**plan)  # type: ignore[arg-type]
            self.precommit(epoch)
            done.append(self.commit(epoch))
        return done

    def aborted(self) -> Epoch:
        epoch = self.plan()
        self.precommit(epoch)
        done = self.coordinator.abort(number=epoch.number, reason="test")
        assert done is not None and done.status is EpochStatus.ABORTED
        return done

    def numbers(self) -> list[int]:
        return [e.number for e in self.ledger.epochs(self.pipeline)]


def letter(offset: int) -> DeadLetter:
    return DeadLetter("in", 0, offset, None, b"not json", "bad JSON")


# ------------------------------------------------------------------------------------------ checks


def check_keeps_the_last_committed_epochs_and_deletes_older_ones_whole(ledger: Ledger) -> None:
    h = History(ledger)
    h.run(3)
    h.aborted()  # epoch 4: older than the kept ones once more commit
    h.run(4)  # 5..8
    other = History(ledger, "other")
    other.run(3)
    before_other = ledger.row_counts("other")
    positions = ledger.committed_offsets(P)

    result = ledger.retain(P, policy(3))

    assert h.numbers() == [6, 7, 8]
    assert result.oldest_kept == 6
    assert result.deleted == {
        "epochs": 5,
        "epoch_offsets": 10,
        "participants": 10,
        "dead_letters": 0,
    }
    assert ledger.row_counts(P) == {
        "epochs": 3,
        "epoch_offsets": 6,
        "participants": 6,
        "dead_letters": 0,
    }
    assert ledger.committed_offsets(P) == positions
    assert ledger.row_counts("other") == before_other  # another pipeline's history is not touched
    assert h.run(1)[0].number == 9  # numbering continues after the deleted epochs
    assert ledger.retain(P, policy(3)).deleted["epochs"] == 1  # the next run deletes one more


def check_never_deletes_the_epoch_in_flight(ledger: Ledger) -> None:
    h = History(ledger)
    h.run(5)
    in_flight = h.plan()
    h.precommit(in_flight, [letter(3)])
    ledger.record_commit_decision(P, in_flight.number)  # COMMITTING: recover must be able to finish it

    result = ledger.retain(P, policy(1), now=datetime.now(UTC) + 30 * WEEK)

    assert h.numbers() == [5, 6]
    assert result.deleted["dead_letters"] == 0  # the epoch in flight's, however old
    assert len(ledger.participants(P, in_flight.number)) == len(TASKS)
    report = h.coordinator.recover()
    assert report.outcome == "committed"
    assert [d.letter.offset for d in ledger.dead_letters(P, epoch=in_flight.number)] == [3]


def check_an_undecided_epoch_can_still_be_aborted_by_hand(ledger: Ledger) -> None:
    h = History(ledger)
    h.run(4)
    in_flight = h.plan()
    h.precommit(in_flight)
    ledger.retain(P, policy(1))
    done = h.coordinator.abort(number=in_flight.number, reason="by hand")
    assert done is not None and done.status is EpochStatus.ABORTED
    assert h.committer.calls[-1][0] == "abort"
    # Its range is replayed from where the last committed epoch ended (kept: it holds the position).
    assert h.plan().ranges == in_flight.ranges


def check_keeps_the_epoch_holding_a_partition_position(ledger: Ledger) -> None:
    h = History(ledger)
    h.run(1, partitions=[("gone", 0), ("in", 0)])  # epoch 1: the only one that read topic "gone"
    h.run(6, partitions=[("in", 0)])
    positions = ledger.committed_offsets(P)
    assert positions[("gone", 0)] == 10

    result = ledger.retain(P, policy(2))

    assert h.numbers() == [1, 6, 7]
    assert result.held_back == 1
    assert ledger.committed_offsets(P) == positions
    # The source reads "gone" again: the plan must continue at 10, not start it afresh.
    with pytest.raises(OffsetGap):
        h.plan(ranges=[OffsetRange("gone", 0, 0, 5)])
    assert h.run(1, partitions=[("gone", 0), ("in", 0)])[0].ranges[0] == OffsetRange("gone", 0, 10, 20)
    ledger.retain(P, policy(2))
    assert h.numbers() == [7, 8]  # once a newer epoch holds the position, epoch 1 goes


def check_keeps_the_epochs_a_replacement_in_flight_replaces(ledger: Ledger) -> None:
    day = datetime(2026, 1, 1, tzinfo=UTC)
    interval = (day, day + timedelta(days=1))
    h = History(ledger)
    first = h.run(1, interval=interval)[0]
    h.run(4)
    rerun = h.plan(interval=interval, replaces=first.number, ranges=first.ranges)

    ledger.retain(P, policy(1))

    # The files sink asks for the interval's earlier committed epochs when it writes the replacement.
    same = [e.number for e in ledger.find_by_interval(P, *interval)]
    assert same == [first.number, rerun.number]
    h.precommit(rerun)
    h.commit(rerun)
    assert ledger.committed_offsets(P)[("in", 0)] == 50  # a replacement never moves a position back


def check_dead_letters_age_out_and_keep_young_ones_epochs(ledger: Ledger) -> None:
    h = History(ledger)
    with_letters = h.plan()
    h.precommit(with_letters, [letter(1), letter(2)])
    h.commit(with_letters)
    h.run(4)

    kept = ledger.retain(P, policy(1))  # the letters are young: epoch 1 stays for them
    assert kept.deleted["dead_letters"] == 0
    assert h.numbers() == [1, 5]
    assert len(ledger.dead_letters(P, epoch=1)) == 2

    later = datetime.now(UTC) + WEEK + timedelta(hours=1)
    aged = ledger.retain(P, policy(1), now=later)
    assert aged.deleted["dead_letters"] == 2
    assert h.numbers() == [5]


def check_old_dead_letters_go_from_epochs_that_are_kept(ledger: Ledger) -> None:
    h = History(ledger)
    epoch = h.plan()
    h.precommit(epoch, [letter(7)])
    h.commit(epoch)
    result = ledger.retain(P, policy(10, dead_letter_age=timedelta(0)))
    assert result.deleted == {**result.deleted, "dead_letters": 1, "epochs": 0}
    assert ledger.dead_letters(P) == []
    assert h.numbers() == [1]


def check_deletes_in_bounded_batches(ledger: Ledger) -> None:
    h = History(ledger)
    h.run(8)
    result = ledger.retain(P, policy(1, batch=2))
    assert result.deleted["epochs"] == 7
    assert result.batches == 4  # 2 + 2 + 2 + 1 epochs, one transaction each
    assert h.numbers() == [8]


def check_fewer_committed_epochs_than_kept_deletes_nothing(ledger: Ledger) -> None:
    h = History(ledger)
    h.run(2)
    h.aborted()
    before = ledger.row_counts(P)
    result = ledger.retain(P, policy(3))
    assert result.total == 0 and result.oldest_kept is None
    assert ledger.row_counts(P) == before
    assert ledger.retain("no-such-pipeline", policy(1)).total == 0


CHECKS: list[Callable[[Ledger], None]] = [
    check_keeps_the_last_committed_epochs_and_deletes_older_ones_whole,
    check_never_deletes_the_epoch_in_flight,
    check_an_undecided_epoch_can_still_be_aborted_by_hand,
    check_keeps_the_epoch_holding_a_partition_position,
    check_keeps_the_epochs_a_replacement_in_flight_replaces,
    check_dead_letters_age_out_and_keep_young_ones_epochs,
    check_old_dead_letters_go_from_epochs_that_are_kept,
    check_deletes_in_bounded_batches,
    check_fewer_committed_epochs_than_kept_deletes_nothing,
]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    led.upgrade()
    return led


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_retention_on_sqlite(ledger: Ledger, check: Callable[[Ledger], None]) -> None:
    check(ledger)


# ---------------------------------------------------------------------------- coordinator and CLI


def settings(tmp_path: Path, ledger: Ledger, **values: object) -> Settings:
    env = {"ONCEFLOW_HOME": str(tmp_path), "ONCEFLOW_LEDGER_URL": ledger.url}
    env.update({k: str(v) for k, v in values.items()})
    return Settings.from_env(env)


def test_every_commit_applies_the_configured_retention(ledger: Ledger, tmp_path: Path) -> None:
    h = History(ledger)
    lines: list[str] = []
    h.coordinator = coordinator_for_tests(
        ledger,
        P,
        {"db": h.committer},
        settings=settings(tmp_path, ledger, ONCEFLOW_RETAIN_EPOCHS=3),
        log=lines.append,
    )
    h.run(6)
    assert h.numbers() == [4, 5, 6]  # with 3 kept, every commit retains
    assert any("retention deleted 1 epochs, 2 epoch_offsets, 2 participants" in line for line in lines)


def test_commits_retain_every_tenth_of_the_kept_epochs(ledger: Ledger, tmp_path: Path) -> None:
    assert retention_interval(1000) == 100
    h = History(ledger)
    h.coordinator = coordinator_for_tests(
        ledger, P, {"db": h.committer}, settings=settings(tmp_path, ledger, ONCEFLOW_RETAIN_EPOCHS=20)
    )
    assert retention_interval(20) == 2
    h.run(21)
    assert h.numbers() == list(range(1, 22))  # 21 epochs: epoch 21's commit did not retain
    h.run(1)
    assert h.numbers() == list(range(3, 23))  # epoch 22's did


def test_retention_off_keeps_everything(ledger: Ledger, tmp_path: Path) -> None:
    h = History(ledger)
    h.coordinator = coordinator_for_tests(
        ledger, P, {"db": h.committer}, settings=settings(tmp_path, ledger, ONCEFLOW_RETAIN_EPOCHS=0)
    )
    h.run(4)
    assert h.coordinator.retain().total == 0
    assert h.numbers() == [1, 2, 3, 4]


def test_settings_name_the_variable_of_a_bad_value(tmp_path: Path, ledger: Ledger) -> None:
    with pytest.raises(ConfigError, match="ONCEFLOW_RETAIN_EPOCHS='-1'"):
        settings(tmp_path, ledger, ONCEFLOW_RETAIN_EPOCHS=-1)
    with pytest.raises(ConfigError, match="ONCEFLOW_DEAD_LETTER_DAYS='a week'"):
        settings(tmp_path, ledger, ONCEFLOW_DEAD_LETTER_DAYS="a week")
    defaults = settings(tmp_path, ledger)
    assert (defaults.retain_epochs, defaults.dead_letter_days) == (1000, 7.0)
    assert Settings.from_env(defaults.as_env()) == defaults


def test_cli_retain_prints_one_line_per_kind(
    ledger: Ledger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ONCEFLOW_PIPELINES", raising=False)
    History(ledger).run(5)
    code = cli.main(["--ledger-url", ledger.url, "retain", P, "--keep-epochs", "2"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[:4] == [
        "epochs: 3 rows deleted",
        "epoch_offsets: 6 rows deleted",
        "participants: 6 rows deleted",
        "dead_letters: 0 rows deleted",
    ]
    assert cli.main(["--ledger-url", ledger.url, "retain", P, "--keep-epochs", "0"]) == 1
    assert "--keep-epochs 0: keep at least the last committed epoch" in capsys.readouterr().err


def test_a_cleared_process_task_of_a_deleted_epoch_has_nothing_to_do(ledger: Ledger) -> None:
    from onceflow.protocol.step_results import PlanResult

    h = History(ledger)
    first = h.run(3)[0]
    ledger.retain(P, policy(1))
    planned = PlanResult("planned", P, first.number, first.attempt_token, slices_with_tasks=(0,))
    gate = h.coordinator.slice_to_process(planned, 0)
    assert gate.verdict == "skip" and gate.epoch is None and "removed by ledger retention" in gate.line


def test_a_failing_retention_never_fails_the_commit(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("ledger busy")

    lines: list[str] = []
    h = History(ledger)
    h.coordinator = coordinator_for_tests(
        ledger,
        P,
        {"db": h.committer},
        settings=settings(tmp_path, ledger, ONCEFLOW_RETAIN_EPOCHS=1),
        log=lines.append,
    )
    monkeypatch.setattr(ledger, "retain", broken)
    assert h.run(2)[-1].status is EpochStatus.COMMITTED
    assert any("retention skipped (ledger busy)" in line for line in lines)
