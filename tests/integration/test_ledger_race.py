"""Several OS processes race to commit and to abort the same epoch: exactly one outcome wins."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from onceflow.ledger import EpochStatus, IllegalTransition, Ledger
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import Committable
from onceflow.testing import RecordingCommitter, coordinator_for_tests

pytestmark = pytest.mark.integration

P = "race"
ROUNDS = 4
ACTIONS = ("commit", "abort", "commit", "abort")
EXPECTED = [("db", "t0"), ("db", "t1")]


def _worker(url: str, index: int, barrier: Any, results: Any, record: str) -> None:
    ledger = Ledger.connect(url)
    sinks = {"db": RecordingCommitter(path=Path(record), require_staged=False)}
    action = ACTIONS[index]
    for number in range(1, ROUNDS + 1):
        barrier.wait()
        try:
            if action == "commit":
                coordinator_for_tests(ledger, P, sinks).commit(number=number)
            else:
                coordinator_for_tests(ledger, P, sinks).abort(number=number, reason=f"worker {index}")
            outcome = "ok"
        except IllegalTransition:
            outcome = "refused"
        except Exception as exc:
            outcome = f"error: {exc!r}"
        results.put((number, index, action, outcome))
        barrier.wait()
    ledger.close()


def race(url: str, tmp_path: Path) -> None:
    ledger = Ledger.connect(url, check=False)
    ledger.upgrade()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(ACTIONS) + 1, timeout=180)
    results = ctx.Queue()
    records = [tmp_path / f"worker{i}.json" for i in range(len(ACTIONS))]
    procs = [
        ctx.Process(target=_worker, args=(url, i, barrier, results, str(records[i])))
        for i in range(len(ACTIONS))
    ]
    for proc in procs:
        proc.start()
    try:
        for number in range(1, ROUNDS + 1):
            start = ledger.committed_offsets(P).get(("in", 0), 0)
            e = ledger.plan_epoch(P, [OffsetRange("in", 0, start, start + 10)], EXPECTED)
            # In odd rounds one task never reports, so only the abort can win.
            reported = EXPECTED[: 2 if number % 2 == 0 else 1]
            committables = [Committable(P, number, 0, task, "a0", "db") for _, task in reported]
            ledger.precommit_slice(P, number, e.attempt_token, committables)
            barrier.wait()
            barrier.wait()
            outcomes = [results.get(timeout=60) for _ in ACTIONS]
            assert not [o for o in outcomes if o[3].startswith("error")], outcomes
            winners = {action for _, _, action, outcome in outcomes if outcome == "ok"}
            final = ledger.epoch(P, number).status
            assert len(winners) == 1, outcomes
            assert final is (EpochStatus.COMMITTED if winners == {"commit"} else EpochStatus.ABORTED)
            if number % 2 == 1:
                assert final is EpochStatus.ABORTED
            losers = {action for _, _, action, outcome in outcomes if outcome == "refused"}
            assert not winners & losers
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    assert all(proc.exitcode == 0 for proc in procs)
    # The sinks saw only the winning side of each round: never a commit and an abort of one epoch.
    calls: dict[int, set[str]] = {}
    for path in records:
        for op, keys in RecordingCommitter(path=path).refresh().calls:
            for key in keys:
                calls.setdefault(key[1], set()).add(op)
    for epoch in ledger.epochs(P):
        ops = calls.get(epoch.number, set())
        assert ops <= ({"commit"} if epoch.status is EpochStatus.COMMITTED else {"abort"}), (epoch, ops)
    ledger.close()


def test_commit_and_abort_race_on_postgresql(pg_database: str, tmp_path: Path) -> None:
    race(pg_database, tmp_path)


def test_commit_and_abort_race_on_sqlite(tmp_path: Path) -> None:
    race(f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)
