"""The coordinator's decisions as pure functions: every branch, without Kafka, Spark or Airflow."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from onceflow.ledger import Epoch, EpochStatus
from onceflow.ledger.refusals import abort_refusal, commit_refusal
from onceflow.protocol.decisions import decide_plan, decide_recovery

NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)
DAY = (datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 24, tzinfo=UTC))


def epoch(status: EpochStatus, **fields: object) -> Epoch:
    base = Epoch("p", 3, status, "tok", (), (("db", "s0-t0"),), NOW, run_id="run-a")
    return replace(base, **fields)  # type: ignore[arg-type]


def test_plan_reuses_the_runs_own_undecided_epoch_and_never_plans_twice() -> None:
    for status in (EpochStatus.PLANNED, EpochStatus.COMMITTING):
        decision = decide_plan(
            own=epoch(status), interval_done=None, in_flight=None, replaces_intervals=False
        )
        assert decision.action == "reuse" and "processing it again" in decision.line
    done = decide_plan(
        own=epoch(EpochStatus.COMMITTED), interval_done=None, in_flight=None, replaces_intervals=False
    )
    assert done.action == "already_committed" and "nothing to do" in done.line


def test_plan_of_an_interval_that_committed_is_a_no_op_or_a_replacement() -> None:
    committed = epoch(
        EpochStatus.COMMITTED, data_interval_start=DAY[0], data_interval_end=DAY[1], run_id="r0"
    )
    skip = decide_plan(own=None, interval_done=committed, in_flight=None, replaces_intervals=False)
    assert skip.action == "already_committed" and "exactly once" in skip.line
    again = decide_plan(own=None, interval_done=committed, in_flight=None, replaces_intervals=True)
    assert again.action == "replace" and again.epoch is committed
    own = decide_plan(own=committed, interval_done=None, in_flight=None, replaces_intervals=True)
    assert own.action == "replace"


def test_plan_waits_for_another_runs_epoch_and_otherwise_plans() -> None:
    other = epoch(EpochStatus.PLANNED, run_id="run-b", owner="run-b (pid 1 on h)")
    wait = decide_plan(own=None, interval_done=None, in_flight=other, replaces_intervals=False)
    assert wait.action == "wait" and "owned by run-b (pid 1 on h)" in wait.line
    aborted = decide_plan(
        own=epoch(EpochStatus.ABORTED), interval_done=None, in_flight=None, replaces_intervals=False
    )
    assert aborted.action == "plan"  # an aborted epoch of this run is replayed by a new one
    assert (
        decide_plan(own=None, interval_done=None, in_flight=None, replaces_intervals=False).action == "plan"
    )


def test_refusals_follow_invariants_5_and_6_in_one_wording() -> None:
    for status in (EpochStatus.PLANNED, EpochStatus.COMMITTING, EpochStatus.COMMITTED):
        assert commit_refusal(epoch(status)) is None
    refused = commit_refusal(epoch(EpochStatus.ABORTED, abort_reason="operator"))
    assert refused is not None
    assert refused.startswith("commit refused: cannot commit epoch 3 of pipeline 'p': it is ABORTED")
    assert "operator" in refused
    for status in (EpochStatus.PLANNED, EpochStatus.ABORTING, EpochStatus.ABORTED):
        assert abort_refusal(epoch(status)) is None
    decided = abort_refusal(epoch(EpochStatus.COMMITTING))
    assert decided is not None and decided.startswith("abort refused: cannot abort epoch 3")
    assert "onceflow commit p 3" in decided
    assert "onceflow commit" not in (abort_refusal(epoch(EpochStatus.COMMITTED)) or "")


@pytest.mark.parametrize(
    ("status", "lease", "alive", "force", "action", "why"),
    [
        (EpochStatus.COMMITTING, None, None, False, "commit", "durable"),
        (EpochStatus.COMMITTING, 60, True, False, "keep", "alive"),  # its owner is committing it
        (EpochStatus.COMMITTING, 60, True, True, "commit", "durable"),
        (EpochStatus.ABORTING, None, None, False, "abort", "operator"),
        (EpochStatus.PLANNED, 60, None, False, "keep", "alive"),
        (EpochStatus.PLANNED, 60, True, False, "keep", "alive"),
        (EpochStatus.PLANNED, 60, False, False, "abort", "no longer running"),
        (EpochStatus.PLANNED, -1, None, False, "abort", "expired"),
        (EpochStatus.PLANNED, -1, True, False, "abort", "expired"),  # alive but silent: hung
        (EpochStatus.PLANNED, 60, True, True, "abort", "forced"),
        (EpochStatus.PLANNED, None, None, False, "abort", "never set"),
    ],
)
def test_recovery_never_rolls_back_live_work_unless_forced(
    status: EpochStatus, lease: int | None, alive: bool | None, force: bool, action: str, why: str
) -> None:
    expires = None if lease is None else NOW + timedelta(seconds=lease)
    e = epoch(status, owner="run-a (pid 1 on h)", lease_expires_at=expires, abort_reason="operator")
    got, reason = decide_recovery(e, now=NOW, owner_alive=alive, force=force)
    assert (got, why in reason) == (action, True), reason
    assert decide_recovery(None, now=NOW, owner_alive=None, force=False)[0] == "nothing"
