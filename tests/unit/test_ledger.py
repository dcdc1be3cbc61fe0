"""The ledger's state machine on an SQLite file: one test group per invariant of docs/architecture.md."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy

from onceflow.errors import ConfigError
from onceflow.ledger import (
    DeadLetter,
    EpochInFlight,
    EpochNotPlanned,
    EpochStatus,
    IllegalTransition,
    InvalidPlan,
    Ledger,
    MissingCommitter,
    OffsetGap,
    ParticipantsMissing,
    ParticipantStatus,
    Registration,
    SchemaMismatch,
    SinkCallFailed,
    StaleAttemptToken,
    UnexpectedParticipant,
    UnknownEpoch,
)
from onceflow.ledger.records import Epoch
from onceflow.ledger.schema import normalize_url
from onceflow.offsets import OffsetRange
from onceflow.protocol.decisions import classify_orphan
from onceflow.sinks.base import Committable
from onceflow.testing import RecordingCommitter, coordinator_for_tests, key_of

P = "orders"
EXPECTED = [("db", "t0"), ("db", "t1"), ("files", "t0")]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    led.upgrade()
    return led


@pytest.fixture
def sinks() -> dict[str, RecordingCommitter]:
    return {"db": RecordingCommitter(), "files": RecordingCommitter()}


def ranges(a: int, b: int, c: int = 0, d: int = 0) -> list[OffsetRange]:
    return [OffsetRange("in", 0, a, b), OffsetRange("in", 1, c, d)]


def stage(
    ledger: Ledger,
    sinks: dict[str, RecordingCommitter],
    epoch: Epoch,
    sink: str,
    task: str,
    attempt: str = "a0",
    token: str | None = None,
) -> Registration:
    """What a slice does: a task stages through the writer, then the driver registers its committable."""
    c = Committable(P, epoch.number, 0, task, attempt, sink, handle={"path": f"/stage/{task}/{attempt}"})
    sinks[sink].stage(c)
    return ledger.precommit_slice(P, epoch.number, epoch.attempt_token if token is None else token, [c])


def precommit_all(ledger: Ledger, sinks: dict[str, RecordingCommitter], epoch: Epoch) -> None:
    for sink, task in epoch.expected:
        stage(ledger, sinks, epoch, sink, task)


def visible(sinks: dict[str, RecordingCommitter]) -> set[tuple[str, int, str, str, str]]:
    return {k for s in sinks.values() for k in s.visible}


# ---------------------------------------------------------------------------------------- schema


def test_empty_database_is_refused_with_the_command_to_run(tmp_path: Path) -> None:
    with pytest.raises(SchemaMismatch, match="not initialised, run `onceflow db upgrade`"):
        Ledger.connect(f"sqlite:///{tmp_path / 'empty.db'}")


def test_database_of_a_newer_schema_is_refused(ledger: Ledger, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "ledger.db") as raw:
        raw.execute("UPDATE alembic_version SET version_num = 'zz_from_the_future'")
    with pytest.raises(SchemaMismatch, match="newer onceflow") as err:
        Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert "onceflow db upgrade" in str(err.value)


_NEXT_REVISION = """
revision = "9999_next"
down_revision = "{head}"
branch_labels = None
depends_on = None

import sqlalchemy as sa
from alembic import op


def upgrade() -> None:
    op.add_column("pipelines", sa.Column("owner", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("pipelines", "owner")
"""


def test_database_of_an_older_schema_is_refused_until_upgraded(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger left at today's head by an earlier onceflow, opened by one whose head is a later revision."""
    from onceflow.ledger import schema

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger.plan_epoch(P, ranges(0, 10), EXPECTED)
    newer = tmp_path / "migrations"
    shutil.copytree(schema.MIGRATIONS, newer, ignore=shutil.ignore_patterns("__pycache__"))
    head = schema.head_revision()
    (newer / "versions" / "9999_next.py").write_text(_NEXT_REVISION.replace("{head}", head))
    monkeypatch.setattr(schema, "MIGRATIONS", newer)

    older = f"'{head}', older than '9999_next': run `onceflow db upgrade`"
    with pytest.raises(SchemaMismatch, match=older):
        Ledger.connect(url)
    Ledger.connect(url, check=False).upgrade()
    upgraded = Ledger.connect(url)
    assert [e.status for e in upgraded.epochs(P)] == [EpochStatus.PLANNED]  # the data came along
    with sqlite3.connect(tmp_path / "ledger.db") as raw:
        assert "owner" in [row[1] for row in raw.execute("PRAGMA table_info(pipelines)")]


def test_upgrade_is_idempotent_and_connect_then_succeeds(ledger: Ledger, tmp_path: Path) -> None:
    ledger.upgrade()
    again = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert again.epochs(P) == []


def _migrate(url: str, revision: str, *, down: bool = False) -> None:
    from alembic import command

    from onceflow.ledger import schema

    with Ledger.connect(url, check=False) as ledger, ledger.engine.begin() as conn:
        (command.downgrade if down else command.upgrade)(schema._alembic_config(conn), revision)


def _tables(ledger: Ledger) -> set[str]:
    return set(sqlalchemy.inspect(ledger.engine).get_table_names())


def check_a_ledger_with_state_snapshot_rows_upgrades_and_downgrades(url: str) -> None:
    """A ledger of 0002's schema, with a row in the state-snapshot table that keyed state no longer
    uses: the upgrade drops the table and keeps every epoch; the downgrade recreates it, empty."""
    _migrate(url, "0002_epoch_owner")
    with Ledger.connect(url, check=False) as old:
        e = old.plan_epoch(P, ranges(0, 5), [])
        with old.engine.begin() as conn:
            conn.execute(
                sqlalchemy.text(
                    "INSERT INTO state_snapshots (pipeline, epoch, location, status, created_at, updated_at)"
                    " VALUES (:p, :n, '/state/1', 'STAGED', :t, :t)"
                ),
                {"p": P, "n": e.number, "t": e.planned_at},
            )
    with pytest.raises(SchemaMismatch, match="'0002_epoch_owner', older than"):
        Ledger.connect(url)
    with Ledger.connect(url, check=False) as opened:
        opened.upgrade()
    with Ledger.connect(url) as upgraded:
        assert "state_snapshots" not in _tables(upgraded)
        assert [(x.number, x.status) for x in upgraded.epochs(P)] == [(1, EpochStatus.PLANNED)]
        assert coordinator_for_tests(upgraded, P, {}).commit(number=1).status is EpochStatus.COMMITTED
    _migrate(url, "0002_epoch_owner", down=True)
    with Ledger.connect(url, check=False) as downgraded:
        assert "state_snapshots" in _tables(downgraded)
        with downgraded.engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT count(*) FROM state_snapshots")).scalar() == 0
        downgraded.upgrade()
    with Ledger.connect(url) as again:
        assert again.committed_offsets(P) == {("in", 0): 5, ("in", 1): 0}


def test_a_ledger_with_state_snapshot_rows_upgrades_and_downgrades(tmp_path: Path) -> None:
    check_a_ledger_with_state_snapshot_rows_upgrades_and_downgrades(f"sqlite:///{tmp_path / 'old.db'}")


def test_sqlite_ledger_runs_in_wal_mode(ledger: Ledger, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "ledger.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_plain_postgresql_urls_map_to_psycopg() -> None:
    assert normalize_url("postgresql://u:p@h:1/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u:p@h:1/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    with pytest.raises(ConfigError, match="sqlite or postgresql"):
        normalize_url("mysql://u@h/db")


# ------------------------------------------------------------------------------------ invariant 1


@pytest.mark.parametrize("reach", ["PLANNED", "COMMITTING", "ABORTING"])
def test_no_second_epoch_while_one_is_not_final(
    ledger: Ledger, sinks: dict[str, RecordingCommitter], reach: str
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    if reach == "COMMITTING":
        precommit_all(ledger, sinks, e)
        ledger.record_commit_decision(P, e.number)
    elif reach == "ABORTING":
        ledger.record_abort_decision(P, e.number, "test")
    with pytest.raises(EpochInFlight, match=f"epoch 1 is still {reach}"):
        ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    assert [x.number for x in ledger.epochs(P)] == [1]


def test_database_itself_refuses_a_second_open_epoch(ledger: Ledger, tmp_path: Path) -> None:
    ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    with sqlite3.connect(tmp_path / "ledger.db") as raw, pytest.raises(sqlite3.IntegrityError):
        raw.execute(
            "INSERT INTO epochs (pipeline, epoch, status, attempt_token, expected_participants, planned_at)"
            " VALUES (?, 2, 'PLANNED', 'x', '[]', '2024-01-01')",
            (P,),
        )


def test_epoch_numbers_increase_by_one_per_pipeline(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    for n in (1, 2, 3):
        e = ledger.plan_epoch(P, ranges(n - 1, n), [])
        assert e.number == n
        coordinator_for_tests(ledger, P, sinks).commit(number=n)
    assert ledger.plan_epoch("other", [], []).number == 1


# ------------------------------------------------------------------------------------ invariant 2


def test_next_epoch_starts_where_the_last_committed_one_ended(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e1 = ledger.plan_epoch(P, ranges(10, 20, 0, 3), EXPECTED)
    precommit_all(ledger, sinks, e1)
    coordinator_for_tests(ledger, P, sinks).commit(number=1)
    assert ledger.committed_offsets(P) == {("in", 0): 20, ("in", 1): 3}
    with pytest.raises(OffsetGap, match=r"in\[0\]@\[21,30\) must start at offset 20"):
        ledger.plan_epoch(P, ranges(21, 30, 3, 4), EXPECTED)
    with pytest.raises(OffsetGap, match="must start at offset 3"):
        ledger.plan_epoch(P, ranges(20, 30, 0, 4), EXPECTED)
    # A partition never seen before starts wherever the plan says.
    e2 = ledger.plan_epoch(P, [*ranges(20, 30, 3, 4), OffsetRange("in", 7, 500, 510)], EXPECTED)
    assert e2.number == 2


def test_a_committed_interval_can_be_replanned_over_exactly_its_ranges_without_moving_positions(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    from datetime import UTC, datetime

    from onceflow.ledger.errors import InvalidPlan

    interval = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC))
    ledger.plan_epoch(P, ranges(0, 10), EXPECTED, data_interval=interval)
    coordinator_for_tests(ledger, P, sinks).abort(number=1, reason="task failed")
    with pytest.raises(InvalidPlan, match="only a committed epoch's output can be replaced"):
        ledger.plan_epoch(P, ranges(0, 10), EXPECTED, data_interval=interval, replaces=1)
    e2 = ledger.plan_epoch(P, ranges(0, 10), EXPECTED, data_interval=interval)
    precommit_all(ledger, sinks, e2)
    coordinator_for_tests(ledger, P, sinks).commit(number=e2.number)
    e3 = ledger.plan_epoch(P, ranges(10, 20), EXPECTED)
    precommit_all(ledger, sinks, e3)
    coordinator_for_tests(ledger, P, sinks).commit(number=e3.number)
    with pytest.raises(InvalidPlan, match="must read exactly its ranges"):
        ledger.plan_epoch(P, ranges(0, 11), EXPECTED, data_interval=interval, replaces=e2.number)
    with pytest.raises(InvalidPlan, match="covers data interval"):
        ledger.plan_epoch(P, ranges(0, 10), EXPECTED, replaces=e2.number)
    e4 = ledger.plan_epoch(P, ranges(0, 10), EXPECTED, data_interval=interval, replaces=e2.number)
    precommit_all(ledger, sinks, e4)
    coordinator_for_tests(ledger, P, sinks).commit(number=e4.number)
    assert ledger.committed_offsets(P)[("in", 0)] == 20  # the re-run interval did not move it back


def test_an_aborted_range_is_replayed(ledger: Ledger, sinks: dict[str, RecordingCommitter]) -> None:
    e1 = ledger.plan_epoch(P, ranges(0, 10), EXPECTED)
    stage(ledger, sinks, e1, "db", "t0")
    coordinator_for_tests(ledger, P, sinks).abort(number=1, reason="task failed")
    assert ledger.committed_offsets(P) == {}
    ledger.plan_epoch(P, ranges(0, 10), EXPECTED)  # nothing was committed: any start is fine
    coordinator_for_tests(ledger, P, sinks).abort(number=2, reason="again")
    e3 = ledger.plan_epoch(P, ranges(0, 12), EXPECTED)
    precommit_all(ledger, sinks, e3)
    coordinator_for_tests(ledger, P, sinks).commit(number=3)
    with pytest.raises(OffsetGap):
        ledger.plan_epoch(P, ranges(10, 12), EXPECTED)
    assert ledger.plan_epoch(P, ranges(12, 15), EXPECTED).ranges[0] == OffsetRange("in", 0, 12, 15)


def test_malformed_plans_are_refused(ledger: Ledger) -> None:
    with pytest.raises(InvalidPlan, match=r"in\[0\] planned twice"):
        ledger.plan_epoch(P, [OffsetRange("in", 0, 0, 1), OffsetRange("in", 0, 1, 2)], EXPECTED)
    with pytest.raises(InvalidPlan, match="listed twice"):
        ledger.plan_epoch(P, [], [("db", "t0"), ("db", "t0")])
    with pytest.raises(InvalidPlan, match="timezone-aware"):
        ledger.plan_epoch(P, [], [], data_interval=(datetime(2024, 1, 2), datetime(2024, 1, 3)))
    assert ledger.epochs(P) == []


# ------------------------------------------------------------------------------------ invariant 3


def test_precommit_of_an_expected_task_with_the_current_token_is_recorded(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    c = Committable(P, 1, 2, "t1", "a7", "db", handle={"gid": "g1"}, record_count=42, checksum="abc")
    (p,) = ledger.precommit_slice(P, 1, e.attempt_token, [c]).accepted
    assert (p.status, p.attempt, p.slice, p.record_count, p.staged_location) == (
        ParticipantStatus.PRECOMMITTED,
        "a7",
        2,
        42,
        "g1",
    )
    assert ledger.participants(P, 1)[0].committable == c


def test_first_attempt_wins_same_attempt_is_a_no_op_other_attempt_is_refused(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    stage(ledger, sinks, e, "db", "t0", attempt="first")
    again = stage(ledger, sinks, e, "db", "t0", attempt="first")
    assert ([p.attempt for p in again.accepted], again.lost) == (["first"], ())
    speculative = stage(ledger, sinks, e, "db", "t0", attempt="speculative")
    assert speculative.accepted == () and [c.attempt for c in speculative.lost] == ["speculative"]
    assert [(p.task, p.attempt) for p in ledger.participants(P, 1)] == [("t0", "first")]


def test_zombies_are_refused(ledger: Ledger, sinks: dict[str, RecordingCommitter]) -> None:
    e1 = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    coordinator_for_tests(ledger, P, sinks).abort(number=1, reason="retry")
    with pytest.raises(EpochNotPlanned, match="epoch 1 of pipeline 'orders' is ABORTED"):
        stage(ledger, sinks, e1, "db", "t0")
    e2 = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    with pytest.raises(StaleAttemptToken, match="attempt token is not the current one"):
        stage(ledger, sinks, e2, "db", "t0", token=e1.attempt_token)
    with pytest.raises(UnexpectedParticipant, match="'db', 't9'"):
        stage(ledger, sinks, e2, "db", "t9")
    assert e2.attempt_token != e1.attempt_token  # a new plan is what fences the old attempt off
    stage(ledger, sinks, e2, "db", "t0")
    with pytest.raises(UnknownEpoch):
        stage(ledger, sinks, Epoch(P, 99, EpochStatus.PLANNED, "x", (), (), e1.planned_at), "db", "t0")
    assert [(p.epoch, p.task) for p in ledger.participants(P, 2)] == [(2, "t0")]
    assert ledger.participants(P, 1) == []


def test_precommit_after_the_decision_is_refused(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e)
    ledger.record_commit_decision(P, 1)
    with pytest.raises(EpochNotPlanned, match="COMMITTING"):
        stage(ledger, sinks, e, "db", "t0", attempt="late")


# ------------------------------------------------------------------------------------ invariant 4


def test_decision_waits_for_every_expected_participant(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    stage(ledger, sinks, e, "db", "t0")
    with pytest.raises(ParticipantsMissing, match=r"2 of 3 expected participants .*db/t1, files/t0"):
        ledger.record_commit_decision(P, 1)
    with pytest.raises(ParticipantsMissing):
        coordinator_for_tests(ledger, P, sinks).commit(number=1)
    assert ledger.epoch(P, 1).status is EpochStatus.PLANNED
    assert visible(sinks) == set()
    stage(ledger, sinks, e, "db", "t1")
    stage(ledger, sinks, e, "files", "t0")
    decided = ledger.record_commit_decision(P, 1)
    assert decided.status is EpochStatus.COMMITTING and decided.decided_at is not None
    assert ledger.record_commit_decision(P, 1).status is EpochStatus.COMMITTING


# ------------------------------------------------------------------------------------ invariant 5


def test_once_committing_abort_is_refused_and_commit_is_retried_until_it_succeeds(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e)
    sinks["files"].fail_commits = 2
    with pytest.raises(SinkCallFailed, match="stays COMMITTING"):
        coordinator_for_tests(ledger, P, sinks).commit(number=1)
    with pytest.raises(
        IllegalTransition, match=r"cannot abort epoch 1 of pipeline 'orders': it is COMMITTING"
    ):
        coordinator_for_tests(ledger, P, sinks).abort(number=1, reason="operator")
    with pytest.raises(IllegalTransition, match="cannot finish committing"):
        ledger.complete_commit(P, 1)
    with pytest.raises(SinkCallFailed):
        coordinator_for_tests(ledger, P, sinks).recover()
    report = coordinator_for_tests(ledger, P, sinks).recover()
    assert (report.epoch, report.outcome, report.participants_committed) == (1, "committed", 1)
    assert ledger.epoch(P, 1).status is EpochStatus.COMMITTED
    assert visible(sinks) == {key_of(p.committable) for p in ledger.participants(P, 1)}
    assert {p.status for p in ledger.participants(P, 1)} == {ParticipantStatus.COMMITTED}


def test_committing_twice_has_the_effect_of_committing_once(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e)
    first = coordinator_for_tests(ledger, P, sinks).commit(number=1)
    before = (dict(sinks["db"].visible), len(sinks["db"].calls))
    second = coordinator_for_tests(ledger, P, sinks).commit(number=1)
    assert first.status is second.status is EpochStatus.COMMITTED
    assert first.finished_at == second.finished_at
    assert (dict(sinks["db"].visible), len(sinks["db"].calls)) == before
    assert ledger.committed_offsets(P) == {("in", 0): 5, ("in", 1): 0}


def test_commit_needs_a_committer_for_every_sink_before_deciding(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e)
    with pytest.raises(MissingCommitter, match="no committer for sink"):
        coordinator_for_tests(ledger, P, {"db": sinks["db"]}).commit(number=1)
    assert ledger.epoch(P, 1).status is EpochStatus.PLANNED


# ------------------------------------------------------------------------------------ invariant 6


def test_once_aborting_commit_is_refused_abort_is_idempotent_nothing_is_visible(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e)
    ledger.precommit_slice(P, 1, e.attempt_token, [], [DeadLetter("in", 0, 3, b"k", b"{", "bad json")])
    ledger.record_abort_decision(P, 1, "operator")
    with pytest.raises(IllegalTransition, match=r"it is ABORTING .*operator.*commit is refused"):
        coordinator_for_tests(ledger, P, sinks).commit(number=1)
    first = coordinator_for_tests(ledger, P, sinks).abort(number=1, reason="operator again")
    second = coordinator_for_tests(ledger, P, sinks).abort(number=1, reason="and again")
    assert first.status is second.status is EpochStatus.ABORTED
    assert second.abort_reason == "operator"
    with pytest.raises(IllegalTransition, match="ABORTED"):
        ledger.record_commit_decision(P, 1)
    assert visible(sinks) == set()
    assert all(not s.staged for s in sinks.values())
    assert ledger.committed_offsets(P) == {}
    assert ledger.dead_letters(P) == []
    assert len(ledger.dead_letters(P, include_uncommitted=True)) == 1
    assert {p.status for p in ledger.participants(P, 1)} == {ParticipantStatus.ABORTED}


def test_transitions_out_of_order_name_pipeline_epoch_and_status(ledger: Ledger) -> None:
    ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    with pytest.raises(IllegalTransition, match=r"epoch 1 of pipeline 'orders'.*PLANNED, not COMMITTING"):
        ledger.complete_commit(P, 1)
    with pytest.raises(IllegalTransition, match=r"epoch 1 of pipeline 'orders'.*PLANNED, not ABORTING"):
        ledger.complete_abort(P, 1)
    with pytest.raises(IllegalTransition, match="PLANNED, not COMMITTING"):
        ledger.mark_committed(P, 1, "db")
    with pytest.raises(UnknownEpoch, match="pipeline 'orders' has no epoch 5"):
        ledger.record_commit_decision(P, 5)


# ------------------------------------------------------------------------------------ invariant 7


def test_position_advances_only_with_committed(ledger: Ledger, sinks: dict[str, RecordingCommitter]) -> None:
    """(Keyed state advances as a participant of the epoch: tests/unit/test_state_store.py.)"""
    e1 = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e1)
    ledger.record_commit_decision(P, 1)
    assert ledger.committed_offsets(P) == {}
    coordinator_for_tests(ledger, P, sinks).commit(number=1)
    assert ledger.committed_offsets(P) == {("in", 0): 5, ("in", 1): 0}

    e2 = ledger.plan_epoch(P, ranges(5, 9), EXPECTED)
    precommit_all(ledger, sinks, e2)
    coordinator_for_tests(ledger, P, sinks).abort(number=2, reason="failed")
    assert ledger.committed_offsets(P) == {("in", 0): 5, ("in", 1): 0}


def test_dead_letters_are_kept_once_and_listed_with_their_committed_epoch(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), [])
    letters = [
        DeadLetter("in", 0, 1, None, b"\xff", "not json"),
        DeadLetter("in", 0, 4, b"k", b"{}", "no id"),
    ]
    assert ledger.precommit_slice(P, 1, e.attempt_token, [], letters).dead_letters_added == 2
    assert ledger.precommit_slice(P, 1, e.attempt_token, [], letters).dead_letters_added == 0  # a retry
    assert ledger.dead_letters(P) == []
    coordinator_for_tests(ledger, P, sinks).commit(number=1)
    assert [d.letter for d in ledger.dead_letters(P)] == letters


# ------------------------------------------------------------------------------------ invariant 8


def test_recover_aborts_an_undecided_epoch_and_sweeps_its_staging(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    stage(ledger, sinks, e, "db", "t0")
    # A task that staged and crashed before reporting to the ledger:
    sinks["files"].stage(Committable(P, 1, 0, "t0", "crashed", "files"))
    report = coordinator_for_tests(ledger, P, sinks).recover()
    assert (report.epoch, report.outcome, report.participants_aborted) == (1, "aborted", 1)
    assert [(c.sink, c.attempt) for c in report.orphans_aborted] == [("files", "crashed")]
    assert ledger.open_epoch(P) is None
    assert all(not s.staged and not s.visible for s in sinks.values())
    assert coordinator_for_tests(ledger, P, sinks).recover().outcome == "nothing in flight"


def test_recover_finishes_an_abort_that_crashed_half_way(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    stage(ledger, sinks, e, "db", "t0")
    stage(ledger, sinks, e, "files", "t0")
    ledger.record_abort_decision(P, 1, "crash follows")
    sinks["db"].abort([c.committable for c in ledger.participants(P, 1) if c.sink == "db"])
    ledger.mark_aborted(P, 1, "db")
    report = coordinator_for_tests(ledger, P, sinks).recover()
    assert (report.outcome, report.participants_aborted) == ("aborted", 1)
    assert ledger.epoch(P, 1).status is EpochStatus.ABORTED
    assert all(not s.staged for s in sinks.values())


# ------------------------------------------------------------------------------------ invariant 9


def test_sweeper_rolls_back_what_the_ledger_does_not_own_and_keeps_work_in_flight(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e1 = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e1)
    loser = Committable(P, 1, 0, "t0", "speculative", "db")
    sinks["db"].stage(loser)
    coordinator_for_tests(ledger, P, sinks).commit(number=1)
    e2 = ledger.plan_epoch(P, ranges(5, 9), EXPECTED)
    in_flight = Committable(P, 2, 0, "t1", "a0", "db")  # staged, about to pre-commit
    unexpected = Committable(P, 2, 0, "t7", "a0", "db")
    unknown = Committable(P, 40, 0, "t0", "a0", "files")
    for c, sink in ((in_flight, "db"), (unexpected, "db"), (unknown, "files")):
        sinks[sink].stage(c)
    # While epoch 2 is PLANNED, classify what recover's sweep would do with each orphan:
    winner = {(p.sink, p.task): p for p in ledger.participants(P, 1)}
    assert classify_orphan(loser, ledger.epoch(P, 1), winner[("db", "t0")]) == "abort"
    assert classify_orphan(in_flight, e2, None) == "keep"
    assert classify_orphan(unexpected, e2, None) == "abort"
    assert classify_orphan(unknown, None, None) == "abort"
    assert (
        classify_orphan(winner[("db", "t0")].committable, ledger.epoch(P, 1), winner[("db", "t0")])
        == "commit"
    )
    report2 = coordinator_for_tests(ledger, P, sinks).recover()
    assert report2.outcome == "aborted"
    aborted = {key_of(c) for c in report2.orphans_aborted}
    assert aborted == {key_of(loser), key_of(in_flight), key_of(unexpected), key_of(unknown)}
    assert all(not s.staged for s in sinks.values())
    assert visible(sinks) == {key_of(p.committable) for p in ledger.participants(P, 1)}


def test_classify_keeps_the_winner_of_a_decided_epoch_and_drops_losers(
    ledger: Ledger, sinks: dict[str, RecordingCommitter]
) -> None:
    e = ledger.plan_epoch(P, ranges(0, 5), EXPECTED)
    precommit_all(ledger, sinks, e)
    decided = ledger.record_commit_decision(P, 1)
    w = {(p.sink, p.task): p for p in ledger.participants(P, 1)}[("db", "t1")]
    assert classify_orphan(w.committable, decided, w) == "keep"
    assert classify_orphan(Committable(P, 1, 0, "t1", "other", "db"), decided, w) == "abort"
    aborted_epoch = Epoch(P, 1, EpochStatus.ABORTED, "t", (), tuple(EXPECTED), e.planned_at)
    assert classify_orphan(w.committable, aborted_epoch, w) == "abort"


# --------------------------------------------------------------------------------- reads, seam


def test_find_by_interval_and_epoch_listing(ledger: Ledger, sinks: dict[str, RecordingCommitter]) -> None:
    day = (datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 2, tzinfo=UTC))
    e = ledger.plan_epoch(P, ranges(0, 5), [], run_id="scheduled__2024-05-01", data_interval=day)
    coordinator_for_tests(ledger, P, sinks).commit(number=e.number)
    ledger.plan_epoch(P, ranges(5, 6), [])
    found = ledger.find_by_interval(P, *day)
    assert [(x.number, x.status, x.run_id) for x in found] == [
        (1, EpochStatus.COMMITTED, "scheduled__2024-05-01")
    ]
    assert found[0].data_interval_start == day[0]
    assert ledger.find_by_interval(P, day[1], day[1]) == []
    assert [x.number for x in ledger.epochs(P, last=1)] == [2]
    assert ledger.sinks(P) == [] and ledger.pipelines() == [P]


def test_pipelines_are_found_by_name_in_onceflow_pipelines() -> None:
    from onceflow.catalog import find_pipeline

    with pytest.raises(ConfigError, match="ONCEFLOW_PIPELINES is not set"):
        find_pipeline("orders", [])
    with pytest.raises(ConfigError, match="cannot import"):
        find_pipeline("orders", ["no_such_module_x:f"])
    found = find_pipeline("orders", ["examples.orders.pipeline:ORDERS"])
    assert found.name == "orders"
    with pytest.raises(ConfigError, match=r"'nosuch' is not among .* \(it lists: orders\)"):
        find_pipeline("nosuch", ["examples.orders.pipeline:ORDERS"])
